//! The Postgres CDC source. A task creates the publication and the `pgoutput` slot (exporting
//! its snapshot), copies the existing rows in chunks, then streams changes one whole
//! transaction per chunk. Positions (snapshot progress, then the commit LSN) are stored with
//! the rows; the slot's confirmed flush LSN moves only when the run loop commits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pgwire_replication::Lsn;
use pgwire_replication::client::ReplicationClient;
use pgwire_replication::config::ReplicationConfig;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sluice_core::format::change::Route;
use sluice_core::{
    Change, ChangeOp, Chunk, ColumnType, Error, ErrorKind, Payload, Position, Record, RecordMeta, Result, Source,
    StreamMetrics,
};
use tokio::sync::{mpsc, watch};

use super::checks::tables;
use super::config::{PostgresConfig, cause, sql_error};
use super::pgoutput::Cell;
use super::types::{TypeInfo, column_type};
use super::values::value;

/// Where a Postgres stream stands: copying (table by table, chunk by chunk), then streaming.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Progress {
    /// The LSN the stream resumes after (the slot's start until the first commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) lsn: Option<u64>,
    /// The slot's consistent point, where streaming starts after the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) start_lsn: Option<u64>,
    /// Tables fully copied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) copied: Vec<String>,
    /// The table being copied and the last key copied (text values), when mid-table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) copying: Option<(String, Vec<String>)>,
}

fn position(p: &Progress) -> Position {
    Position(serde_json::to_value(p).unwrap_or(Value::Null))
}

/// Reads one Postgres database's tables into mirrored tables.
pub struct PostgresSource {
    config: PostgresConfig,
    stream: String,
    metrics: Arc<StreamMetrics>,
    rx: mpsc::Receiver<Result<Chunk>>,
    acked: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl PostgresSource {
    /// Start from `position` (the durable checkpoint).
    pub fn build(
        config: &PostgresConfig,
        stream: &str,
        position: &Position,
        metrics: Arc<StreamMetrics>,
    ) -> Result<Self> {
        let (rx, acked, task) = spawn(config, stream, position, metrics.clone());
        Ok(Self { config: config.clone(), stream: stream.to_string(), metrics, rx, acked, task })
    }
}

type Spawned = (mpsc::Receiver<Result<Chunk>>, watch::Sender<u64>, tokio::task::JoinHandle<()>);

fn spawn(config: &PostgresConfig, stream: &str, position: &Position, metrics: Arc<StreamMetrics>) -> Spawned {
    let progress: Progress = serde_json::from_value(position.0.clone()).unwrap_or_default();
    let (tx, rx) = mpsc::channel(16);
    let (acked, acks) = watch::channel(progress.lsn.unwrap_or(0));
    let cdc = Cdc { config: config.clone(), slot: PostgresConfig::slot_name(stream), metrics, tx: tx.clone() };
    let task = tokio::spawn(async move {
        if let Err(e) = cdc.run(progress, acks).await {
            let _ = tx.send(Err(e)).await;
        }
    });
    (rx, acked, task)
}

#[async_trait]
impl Source for PostgresSource {
    async fn next(&mut self) -> Result<Option<Chunk>> {
        match self.rx.recv().await {
            Some(Ok(chunk)) => Ok(Some(chunk)),
            Some(Err(e)) => Err(e),
            None => Err(Error::new(ErrorKind::Transient, "the Postgres reader stopped")),
        }
    }

    async fn commit(&mut self, position: &Position) -> Result<()> {
        if let Some(lsn) = position.0.get("lsn").and_then(Value::as_u64) {
            self.acked.send_replace(lsn);
        }
        Ok(())
    }

    async fn rewind(&mut self, position: &Position) -> Result<()> {
        self.task.abort();
        let (rx, acked, task) = spawn(&self.config, &self.stream, position, self.metrics.clone());
        (self.rx, self.acked, self.task) = (rx, acked, task);
        Ok(())
    }

    async fn close(&mut self) {
        self.task.abort();
    }
}

impl Drop for PostgresSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Drop the stream's slot and publication (the stream is being removed).
pub async fn release(config: &PostgresConfig, stream: &str) -> Result<()> {
    let client = config.connect().await?;
    let slot = PostgresConfig::slot_name(stream);
    // The walsender of a stopped stream may take a moment to let go of the slot.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let dropped = client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await;
        match dropped {
            Ok(_) => break,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => return Err(sql_error("dropping the replication slot", &e)),
        }
    }
    client
        .batch_execute(&format!("DROP PUBLICATION IF EXISTS \"{slot}\""))
        .await
        .map_err(|e| sql_error("dropping the publication", &e))
}

pub(super) struct Cdc {
    pub(super) config: PostgresConfig,
    pub(super) slot: String,
    pub(super) metrics: Arc<StreamMetrics>,
    pub(super) tx: mpsc::Sender<Result<Chunk>>,
}

