//! Writes into ClickHouse tables, and a stream's position beside them (see the module's text).

use std::collections::HashMap;

use async_trait::async_trait;
use serde_json::Value;
use sluice_core::schema::TableSchema;
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Stamp, SyncMode};

use super::ClickhouseConfig;
use super::client::{Client, literal, quote};
use super::native::native_block;
use super::types::{column_of, column_type, json_rows};

/// The table of stream positions, in the destination's database.
const POSITIONS: &str = "sluice_positions";
/// Columns Sluice adds: the unit a row came with, a mirror row's version and delete mark.
const UNIT: &str = "_sluice_unit";
const VERSION: &str = "_version";
const DELETED: &str = "_deleted";

/// Delivers into ClickHouse tables.
pub struct ClickhouseTarget {
    config: ClickhouseConfig,
    client: Option<Client>,
    /// The server has `DateTime64` (20.1 and later).
    modern: bool,
    /// Columns (name, type) of the tables this target has seen.
    tables: HashMap<String, Vec<(String, String)>>,
    /// A stream's write that failed: its unit, checkpoint and tables. The next write first
    /// finds out whether it landed (its `done` row) and, if not, deletes what it inserted.
    failed: Option<(u64, String, Vec<String>)>,
}

impl ClickhouseTarget {
    /// A destination for `config` (connects on use).
    pub fn new(config: ClickhouseConfig) -> Self {
        Self { config, client: None, modern: false, tables: HashMap::new(), failed: None }
    }

    async fn client(&mut self) -> Result<&Client> {
        if self.client.is_none() {
            let client = Client::new(&self.config)?;
            let version = client.query("SELECT version()").await?;
            let major: u32 = version.trim().split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
            self.modern = major >= 20;
            self.client = Some(client);
        }
        Ok(self.client.as_ref().expect("set above"))
    }

