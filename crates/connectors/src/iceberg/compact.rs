//! Small-file upkeep of an Iceberg table: its live rows (position deletes applied) rewritten
//! into one Parquet file, committed as a `replace` snapshot whose manifest lists that file
//! alone, then snapshots older than `keep_snapshots_s` expired. It holds the lake's attachment
//! from reading the table to its commit, so the stream's writes wait for it rather than race
//! it; the commit also requires the snapshot it read, so another writer's commit in between
//! makes it fail (and run again later) instead of dropping rows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use duckdb::Connection;
use serde::Serialize;
use serde_json::{Value, json};
use sluice_core::{Error, ErrorKind, Result, StreamMetrics};

use super::IcebergConfig;
use super::avro::{Record, container};
use super::catalog::{Catalog, Loaded};
use crate::lakehouse::{Lake, lake_error, on_lake, shared};

/// The live files of a table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FileFigures {
    /// Parquet data files.
    pub files: u64,
    /// Position and equality delete files (a mirror's deletes).
    pub delete_files: u64,
    /// Rows in the data files, deleted ones included.
    pub records: u64,
}

/// What a compaction did, over the tables it was given.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompactionReport {
    /// Files before.
    pub before: FileFigures,
    /// Files after.
    pub after: FileFigures,
    /// Snapshots expired.
    pub expired_snapshots: u64,
    /// Why the catalog refused to expire snapshots, if it did (some, lakana among them, keep
    /// that to their own maintenance).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expire_refused: Option<String>,
    /// How long it took, ms.
    pub ms: u64,
}

/// Compact `tables` of the destination's namespace.
pub async fn compact(config: &IcebergConfig, tables: &[String]) -> Result<CompactionReport> {
    let started = Instant::now();
    let lake = shared(config);
    let mut report = CompactionReport::default();
    for table in tables {
        let catalog = Arc::new(Catalog::connect(config, table).await?);
        let (before, after) = rewrite(&lake, config, catalog.clone()).await?;
        add(&mut report.before, before);
        add(&mut report.after, after);
        match expire(&catalog, config.compaction.keep_snapshots_s).await {
            Ok(n) => report.expired_snapshots += n,
            Err(e) => {
                tracing::warn!(error = %e, "Iceberg: old snapshots not expired; the compaction itself is committed.");
                report.expire_refused = Some(e.message().to_string());
            }
        }
    }
    report.ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

fn add(sum: &mut FileFigures, f: FileFigures) {
    sum.files += f.files;
    sum.delete_files += f.delete_files;
    sum.records += f.records;
}

/// Compact on the schedule of `config.compaction` while `alive()`.
pub async fn upkeep(stream: String, config: IcebergConfig, metrics: Arc<StreamMetrics>, alive: impl Fn() -> bool) {
    let every = config.compaction.every_s;
    if every == 0 || config.table.is_empty() {
        return;
    }
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(every), Duration::from_secs(every));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !alive() {
            return;
        }
        match compact(&config, std::slice::from_ref(&config.table)).await {
            Ok(report) => record(&metrics, &report),
            Err(e) => tracing::warn!(stream = %stream, error = %e, "Iceberg compaction failed; it runs again later."),
        }
    }
}

/// A compaction's figures into the stream's metrics.
pub fn record(metrics: &StreamMetrics, report: &CompactionReport) {
    metrics.add_destination("compactions", 1.0);
    metrics.set_destination("compaction_ms", report.ms as f64);
    metrics.set_destination("files", report.after.files as f64);
    metrics.set_destination("delete_files", report.after.delete_files as f64);
    metrics.add_destination("files_compacted", report.before.files.saturating_sub(report.after.files) as f64);
}