impl Cdc {
    async fn run(self, mut progress: Progress, acks: watch::Receiver<u64>) -> Result<()> {
        tracing::info!(slot = %self.slot, ?progress, "Postgres source starting.");
        let client = self.config.connect().await?;
        let tables: Vec<String> = tables(&client, &self.config)
            .await
            .map_err(|e| sql_error("listing tables", &e))?
            .into_iter()
            .map(|t| t.0)
            .collect();
        self.ensure_publication(&client, &tables).await?;
        if progress.lsn.is_some() || progress.start_lsn.is_some() {
            self.slot_usable(&client).await?;
        }
        let mut replication = None;
        if progress.lsn.is_none() && progress.start_lsn.is_none() {
            // First start: the slot, and the snapshot it exports for a consistent copy.
            let mut session = ReplicationClient::connect_gated(self.replication_config(Lsn::from_u64(0)))
                .await
                .map_err(|e| Error::new(ErrorKind::Connect, format!("replication connection: {e}")))?;
            let mode = if self.config.snapshot { "export" } else { "nothing" };
            let created = session
                .simple_query(&format!(
                    "CREATE_REPLICATION_SLOT \"{}\" LOGICAL pgoutput (SNAPSHOT '{mode}')",
                    self.slot
                ))
                .await;
            let (start, snapshot) = match created {
                Ok(rows) => {
                    let row = rows.into_iter().next().ok_or_else(|| Error::new(ErrorKind::Fatal, "no slot row"))?;
                    let text =
                        |i: usize| row.get(i).and_then(|c| c.as_ref()).map(|b| String::from_utf8_lossy(b).into_owned());
                    let lsn = text(1).and_then(|l| Lsn::parse(&l).ok()).map_or(0, Lsn::as_u64);
                    (lsn, text(2))
                }
                // It exists already (a crash before the first checkpoint): start where it stands.
                Err(e) => match self.slot_position(&client).await {
                    Ok(at) => (at, None),
                    Err(_) => {
                        return Err(Error::new(
                            ErrorKind::Connect,
                            format!("creating replication slot {}: {e}", self.slot),
                        ));
                    }
                },
            };
            progress.start_lsn = Some(start);
            if !self.config.snapshot {
                progress.lsn = Some(start);
            }
            replication = Some((session, snapshot));
        }
        if progress.lsn.is_none() {
            let snapshot = replication.as_ref().and_then(|(_, s)| s.clone());
            self.copy(&tables, &mut progress, snapshot).await?;
            progress.lsn = progress.start_lsn;
            progress.copying = None;
            if !self.send(Vec::new(), &progress).await {
                return Ok(());
            }
        }
        let start = Lsn::from_u64(progress.lsn.unwrap_or(0));
        let session = match replication {
            Some((mut session, _)) => {
                session.start().await.map_err(|e| Error::new(ErrorKind::Transient, format!("replication: {e}")))?;
                session
            }
            None => ReplicationClient::connect(self.replication_config(start))
                .await
                .map_err(|e| Error::new(ErrorKind::Connect, format!("replication connection: {e}")))?,
        };
        self.metrics.set_state("running", None);
        self.stream(client, session, progress, acks).await
    }

    fn replication_config(&self, start: Lsn) -> ReplicationConfig {
        let mut cfg = ReplicationConfig::new(
            self.config.host.clone(),
            self.config.user.clone(),
            self.config.password(),
            self.config.database.clone(),
            self.slot.clone(),
            self.slot.clone(),
        );
        cfg.port = self.config.port;
        cfg.tls = super::tls::replication_tls(self.config.sslmode, self.config.sslrootcert.as_deref());
        cfg.start_lsn = start;
        cfg.status_interval = Duration::from_secs(1);
        cfg
    }

    /// The slot this stream resumes from must still exist and hold its WAL.
    async fn slot_usable(&self, client: &tokio_postgres::Client) -> Result<()> {
        let row = client
            .query_opt("SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", &[&self.slot])
            .await
            .map_err(|e| sql_error("reading the slot", &e))?;
        let how = match row.map(|r| r.get::<_, Option<String>>(0)) {
            None => "no longer exists",
            Some(Some(status)) if status == "lost" => {
                "was invalidated: the server removed WAL it still needed (see max_slot_wal_keep_size)"
            }
            Some(_) => return Ok(()),
        };
        let message = format!(
            "replication slot {} {how}, so changes since the last checkpoint cannot be read; \
             POST /api/streams/<name>/resnapshot copies the tables again",
            self.slot
        );
        self.metrics.set_state("failed", Some(message.clone()));
        Err(Error::new(ErrorKind::Fatal, message))
    }

