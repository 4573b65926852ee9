//! Replay: run a stream again over part of its input, into the same tables, exactly once.
//!
//! - From Kafka offsets: the rows that came from those offsets on (known by their `_topic`,
//!   `_partition` and `_offset` columns) and their ledger rows are deleted, and the checkpoint
//!   is moved back, in one transaction; the stream then reads them again.
//! - From a Kinesis timestamp: the rows whose `_arrival_time` is at or after it are deleted and
//!   the position cleared, in one transaction; the stream then starts at that timestamp.
//! - From the ledger: whole events that were refused are decoded again, and the ledger rows are
//!   marked `replayed_at` in the same transaction as the rows they become.
//!
//! A mirror stream's changes are applied idempotently (a change at or below the position a key
//! has is skipped), so for it only the checkpoint moves. A Debezium mirror stream also keeps the
//! ledger rows of single values in the range: the changes they belong to are skipped when read
//! again, and add no second ledger row (whole events refused are deleted and ledgered again).

use std::collections::BTreeMap;

use duckdb::{Connection, params};
use serde::{Deserialize, Serialize};
use sluice_core::{Error, ErrorKind, Result};

use super::db::{db_error, in_transaction, quote};
use super::state::WorkspaceState;

/// What to replay, as `POST /api/streams/:id/replay` takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReplayRequest {
    /// Kafka: read again from these offsets, per topic and partition.
    Offsets {
        /// `{"topic": {"0": 120, "1": 80}}`: partitions are JSON object keys, so text.
        offsets: BTreeMap<String, BTreeMap<String, i64>>,
    },
    /// Kinesis: read every shard again from this time (RFC 3339).
    Timestamp {
        /// When to start.
        timestamp: String,
    },
    /// The ledger: decode again the whole events it holds for this stream.
    Ledger {
        /// Only ledger rows recorded at or after this time (RFC 3339).
        #[serde(default)]
        since: Option<String>,
        /// Only ledger rows recorded before this time (RFC 3339).
        #[serde(default)]
        until: Option<String>,
        /// Only ledger rows whose reason contains this text.
        #[serde(default)]
        reason_contains: Option<String>,
    },
}

impl ReplayRequest {
    /// Check the values; pure.
    pub fn validate(&self) -> Result<()> {
        let time = |field: &str, value: &str| {
            chrono::DateTime::parse_from_rfc3339(value)
                .map(|_| ())
                .map_err(|e| Error::config(field, format!("not an RFC 3339 time: {e}")))
        };
        match self {
            Self::Offsets { offsets } => {
                if offsets.values().all(BTreeMap::is_empty) {
                    return Err(Error::config("offsets", "name at least one topic and partition"));
                }
                for (t, partitions) in offsets {
                    for (p, o) in partitions {
                        if p.parse::<i32>().is_err() {
                            return Err(Error::config(&format!("offsets.{t}.{p}"), "not a partition number"));
                        }
                        if *o < 0 {
                            return Err(Error::config(&format!("offsets.{t}.{p}"), format!("{o} is not an offset")));
                        }
                    }
                }
                Ok(())
            }
            Self::Timestamp { timestamp } => time("timestamp", timestamp),
            Self::Ledger { since, until, .. } => {
                since.as_deref().map_or(Ok(()), |s| time("since", s))?;
                until.as_deref().map_or(Ok(()), |u| time("until", u))
            }
        }
    }
}

/// A refused whole event kept in the ledger: its stream sequence and raw text.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerEvent {
    /// The sequence the event had.
    pub position: i64,
    /// Its raw text.
    pub value: String,
}

fn columns(conn: &Connection, table: &str) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare("SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' AND table_name = ?")
        .map_err(db_error)?;
    let rows = stmt.query_map([table], |r| r.get::<_, String>(0)).map_err(db_error)?;
    rows.collect::<std::result::Result<Vec<_>, _>>().map_err(db_error)
}

fn require(conn: &Connection, table: &str, needed: &[&str], metadata: &str) -> Result<()> {
    let have = columns(conn, table)?;
    match needed.iter().find(|n| !have.iter().any(|h| h == *n)) {
        None => Ok(()),
        Some(missing) => Err(Error::new(
            ErrorKind::Config,
            format!(
                "table '{table}' has no {missing} column, so the rows to read again cannot be told apart; \
                 turn on {metadata} in the stream's metadata (rows written from then on can be replayed)"
            ),
        )),
    }
}