    /// After an error the next use starts over: a new session, tables read again.
    fn forget_on_error<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.client = None;
            self.tables.clear();
        }
        result
    }

    async fn columns(&mut self, table: &str) -> Result<Vec<(String, String)>> {
        if let Some(columns) = self.tables.get(table) {
            return Ok(columns.clone());
        }
        let database = self.config.database.clone();
        let sql = format!(
            "SELECT name, type FROM system.columns WHERE database = {} AND table = {} FORMAT JSONEachRow",
            literal(&database),
            literal(table)
        );
        let text = self.client().await?.query(&sql).await?;
        let columns: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| Some((v["name"].as_str()?.to_string(), v["type"].as_str()?.to_string())))
            .collect();
        if !columns.is_empty() {
            self.tables.insert(table.to_string(), columns.clone());
        }
        Ok(columns)
    }

    /// Create the delivery's table, or add the columns it lacks and widen integers that now
    /// have fractions.
    async fn ensure(&mut self, table: &str, delivery: &Delivery) -> Result<()> {
        let existing = self.columns(table).await?;
        let modern = self.modern;
        let name = quote(table);
        // A keyed table (a mirror's, or a snapshot's that changes will follow) merges versions.
        let keyed = !delivery.keys.is_empty();
        let mut statements = Vec::new();
        if existing.is_empty() {
            let mut defs: Vec<String> = Vec::new();
            for field in delivery.schema.fields() {
                let ty = column_type(field.data_type(), modern);
                let key = keyed && delivery.keys.iter().any(|k| k == field.name());
                defs.push(format!("{} {}", quote(field.name()), if key { ty } else { format!("Nullable({ty})") }));
            }
            let engine = if keyed {
                defs.push(format!("{VERSION} UInt64"));
                defs.push(format!("{DELETED} UInt8"));
                let keys: Vec<String> = delivery.keys.iter().map(|k| quote(k)).collect();
                format!("ReplacingMergeTree({VERSION}) ORDER BY ({})", keys.join(", "))
            } else {
                "MergeTree ORDER BY tuple()".to_string()
            };
            defs.push(format!("{UNIT} UInt64 DEFAULT 0"));
            statements.push(format!("CREATE TABLE IF NOT EXISTS {name} ({}) ENGINE = {engine}", defs.join(", ")));
        } else {
            for field in delivery.schema.fields() {
                let ty = column_type(field.data_type(), modern);
                match existing.iter().find(|(n, _)| n == field.name()) {
                    None => {
                        statements.push(format!("ALTER TABLE {name} ADD COLUMN {} Nullable({ty})", quote(field.name())))
                    }
                    Some((_, old)) if ty == "Float64" && old == "Nullable(Int64)" => {
                        statements.push(format!(
                            "ALTER TABLE {name} MODIFY COLUMN {} Nullable(Float64)",
                            quote(field.name())
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        if statements.is_empty() {
            return Ok(());
        }
        for sql in statements {
            self.client().await?.query(&sql).await?;
        }
        self.tables.remove(table);
        Ok(())
    }

    /// Insert one delivery's rows (and a keyed one's deletes, as rows marked deleted).
    async fn apply(&mut self, table: &str, delivery: &Delivery, unit: u64) -> Result<()> {
        let columns = self.columns(table).await?;
        let keyed = columns.iter().any(|(n, _)| n == VERSION);
        // A row's version: the time of the write, so later writes win (also after a stream
        // starts over from its source, when its sequence begins again).
        let version = u64::try_from(chrono::Utc::now().timestamp_micros()).unwrap_or(0);
        if delivery.mode == SyncMode::Replace {
            self.client().await?.query(&format!("TRUNCATE TABLE {}", quote(table))).await?;
        }
        let rows = delivery.rows.iter().filter(|b| b.num_rows() > 0);
        let deletes = delivery.deletes.iter().filter(|b| keyed && b.num_rows() > 0);
        let stamped: Vec<(&arrow::record_batch::RecordBatch, Vec<(&str, u64)>)> = rows
            .map(|b| (b, if keyed { vec![(VERSION, version), (DELETED, 0), (UNIT, unit)] } else { vec![(UNIT, unit)] }))
            .chain(deletes.map(|b| (b, vec![(VERSION, version), (DELETED, 1), (UNIT, unit)])))
            .collect();
        if stamped.is_empty() {
            return Ok(());
        }
        // `Native` when every block maps exactly onto the table and they share their columns;
        // else `JSONEachRow`, which ClickHouse converts.
        let blocks: Option<Vec<(Vec<String>, Vec<u8>)>> =
            stamped.iter().map(|(b, constants)| native_block(b, constants, &columns)).collect();
        let blocks = blocks.filter(|b| b.iter().all(|(names, _)| *names == b[0].0));
        tracing::debug!(table, native = blocks.is_some(), "ClickHouse insert.");
        if let Some(blocks) = blocks {
            let names: Vec<String> = blocks[0].0.iter().map(|n| quote(n)).collect();
            let insert = format!("INSERT INTO {} ({}) FORMAT Native", quote(table), names.join(", "));
            // The first block is the body (a unit mostly has one); any others are appended.
            let body = blocks.into_iter().map(|(_, block)| block).reduce(|mut body, block| {
                body.extend_from_slice(&block);
                body
            });
            return self.client().await?.insert(&insert, body.unwrap_or_default()).await;
        }
        let insert = format!("INSERT INTO {} FORMAT JSONEachRow", quote(table));
        let mut body = Vec::new();
        for (batch, constants) in &stamped {
            body.extend(json_rows(batch, constants, self.modern)?);
        }
        self.client().await?.insert(&insert, body).await
    }

    async fn write_all(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let tables: Vec<String> =
            deliveries.iter().map(|d| d.table.clone().unwrap_or_else(|| self.config.table.clone())).collect();
        for (table, delivery) in tables.iter().zip(deliveries) {
            self.ensure(table, delivery).await?;
        }
        let Some(stamp) = stamp else {
            for (table, delivery) in tables.iter().zip(deliveries) {
                self.apply(table, delivery, 0).await?;
            }
            return Ok(());
        };
        self.positions().await?;
        // A retry of a write that failed: if its `done` row landed (the answer was lost), the
        // unit is written; else its rows are deleted before it is written again.
        if let Some((unit, checkpoint, written)) = self.failed.take() {
            if self.landed(&stamp.owner, unit).await? && checkpoint == stamp.checkpoint {
                return Ok(());
            }
            for table in &written {
                self.undo(table, unit).await?;
            }
            self.mark(&stamp.owner, unit, "undone", &written, "").await?;
        }
        // A unit's number is new for every attempt, so rows of attempts never mix, even after
        // the stream starts over from its source.
        let unit = rand::random::<u64>() >> 1 | 1;
        self.failed = Some((unit, stamp.checkpoint.clone(), tables.clone()));
        self.mark(&stamp.owner, unit, "writing", &tables, "").await?;
        for (table, delivery) in tables.iter().zip(deliveries) {
            self.apply(table, delivery, unit).await?;
        }
        self.mark(&stamp.owner, unit, "done", &tables, &stamp.checkpoint).await?;
        self.failed = None;
        Ok(())
    }

    /// Whether unit `unit` of `owner` has its `done` row.
    async fn landed(&mut self, owner: &str, unit: u64) -> Result<bool> {
        let sql = format!(
            "SELECT count() FROM {POSITIONS} WHERE owner = {} AND unit = {unit} AND state = 'done'",
            literal(owner)
        );
        Ok(self.client().await?.query(&sql).await?.trim() != "0")
    }

    async fn positions(&mut self) -> Result<()> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {POSITIONS} (owner String, unit UInt64, state String, tables Array(String), \
             checkpoint String, written UInt64) ENGINE = MergeTree ORDER BY (owner, written)"
        );
        self.client().await?.query(&sql).await.map(drop)
    }

    async fn mark(&mut self, owner: &str, unit: u64, state: &str, tables: &[String], checkpoint: &str) -> Result<()> {
        let row = serde_json::json!({
            "owner": owner, "unit": unit, "state": state, "tables": tables, "checkpoint": checkpoint,
            "written": u64::try_from(chrono::Utc::now().timestamp_micros()).unwrap_or(0),
        });
        let insert = format!("INSERT INTO {POSITIONS} FORMAT JSONEachRow");
        self.client().await?.insert(&insert, row.to_string().into_bytes()).await
    }

    /// The owner's last checkpoint; rows of units that began after it and never ended are
    /// deleted first, so the units are written again exactly once.
    async fn read_stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let sql = format!(
            "SELECT count() FROM system.tables WHERE database = {} AND name = '{POSITIONS}'",
            literal(&self.config.database)
        );
        let exists = self.client().await?.query(&sql).await?;
        if exists.trim() == "0" {
            return Ok(None);
        }
        let last = self
            .client()
            .await?
            .query(&format!(
                "SELECT checkpoint, written FROM {POSITIONS} WHERE owner = {} AND state = 'done' \
                 ORDER BY written DESC LIMIT 1 FORMAT JSONEachRow",
                literal(owner)
            ))
            .await?;
        let last: Option<Value> = last.lines().next().and_then(|l| serde_json::from_str(l).ok());
        // Markers without a `done` row of the same unit: units that never ended.
        let owner_is = format!("owner = {}", literal(owner));
        let unfinished = self
            .client()
            .await?
            .query(&format!(
                "SELECT unit, tables FROM {POSITIONS} WHERE {owner_is} AND state = 'writing' AND unit NOT IN \
                 (SELECT unit FROM {POSITIONS} WHERE {owner_is} AND state IN ('done', 'undone')) FORMAT JSONEachRow"
            ))
            .await?;
        for line in unfinished.lines() {
            let marker: Value = serde_json::from_str(line).map_err(|e| Error::new(ErrorKind::Fatal, e.to_string()))?;
            let unit = number(&marker["unit"]).unwrap_or(0);
            let tables: Vec<String> = marker["tables"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            for table in &tables {
                self.undo(table, unit).await?;
            }
            self.mark(owner, unit, "undone", &tables, "").await?;
        }
        Ok(last.and_then(|l| l["checkpoint"].as_str().map(str::to_string)))
    }

    /// Delete a unit's rows from `table` and wait until the deletion is done.
    async fn undo(&mut self, table: &str, unit: u64) -> Result<()> {
        if self.columns(table).await?.is_empty() {
            return Ok(());
        }
        tracing::info!(table, unit, "Deleting the rows of a unit that never ended, before it is written again.");
        let pending = format!(
            "SELECT count() FROM system.mutations WHERE database = {} AND table = {} AND is_done = 0",
            literal(&self.config.database),
            literal(table)
        );
        let client = self.client().await?;
        client.query(&format!("ALTER TABLE {} DELETE WHERE {UNIT} = {unit}", quote(table))).await?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        while client.query(&pending).await?.trim() != "0" {
            if std::time::Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::Transient,
                    format!("ClickHouse: deleting unit {unit} of {table} takes long"),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// A JSON number, or a number as text (ClickHouse quotes 64-bit integers in JSON).
fn number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

#[async_trait]
impl Destination for ClickhouseTarget {
    async fn check(&mut self) -> Result<()> {
        let result = async { self.client().await?.query("SELECT 1").await.map(drop) }.await;
        self.forget_on_error(result)
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        self.write(std::slice::from_ref(delivery), None).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let result = self.write_all(deliveries, stamp).await;
        self.forget_on_error(result)
    }

    async fn stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let result = self.read_stamp(owner).await;
        self.forget_on_error(result)
    }

    async fn table_schema(&mut self, table: &str) -> Result<Option<TableSchema>> {
        let result = self.columns(table).await;
        let columns = self.forget_on_error(result)?;
        if columns.is_empty() {
            return Ok(None);
        }
        let columns = columns
            .iter()
            .filter(|(n, _)| ![UNIT, VERSION, DELETED].contains(&n.as_str()))
            .filter_map(|(n, t)| column_of(t).map(|ty| sluice_core::schema::Column { name: n.clone(), ty }))
            .collect();
        Ok(Some(TableSchema::existing(columns)))
    }
}