    async fn slot_position(&self, client: &tokio_postgres::Client) -> Result<u64> {
        let row = client
            .query_opt(
                "SELECT coalesce(confirmed_flush_lsn, restart_lsn)::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .map_err(|e| sql_error("reading the slot", &e))?
            .ok_or_else(|| Error::new(ErrorKind::Fatal, format!("replication slot {} vanished", self.slot)))?;
        let text: Option<String> = row.get(0);
        Ok(text.and_then(|t| Lsn::parse(&t).ok()).map_or(0, Lsn::as_u64))
    }

    async fn ensure_publication(&self, client: &tokio_postgres::Client, tables: &[String]) -> Result<()> {
        let exists = client
            .query_opt("SELECT 1 FROM pg_publication WHERE pubname = $1", &[&self.slot])
            .await
            .map_err(|e| sql_error("reading publications", &e))?
            .is_some();
        if exists || tables.is_empty() {
            return Ok(());
        }
        let list: Vec<String> =
            tables.iter().map(|t| t.split_once('.').map_or(t.clone(), |(s, n)| format!("\"{s}\".\"{n}\""))).collect();
        let sql = format!("CREATE PUBLICATION \"{}\" FOR TABLE {}", self.slot, list.join(", "));
        client.batch_execute(&sql).await.map_err(|e| {
            Error::new(
                ErrorKind::Config,
                format!("cannot create the publication (the user must own the tables): {}", cause(&e)),
            )
        })
    }

    /// Hand a chunk of records to the run loop; false once the stream is gone.
    pub(super) async fn send(&self, records: Vec<Record>, progress: &Progress) -> bool {
        let bytes = records
            .iter()
            .map(|r| match &r.payload {
                Payload::Copy(rows) => rows.len_bytes(),
                _ => 64,
            })
            .sum();
        // A snapshot chunk is already a large batch: written at once, it overlaps the next read.
        let flush = records.iter().any(|r| matches!(r.payload, Payload::Copy(_)));
        let chunk = Chunk { records, bytes, position: position(progress), arrived: Instant::now(), flush };
        self.tx.send(Ok(chunk)).await.is_ok()
    }
}

/// A change to one row of `relation`, typed: `image` is the new row (the old one for a delete),
/// `before` the old row of an update when the stream sent one; then the commit LSN, the change's
/// place in its transaction, the commit time and the transaction id.
pub(super) fn change(
    op: ChangeOp,
    relation: &RelationInfo,
    db: &str,
    (image, before): (Map<String, Value>, Option<Map<String, Value>>),
    (lsn, tx_seq, commit_us, xid): (u64, u64, i64, u32),
) -> Record {
    let keys: Vec<String> = relation.key.iter().filter(|k| image.contains_key(k.as_str())).cloned().collect();
    // The message key, for the `_key` metadata column: the key columns' values as JSON.
    let key: Map<String, Value> = keys.iter().filter_map(|k| Some((k.clone(), image.get(k)?.clone()))).collect();
    let source = json!({"connector": "postgresql", "db": db, "schema": relation.schema, "table": relation.name,
                        "lsn": lsn, "txSeq": tx_seq, "ts_us": commit_us, "txId": xid});
    let named = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let change = Change {
        op,
        image,
        before,
        keys,
        types: relation.types.clone(),
        unconverted: Vec::new(),
        change_us: Some(commit_us),
        source: Some(source),
        // The commit LSN, then the order within the transaction: both above the slot's start,
        // where the copied rows sit.
        source_order: Some(format!("{lsn:020}{tx_seq:010}")),
        route: Route { db: named(db), schema: named(&relation.schema), table: named(&relation.name) },
        unavailable: Vec::new(),
    };
    Record {
        payload: Payload::Change(Box::new(change)),
        meta: RecordMeta {
            received_us: sluice_core::batch::now_us(),
            key: Some(Value::Object(key).to_string()),
            route: Some(relation.name.clone()),
            ..RecordMeta::default()
        },
    }
}

/// A value as the text Postgres would print for it (for key filters).
pub(super) fn plain_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A relation with resolved types and its key.
pub(super) struct RelationInfo {
    pub schema: String,
    pub name: String,
    pub columns: Vec<(String, TypeInfo, i32)>,
    /// Each column's type in Sluice (`types.rs`), for the snapshot's rows and the changes alike.
    pub types: Arc<Vec<(String, ColumnType)>>,
    pub key: Vec<String>,
}

impl RelationInfo {
    pub(super) fn new(schema: String, name: String, columns: Vec<(String, TypeInfo, i32)>, key: Vec<String>) -> Self {
        let types = columns.iter().map(|(column, info, typmod)| (column.clone(), column_type(info, *typmod))).collect();
        Self { schema, name, columns, types: Arc::new(types), key }
    }

    pub(super) fn image(&self, cells: &[Cell]) -> Map<String, Value> {
        let mut out = Map::new();
        for (((name, info, _), (_, ty)), cell) in self.columns.iter().zip(self.types.iter()).zip(cells) {
            match cell {
                Cell::Null => {
                    out.insert(name.clone(), Value::Null);
                }
                // Not sent: left out, so the row keeps its value.
                Cell::Unchanged => {}
                Cell::Text(t) => {
                    out.insert(name.clone(), value(*ty, info, t));
                }
            }
        }
        out
    }
}