/// The table's live rows into one file, committed in place of its files; the figures before
/// and after. A table with one data file and no deletes is left as it is.
async fn rewrite(lake: &Lake, config: &IcebergConfig, catalog: Arc<Catalog>) -> Result<(FileFigures, FileFigures)> {
    let handle = tokio::runtime::Handle::current();
    let result = on_lake(lake, config, move |conn, config| {
        let loaded = handle.block_on(catalog.load())?;
        let table = Table::of(&loaded)?;
        let Some(current) = table.snapshot else {
            return Ok((FileFigures::default(), FileFigures::default()));
        };
        let before = figures(conn, &loaded.location)?;
        if before.files <= 1 && before.delete_files == 0 {
            return Ok((before, before));
        }
        let store = Store::new(config, &table.location)?;
        let id = rand::random::<u64>() >> 1;
        let name = hex_name();
        let data = format!("{}/data/sluice-compacted-{name}.parquet", table.location);
        let sql = format!(
            "COPY (SELECT * FROM iceberg_scan('{}')) TO '{}' (FORMAT parquet, FIELD_IDS {})",
            literal(&loaded.location),
            literal(&store.local_or_url(&data)),
            field_ids(&table.fields)?
        );
        let rows: u64 = conn.query_row(&sql, [], |r| r.get::<_, i64>(0)).map_err(lake_error)? as u64;
        let size = handle.block_on(store.size(&data))?;
        let sequence = table.last_sequence + 1;
        let manifest = format!("{}/metadata/sluice-{name}-m0.avro", table.location);
        let manifest_bytes = manifest_file(&table, id, &data, rows, size);
        let manifest_len = manifest_bytes.len() as u64;
        handle.block_on(store.put(&manifest, manifest_bytes))?;
        let list = format!("{}/metadata/snap-{id}-sluice-{name}.avro", table.location);
        let list_bytes = manifest_list(id, current, sequence, &manifest, manifest_len, rows);
        handle.block_on(store.put(&list, list_bytes))?;
        let summary = json!({
            "operation": "replace",
            "added-data-files": "1",
            "added-records": rows.to_string(),
            "added-files-size": size.to_string(),
            "deleted-data-files": before.files.to_string(),
            "deleted-records": before.records.to_string(),
            "removed-delete-files": before.delete_files.to_string(),
            "total-data-files": "1",
            "total-delete-files": "0",
            "total-records": rows.to_string(),
            "total-files-size": size.to_string(),
            "total-position-deletes": "0",
            "total-equality-deletes": "0",
        });
        let snapshot = json!({
            "snapshot-id": id,
            "parent-snapshot-id": current,
            "sequence-number": sequence,
            "timestamp-ms": chrono::Utc::now().timestamp_millis(),
            "manifest-list": list,
            "summary": summary,
            "schema-id": table.schema_id,
        });
        let committed = handle.block_on(catalog.commit(
            vec![
                json!({"type": "assert-table-uuid", "uuid": table.uuid}),
                json!({"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": current}),
            ],
            vec![
                json!({"action": "add-snapshot", "snapshot": snapshot}),
                json!({"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": id}),
            ],
        ))?;
        let after = match committed["metadata-location"].as_str() {
            Some(location) => figures(conn, location)?,
            None => FileFigures { files: 1, delete_files: 0, records: rows },
        };
        tracing::info!(table = %table.location, before = before.files, deletes = before.delete_files, rows,
            "Iceberg table compacted.");
        Ok((before, after))
    })
    .await;
    // The attachment read the table before this commit: the next write attaches anew.
    crate::lakehouse::reset(lake);
    result
}

/// Expire the snapshots older than `keep_s` seconds (never the current one); how many.
async fn expire(catalog: &Catalog, keep_s: u64) -> Result<u64> {
    let loaded = catalog.load().await?;
    let meta = &loaded.metadata;
    let Some(current) = meta["current-snapshot-id"].as_i64().filter(|id| *id >= 0) else { return Ok(0) };
    let cutoff = chrono::Utc::now().timestamp_millis() - (keep_s as i64).saturating_mul(1000);
    let old: Vec<i64> = meta["snapshots"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter(|s| s["timestamp-ms"].as_i64().is_some_and(|t| t < cutoff))
                .filter_map(|s| s["snapshot-id"].as_i64())
                .filter(|id| *id != current)
                .collect()
        })
        .unwrap_or_default();
    if old.is_empty() {
        return Ok(0);
    }
    let requirement = json!({"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": current});
    catalog.commit(vec![requirement], vec![json!({"action": "remove-snapshots", "snapshot-ids": old})]).await?;
    Ok(old.len() as u64)
}