impl WorkspaceState {
    /// Delete what came from `offsets` on (unless `mirror`) and move the checkpoint back to them.
    /// `positioned`: the stream's changes carry source positions (a Debezium mirror), so the
    /// ledger rows of single values stay.
    pub async fn replay_offsets(
        &self,
        stream: &str,
        tables: Vec<String>,
        (mirror, positioned): (bool, bool),
        offsets: BTreeMap<String, BTreeMap<String, i64>>,
    ) -> Result<u64> {
        let offsets: BTreeMap<String, BTreeMap<i32, i64>> = offsets
            .into_iter()
            .map(|(t, ps)| (t, ps.into_iter().filter_map(|(p, o)| Some((p.parse().ok()?, o))).collect()))
            .collect();
        let stream = stream.to_string();
        self.db
            .run(move |c| {
                in_transaction(c, |c| {
                    let mut deleted = 0u64;
                    for table in tables.iter().filter(|_| !mirror) {
                        require(c, table, &["_topic", "_partition", "_offset"], "`topic`, `partition` and `offset`")?;
                        for (topic, partitions) in &offsets {
                            for (partition, offset) in partitions {
                                let sql = format!(
                                    "DELETE FROM main.{} WHERE _topic = ? AND _partition = ? AND _offset >= ?",
                                    quote(table)
                                );
                                deleted += c.execute(&sql, params![topic, partition, offset]).map_err(db_error)? as u64;
                            }
                        }
                    }
                    for (topic, partitions) in &offsets {
                        for (partition, offset) in partitions {
                            c.execute(
                                "DELETE FROM sluice.rejects WHERE stream = ? \
                             AND json_extract_string(source, '$.topic') = ? \
                             AND TRY_CAST(json_extract_string(source, '$.partition') AS BIGINT) = ? \
                             AND TRY_CAST(json_extract_string(source, '$.offset') AS BIGINT) >= ? \
                             AND (NOT ? OR \"column\" IS NULL)",
                                params![stream, topic, partition, offset, positioned],
                            )
                            .map_err(db_error)?;
                        }
                    }
                    move_offsets(c, &stream, &offsets)?;
                    Ok(deleted)
                })
            })
            .await
    }

    /// Delete the rows that arrived at or after `timestamp` (unless `mirror`) and clear the
    /// position, so the stream starts at that time.
    pub async fn replay_since(
        &self,
        stream: &str,
        tables: Vec<String>,
        mirror: bool,
        timestamp: String,
    ) -> Result<u64> {
        let stream = stream.to_string();
        self.db
            .run(move |c| {
                in_transaction(c, |c| {
                    let mut deleted = 0u64;
                    for table in tables.iter().filter(|_| !mirror) {
                        require(c, table, &["_arrival_time"], "`arrival_time`")?;
                        let sql = format!("DELETE FROM main.{} WHERE _arrival_time >= ?::TIMESTAMPTZ", quote(table));
                        deleted += c.execute(&sql, params![timestamp]).map_err(db_error)? as u64;
                    }
                    c.execute("UPDATE sluice.checkpoints SET position = 'null' WHERE stream = ?", params![stream])
                        .map_err(db_error)?;
                    Ok(deleted)
                })
            })
            .await
    }

    /// The whole events the ledger holds for `stream` that were not replayed yet, oldest first.
    pub async fn ledger_events(
        &self,
        stream: &str,
        since: Option<String>,
        until: Option<String>,
        reason_contains: Option<String>,
        limit: usize,
    ) -> Result<Vec<LedgerEvent>> {
        let stream = stream.to_string();
        self.db
            .run(move |c| {
                let mut stmt = c
                    .prepare(&format!(
                        "SELECT position, value FROM sluice.rejects WHERE stream = ? AND \"column\" IS NULL \
                     AND replayed_at IS NULL AND value IS NOT NULL \
                     AND (?::TIMESTAMPTZ IS NULL OR recorded_at >= ?::TIMESTAMPTZ) \
                     AND (?::TIMESTAMPTZ IS NULL OR recorded_at < ?::TIMESTAMPTZ) \
                     AND (?::VARCHAR IS NULL OR contains(reason, ?::VARCHAR)) \
                     ORDER BY position LIMIT {limit}"
                    ))
                    .map_err(db_error)?;
                let rows = stmt
                    .query_map(params![stream, since, since, until, until, reason_contains, reason_contains], |r| {
                        Ok(LedgerEvent { position: r.get(0)?, value: r.get(1)? })
                    })
                    .map_err(db_error)?;
                rows.collect::<std::result::Result<Vec<_>, _>>().map_err(db_error)
            })
            .await
    }
}

/// Set the stored Kafka offsets of `offsets`' partitions, keeping the others.
fn move_offsets(c: &Connection, stream: &str, offsets: &BTreeMap<String, BTreeMap<i32, i64>>) -> Result<()> {
    let stored: Option<String> =
        c.query_row("SELECT position FROM sluice.checkpoints WHERE stream = ?", params![stream], |r| r.get(0)).ok();
    let mut position: serde_json::Value =
        stored.and_then(|p| serde_json::from_str(&p).ok()).filter(serde_json::Value::is_object).unwrap_or_default();
    if !position.is_object() {
        position = serde_json::json!({});
    }
    let all = &mut position["offsets"];
    if !all.is_object() {
        *all = serde_json::json!({});
    }
    for (topic, partitions) in offsets {
        for (partition, offset) in partitions {
            all[topic.as_str()][partition.to_string()] = serde_json::json!(offset);
        }
    }
    // A chunk number belongs to the position it was read at; the replay starts afresh.
    if let Some(map) = position.as_object_mut() {
        map.remove("chunk");
    }
    let updated = c
        .execute(
            "UPDATE sluice.checkpoints SET position = ?, updated_at = now() WHERE stream = ?",
            params![position.to_string(), stream],
        )
        .map_err(db_error)?;
    if updated == 0 {
        return Err(Error::new(ErrorKind::Config, "the stream has no checkpoint yet: there is nothing to replay"));
    }
    Ok(())
}
