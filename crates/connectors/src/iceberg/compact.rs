//! Small-file upkeep of an Iceberg table: its live rows (position deletes applied) rewritten
//! into one Parquet file, committed as a `replace` snapshot whose manifest lists that file
//! alone (and every file it replaces as DELETED), then, when `keep_snapshots_s` is set,
//! snapshots older than that expired. It holds the lake's attachment
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
use super::catalog::{Catalog, Loaded};
use super::manifest::{self, DataFile, Entry, Listed};
use super::store::Store;
use crate::lakehouse::{Lake, Lakehouse, lake_error, literal, on_lake_detaching, shared};

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
    let redact = |e: Error| Error::new(e.kind(), config.redact(e.message()));
    for table in tables {
        let catalog = Arc::new(Catalog::connect(config, table).await.map_err(redact)?);
        let (before, after) = rewrite(&lake, config, catalog.clone()).await?;
        add(&mut report.before, before);
        add(&mut report.after, after);
        let Some(keep) = config.compaction.keep_snapshots_s else { continue };
        match expire(&catalog, keep).await.map_err(redact) {
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
/// and after. A table with fewer than `min_files` files (data and delete files) is left as it
/// is, and so is one the catalog does not have (yet).
async fn rewrite(lake: &Lake, config: &IcebergConfig, catalog: Arc<Catalog>) -> Result<(FileFigures, FileFigures)> {
    let handle = tokio::runtime::Handle::current();
    on_lake_detaching(lake, config, move |conn, config| {
        let Some(loaded) = handle.block_on(catalog.load())? else { return Ok(Default::default()) };
        let table = Table::of(&loaded)?;
        let (Some(current), Some(list)) = (table.snapshot, table.manifest_list.clone()) else {
            return Ok(Default::default());
        };
        let entries = manifest::live_entries(conn, &list)?;
        let (data, deletes): (Vec<&Entry>, Vec<&Entry>) = entries.iter().partition(|e| e.file.content == 0);
        let before = FileFigures {
            files: data.len() as u64,
            delete_files: deletes.len() as u64,
            records: data.iter().map(|e| e.file.records as u64).sum(),
        };
        if (entries.len() as u64) < config.compaction.min_files.max(2) {
            return Ok(((before, before), false));
        }
        if deletes.iter().any(|e| e.file.content == 2) {
            // Another engine's equality deletes: not applied here with certainty.
            return Err(Error::new(
                ErrorKind::Fatal,
                "Iceberg compaction: tables with equality deletes are not compacted",
            ));
        }
        let store = Store::new(config, &table.location)?;
        let id = rand::random::<u64>() >> 1;
        let name = hex_name();
        let path = format!("{}/data/sluice-compacted-{name}.parquet", table.location);
        let sql = format!(
            "COPY (SELECT * FROM iceberg_scan('{}')) TO '{}' (FORMAT parquet, FIELD_IDS {})",
            literal(&loaded.location),
            literal(&store.local_or_url(&path)),
            field_ids(table.schema["fields"].as_array().map_or(&[][..], Vec::as_slice))?
        );
        let rows = conn.query_row(&sql, [], |r| r.get::<_, i64>(0)).map_err(lake_error)?;
        let size = handle.block_on(store.size(&path))? as i64;
        let compacted = DataFile { content: 0, path, format: "PARQUET".into(), records: rows, size };
        let sequence = table.last_sequence + 1;
        let mut listed = Vec::new();
        for (deleted, is_deletes) in [(&data, false), (&deletes, true)] {
            let added = (!is_deletes).then_some(&compacted);
            if deleted.is_empty() && added.is_none() {
                continue;
            }
            let bytes = manifest::manifest(&table.schema, table.schema_id, id, added, deleted, is_deletes);
            let path = format!("{}/metadata/sluice-{name}-m{}.avro", table.location, listed.len());
            let length = bytes.len() as u64;
            handle.block_on(store.put(&path, bytes))?;
            listed.push(Listed {
                path,
                length,
                deletes: is_deletes,
                added_files: i64::from(added.is_some()),
                deleted_files: deleted.len() as i64,
                added_rows: added.map_or(0, |f| f.records),
                deleted_rows: deleted.iter().map(|e| e.file.records).sum(),
            });
        }
        let list = format!("{}/metadata/snap-{id}-sluice-{name}.avro", table.location);
        handle.block_on(store.put(&list, manifest::manifest_list(id, current, sequence, &listed)))?;
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
        ));
        let committed = match committed {
            Ok(committed) => committed,
            Err(e) => {
                // A refusal (the table moved on: 409) leaves nothing that reads these files; an
                // unknown outcome (5xx, no answer) may have committed them, so they stay.
                if e.message().contains("HTTP 409") {
                    let written = listed.iter().map(|m| m.path.clone()).chain([list, compacted.path.clone()]);
                    for url in written {
                        let _ = handle.block_on(store.delete(&url));
                    }
                }
                return Err(e);
            }
        };
        // What readers see now, counted by DuckDB's extension, not by this code.
        let after = match committed["metadata-location"].as_str() {
            Some(location) => figures(conn, location)?,
            None => FileFigures { files: 1, delete_files: 0, records: rows as u64 },
        };
        tracing::info!(table = %table.location, before = before.files, deletes = before.delete_files, rows,
            "Iceberg table compacted.");
        // The attachment read the table before this commit: the next write attaches anew.
        Ok(((before, after), true))
    })
    .await
}

/// Expire the snapshots older than `keep_s` seconds, except those a branch or tag points to;
/// how many.
async fn expire(catalog: &Catalog, keep_s: u64) -> Result<u64> {
    let Some(loaded) = catalog.load().await? else { return Ok(0) };
    let meta = &loaded.metadata;
    let Some(current) = meta["current-snapshot-id"].as_i64().filter(|id| *id >= 0) else { return Ok(0) };
    let referenced: Vec<i64> = meta["refs"]
        .as_object()
        .map(|refs| refs.values().filter_map(|r| r["snapshot-id"].as_i64()).collect())
        .unwrap_or_default();
    let cutoff = chrono::Utc::now().timestamp_millis() - (keep_s as i64).saturating_mul(1000);
    let old: Vec<i64> = meta["snapshots"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter(|s| s["timestamp-ms"].as_i64().is_some_and(|t| t < cutoff))
                .filter_map(|s| s["snapshot-id"].as_i64())
                .filter(|id| *id != current && !referenced.contains(id))
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
    manifest_list: Option<String>,
    last_sequence: i64,
    schema_id: i64,
    schema: Value,
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
        let snapshot = m["current-snapshot-id"].as_i64().filter(|id| *id >= 0);
        let manifest_list = m["snapshots"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["snapshot-id"].as_i64() == snapshot))
            .and_then(|s| s["manifest-list"].as_str())
            .map(str::to_string);
        Ok(Self {
            uuid: m["table-uuid"].as_str().unwrap_or_default().to_string(),
            location: m["location"].as_str().unwrap_or_default().trim_end_matches('/').to_string(),
            snapshot,
            manifest_list,
            last_sequence: m["last-sequence-number"].as_i64().unwrap_or(0),
            schema_id,
            schema,
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

/// A random name for the files of one compaction.
fn hex_name() -> String {
    format!("{:032x}", rand::random::<u128>())
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
}