/// What a compaction needs of a table's metadata.
struct Table {
    uuid: String,
    location: String,
    snapshot: Option<i64>,
    last_sequence: i64,
    schema_id: i64,
    schema: Value,
    fields: Vec<Value>,
}

impl Table {
    fn of(loaded: &Loaded) -> Result<Self> {
        let m = &loaded.metadata;
        let refuse = |why: &str| Error::new(ErrorKind::Fatal, format!("Iceberg compaction: {why}"));
        if m["format-version"].as_i64() != Some(2) {
            return Err(refuse("only format-version 2 tables are compacted"));
        }
        let spec = m["default-spec-id"].as_i64().unwrap_or(0);
        let partitioned = m["partition-specs"]
            .as_array()
            .and_then(|specs| specs.iter().find(|s| s["spec-id"].as_i64() == Some(spec)))
            .and_then(|s| s["fields"].as_array())
            .is_some_and(|f| !f.is_empty());
        if partitioned || spec != 0 {
            return Err(refuse("partitioned tables are not compacted (Sluice creates unpartitioned ones)"));
        }
        let schema_id = m["current-schema-id"].as_i64().unwrap_or(0);
        let schema = m["schemas"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["schema-id"].as_i64() == Some(schema_id)))
            .cloned()
            .ok_or_else(|| refuse("the table's current schema is missing"))?;
        let fields = schema["fields"].as_array().cloned().unwrap_or_default();
        Ok(Self {
            uuid: m["table-uuid"].as_str().unwrap_or_default().to_string(),
            location: m["location"].as_str().unwrap_or_default().trim_end_matches('/').to_string(),
            snapshot: m["current-snapshot-id"].as_i64().filter(|id| *id >= 0),
            last_sequence: m["last-sequence-number"].as_i64().unwrap_or(0),
            schema_id,
            schema,
            fields,
        })
    }
}

/// Live data and delete files of the snapshot `location` (a metadata JSON) reads.
fn figures(conn: &Connection, location: &str) -> Result<FileFigures> {
    let sql = format!(
        "SELECT content, count(*), coalesce(sum(record_count), 0)::BIGINT FROM iceberg_metadata('{}') \
         WHERE status <> 'DELETED' GROUP BY content",
        literal(location)
    );
    let mut statement = conn.prepare(&sql).map_err(lake_error)?;
    let rows = statement
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))
        .map_err(lake_error)?;
    let mut f = FileFigures::default();
    for row in rows {
        let (content, count, records) = row.map_err(lake_error)?;
        // DuckDB names a data file's content EXISTING (or DATA), a delete file's *_DELETES.
        if content.contains("DELETE") {
            f.delete_files += count as u64;
        } else {
            f.files += count as u64;
            f.records += records as u64;
        }
    }
    Ok(f)
}

/// DuckDB's `FIELD_IDS` for the schema's columns, nested types included.
fn field_ids(fields: &[Value]) -> Result<String> {
    let entries: Vec<String> = fields
        .iter()
        .map(|f| {
            Ok(format!(
                "'{}': {}",
                literal(f["name"].as_str().unwrap_or_default()),
                ids_of(f["id"].as_i64(), &f["type"])?
            ))
        })
        .collect::<Result<_>>()?;
    Ok(format!("{{{}}}", entries.join(", ")))
}

fn ids_of(id: Option<i64>, ty: &Value) -> Result<String> {
    let id = id.ok_or_else(|| Error::new(ErrorKind::Fatal, "Iceberg compaction: a field without an id"))?;
    let nested = match ty["type"].as_str() {
        Some("list") => vec![("element".to_string(), ids_of(ty["element-id"].as_i64(), &ty["element"])?)],
        Some("map") => vec![
            ("key".to_string(), ids_of(ty["key-id"].as_i64(), &ty["key"])?),
            ("value".to_string(), ids_of(ty["value-id"].as_i64(), &ty["value"])?),
        ],
        Some("struct") => ty["fields"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| Ok((f["name"].as_str().unwrap_or_default().to_string(), ids_of(f["id"].as_i64(), &f["type"])?)))
            .collect::<Result<_>>()?,
        _ => return Ok(id.to_string()),
    };
    let inner: Vec<String> = nested.into_iter().map(|(k, v)| format!("'{}': {v}", literal(&k))).collect();
    Ok(format!("{{'__duckdb_field_id': {id}, {}}}", inner.join(", ")))
}

const MANIFEST_SCHEMA: &str = r#"{"type":"record","name":"manifest_entry","fields":[{"name":"status","type":"int","field-id":0},{"name":"snapshot_id","type":["null","long"],"default":null,"field-id":1},{"name":"sequence_number","type":["null","long"],"default":null,"field-id":3},{"name":"file_sequence_number","type":["null","long"],"default":null,"field-id":4},{"name":"data_file","type":{"type":"record","name":"r2","fields":[{"name":"content","type":"int","field-id":134},{"name":"file_path","type":"string","field-id":100},{"name":"file_format","type":"string","field-id":101},{"name":"partition","type":{"type":"record","name":"r102","fields":[]},"field-id":102},{"name":"record_count","type":"long","field-id":103},{"name":"file_size_in_bytes","type":"long","field-id":104}]},"field-id":2}]}"#;

const MANIFEST_LIST_SCHEMA: &str = r#"{"type":"record","name":"manifest_file","fields":[{"name":"manifest_path","type":"string","field-id":500},{"name":"manifest_length","type":"long","field-id":501},{"name":"partition_spec_id","type":"int","field-id":502},{"name":"content","type":"int","field-id":517},{"name":"sequence_number","type":"long","field-id":515},{"name":"min_sequence_number","type":"long","field-id":516},{"name":"added_snapshot_id","type":"long","field-id":503},{"name":"added_files_count","type":"int","field-id":504},{"name":"existing_files_count","type":"int","field-id":505},{"name":"deleted_files_count","type":"int","field-id":506},{"name":"added_rows_count","type":"long","field-id":512},{"name":"existing_rows_count","type":"long","field-id":513},{"name":"deleted_rows_count","type":"long","field-id":514}]}"#;

/// A data manifest with one added file (its sequence number inherited from the snapshot).
fn manifest_file(table: &Table, snapshot: u64, path: &str, rows: u64, size: u64) -> Vec<u8> {
    let mut entry = Record::default();
    entry.long(1); // ADDED
    entry.some().long(snapshot as i64);
    entry.null().null();
    entry.long(0).bytes(path.as_bytes()).bytes(b"PARQUET").long(rows as i64).long(size as i64);
    let meta = [
        ("schema", table.schema.to_string()),
        ("schema-id", table.schema_id.to_string()),
        ("partition-spec", "[]".to_string()),
        ("partition-spec-id", "0".to_string()),
        ("format-version", "2".to_string()),
        ("content", "data".to_string()),
    ];
    container(MANIFEST_SCHEMA, &meta, &[entry])
}

/// A manifest list of the one manifest.
fn manifest_list(snapshot: u64, parent: i64, sequence: i64, manifest: &str, length: u64, rows: u64) -> Vec<u8> {
    let mut entry = Record::default();
    entry.bytes(manifest.as_bytes()).long(length as i64).long(0).long(0);
    entry.long(sequence).long(sequence).long(snapshot as i64);
    entry.long(1).long(0).long(0);
    entry.long(rows as i64).long(0).long(0);
    let meta = [
        ("snapshot-id", snapshot.to_string()),
        ("parent-snapshot-id", parent.to_string()),
        ("sequence-number", sequence.to_string()),
        ("format-version", "2".to_string()),
    ];
    container(MANIFEST_LIST_SCHEMA, &meta, &[entry])
}

/// Where the table's files are: a local folder (`file://`) or S3 (the destination's account).
enum Store {
    Local,
    S3(Arc<dyn object_store::ObjectStore>),
}

impl Store {
    fn new(config: &IcebergConfig, location: &str) -> Result<Self> {
        if let Some(rest) = location.strip_prefix("s3://") {
            let bucket = rest.split('/').next().unwrap_or_default();
            return Ok(Self::S3(crate::files::s3_store(bucket, config.s3.as_ref(), "destination.s3")?));
        }
        if location.starts_with("file:") || location.starts_with('/') {
            return Ok(Self::Local);
        }
        Err(Error::new(ErrorKind::Fatal, format!("Iceberg compaction: files at '{location}' are not reachable")))
    }

    /// What DuckDB writes to: a local path, or the URL.
    fn local_or_url(&self, url: &str) -> String {
        match self {
            Self::Local => local_path(url),
            Self::S3(_) => url.to_string(),
        }
    }

    fn object(url: &str) -> object_store::path::Path {
        let rest = url.strip_prefix("s3://").unwrap_or(url);
        object_store::path::Path::from(rest.split_once('/').map_or("", |(_, key)| key))
    }

    async fn put(&self, url: &str, bytes: Vec<u8>) -> Result<()> {
        match self {
            Self::Local => {
                let path = local_path(url);
                if let Some(parent) = std::path::Path::new(&path).parent() {
                    std::fs::create_dir_all(parent).map_err(|e| io_error(&path, &e))?;
                }
                std::fs::write(&path, bytes).map_err(|e| io_error(&path, &e))
            }
            Self::S3(store) => store
                .put(&Self::object(url), bytes.into())
                .await
                .map(|_| ())
                .map_err(|e| Error::new(ErrorKind::Connect, format!("Iceberg compaction: writing {url}: {e}"))),
        }
    }

    async fn size(&self, url: &str) -> Result<u64> {
        match self {
            Self::Local => {
                let path = local_path(url);
                std::fs::metadata(&path).map(|m| m.len()).map_err(|e| io_error(&path, &e))
            }
            Self::S3(store) => store
                .head(&Self::object(url))
                .await
                .map(|m| m.size)
                .map_err(|e| Error::new(ErrorKind::Connect, format!("Iceberg compaction: reading {url}: {e}"))),
        }
    }
}

/// `file:///a/b` (or `file:/a/b`) as `/a/b`.
fn local_path(url: &str) -> String {
    let rest = url.strip_prefix("file://").or_else(|| url.strip_prefix("file:")).unwrap_or(url);
    rest.to_string()
}

fn io_error(path: &str, e: &std::io::Error) -> Error {
    Error::new(ErrorKind::Connect, format!("Iceberg compaction: {path}: {e}"))
}

/// A random name for the files of one compaction.
fn hex_name() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn literal(text: &str) -> String {
    text.replace('\'', "''")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_ids_name_nested_elements() {
        let fields: Vec<Value> = serde_json::from_str(
            r#"[{"id": 1, "name": "id", "type": "long"},
                {"id": 2, "name": "tags", "type": {"type": "list", "element-id": 3, "element": "string"}}]"#,
        )
        .unwrap();
        assert_eq!(field_ids(&fields).unwrap(), "{'id': 1, 'tags': {'__duckdb_field_id': 2, 'element': 3}}");
    }

    #[test]
    fn local_locations_become_paths() {
        assert_eq!(local_path("file:///tmp/w/t"), "/tmp/w/t");
        assert_eq!(local_path("file:/tmp/w/t"), "/tmp/w/t");
        assert_eq!(Store::object("s3://bucket/w/t/data/x.parquet").as_ref(), "w/t/data/x.parquet");
    }
}
