//! Streaming: pgoutput messages of whole transactions become one chunk each, positioned at the
//! commit's end LSN, each row change a typed [`sluice_core::Change`]. Relations (and their DDL)
//! come from the stream; TOASTed values the update did not send are read back; a heartbeat keeps
//! the slot moving on an idle database.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pgwire_replication::client::ReplicationClient;
use pgwire_replication::{Lsn, ReplicationEvent};
use serde_json::{Map, Value};
use sluice_core::{ChangeOp, ColumnType, Error, ErrorKind, Record, Result};
use tokio::sync::watch;

use super::cdc::{Cdc, Progress, RelationInfo, change};
use super::config::sql_error;
use super::pgoutput::{self, Cell, Message, Relation};
use super::types::{TypeInfo, Types};
use super::values::value;

/// Microseconds between 1970-01-01 and PostgreSQL's epoch, 2000-01-01.
const PG_EPOCH_US: i64 = 946_684_800_000_000;

impl Cdc {
    pub(super) async fn stream(
        &self,
        client: tokio_postgres::Client,
        mut session: ReplicationClient,
        mut progress: Progress,
        mut acks: watch::Receiver<u64>,
    ) -> Result<()> {
        let mut relations: HashMap<u32, RelationInfo> = HashMap::new();
        let mut types = Types::default();
        let mut txn: Vec<Record> = Vec::new();
        let (mut xid, mut commit_us, mut commit_lsn) = (0u32, 0i64, 0u64);
        let mut measured = Instant::now();
        let mut last_commit = Instant::now();
        let heartbeat = Duration::from_millis(self.config.heartbeat_ms);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                changed = acks.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    let lsn = *acks.borrow();
                    session.update_applied_lsn(Lsn::from_u64(lsn));
                }
                _ = tick.tick() => {}
                event = session.recv() => {
                    let event = event.map_err(|e| Error::new(ErrorKind::Transient, format!("replication stream: {e}")))?;
                    let Some(event) = event else {
                        return Err(Error::new(ErrorKind::Transient, "the replication stream ended"));
                    };
                    match event {
                        ReplicationEvent::Begin { xid: x, commit_time_micros, final_lsn } => {
                            txn.clear();
                            xid = x;
                            commit_us = commit_time_micros + PG_EPOCH_US;
                            commit_lsn = final_lsn.as_u64();
                        }
                        ReplicationEvent::XLogData { data, .. } => {
                            let message = pgoutput::decode(&data)
                                .map_err(|e| Error::new(ErrorKind::Fatal, format!("pgoutput: {e}")))?;
                            // Ordered by the commit LSN, then within the transaction: both are
                            // above the slot's start, where the copied rows sit.
                            let at = (commit_lsn, txn.len() as u64 + 1, commit_us, xid);
                            if let Some(record) = self.apply(&client, &mut types, &mut relations, message, at).await? {
                                txn.push(record);
                            }
                        }
                        ReplicationEvent::Commit { end_lsn, .. } => {
                            last_commit = Instant::now();
                            progress.lsn = Some(end_lsn.as_u64());
                            if !self.send(std::mem::take(&mut txn), &progress).await {
                                return Ok(());
                            }
                        }
                        _ => {}
                    }
                }
            }
            if measured.elapsed() >= Duration::from_secs(2) {
                self.measure_slot(&client, commit_us).await;
                measured = Instant::now();
            }
            if last_commit.elapsed() >= heartbeat {
                // A transactional message moves the slot on an idle database; it comes back as
                // a transaction whose commit is then confirmed.
                let _ = client.execute("SELECT pg_logical_emit_message(true, 'sluice-heartbeat', '')", &[]).await;
                last_commit = Instant::now();
            }
        }
    }

    /// One pgoutput message: a relation is remembered, a row change becomes a record.
    async fn apply(
        &self,
        client: &tokio_postgres::Client,
        types: &mut Types,
        relations: &mut HashMap<u32, RelationInfo>,
        message: Message,
        at: (u64, u64, i64, u32),
    ) -> Result<Option<Record>> {
        let id = match &message {
            Message::Relation(r) => {
                let info = self.relation_info(client, types, r).await?;
                relations.insert(r.id, info);
                return Ok(None);
            }
            Message::Insert { relation, .. } | Message::Update { relation, .. } | Message::Delete { relation, .. } => {
                *relation
            }
            Message::Other(_) => return Ok(None),
        };
        let rel = relations.get(&id).ok_or_else(|| {
            Error::new(ErrorKind::Fatal, format!("a change for relation {id} before its description"))
        })?;
        let db = &self.config.database;
        Ok(Some(match message {
            Message::Insert { new, .. } => change(ChangeOp::Insert, rel, db, (rel.image(&new), None), at),
            Message::Update { old, new, .. } => {
                let mut after = rel.image(&new);
                let before = old.map(|o| rel.image(&o));
                // An unchanged TOASTed value equals the old one: with REPLICA IDENTITY FULL (a
                // keyless table) the old image carries it, inlined; otherwise read it by key.
                let mut new = new;
                if let Some(before) = &before {
                    for ((name, _, _), cell) in rel.columns.iter().zip(new.iter_mut()) {
                        if *cell == Cell::Unchanged
                            && let Some(v) = before.get(name)
                        {
                            after.insert(name.clone(), v.clone());
                            *cell = Cell::Null;
                        }
                    }
                }
                if new.contains(&Cell::Unchanged) {
                    self.unchanged(client, rel, &new, &mut after).await?;
                }
                change(ChangeOp::Update, rel, db, (after, before), at)
            }
            Message::Delete { old, .. } => change(ChangeOp::Delete, rel, db, (rel.image(&old), None), at),
            _ => return Ok(None),
        }))
    }

    /// A relation from the stream, with types resolved and the table's primary key.
    async fn relation_info(
        &self,
        client: &tokio_postgres::Client,
        types: &mut Types,
        r: &Relation,
    ) -> Result<RelationInfo> {
        let mut columns = Vec::with_capacity(r.columns.len());
        for c in &r.columns {
            let info = types.get(client, c.type_oid).await.map_err(|e| sql_error("reading a column type", &e))?;
            columns.push((c.name.clone(), info, c.typmod));
        }
        let primary =
            super::snapshot::relation(client, types, &r.schema, &r.name).await.map(|(i, _)| i.key).unwrap_or_default();
        let flagged: Vec<String> = r.columns.iter().filter(|c| c.key).map(|c| c.name.clone()).collect();
        let key = if !primary.is_empty() && primary.len() < columns.len().max(2) {
            primary
        } else if !flagged.is_empty() {
            flagged
        } else {
            columns.iter().map(|c| c.0.clone()).collect()
        };
        Ok(RelationInfo::new(r.schema.clone(), r.name.clone(), columns, key))
    }

    /// Values an update did not send (unchanged TOAST), read from the source by key, so the
    /// mirrored row keeps them.
    async fn unchanged(
        &self,
        client: &tokio_postgres::Client,
        rel: &RelationInfo,
        new: &[Cell],
        after: &mut Map<String, Value>,
    ) -> Result<()> {
        let missing: Vec<(&(String, TypeInfo, i32), ColumnType)> = rel
            .columns
            .iter()
            .zip(rel.types.iter())
            .zip(new)
            .filter(|(_, c)| **c == Cell::Unchanged)
            .map(|((col, (_, ty)), _)| (col, *ty))
            .collect();
        let select: Vec<String> =
            missing.iter().map(|(c, _)| format!("\"{}\"::text", c.0.replace('"', "\"\""))).collect();
        let mut filters = Vec::new();
        for k in &rel.key {
            let v = after.get(k).map(super::cdc::plain_text).unwrap_or_default();
            filters.push(format!("\"{}\"::text = '{}'", k.replace('"', "\"\""), v.replace('\'', "''")));
        }
        let sql = format!(
            "SELECT {} FROM \"{}\".\"{}\" WHERE {}",
            select.join(", "),
            rel.schema.replace('"', "\"\""),
            rel.name.replace('"', "\"\""),
            filters.join(" AND ")
        );
        if let Some(row) = client.query_opt(&sql, &[]).await.map_err(|e| sql_error("reading unchanged values", &e))? {
            for (i, ((name, info, _), ty)) in missing.into_iter().enumerate() {
                let text: Option<String> = row.get(i);
                after.insert(name.clone(), text.map_or(Value::Null, |t| value(ty, info, &t)));
            }
        }
        Ok(())
    }

    /// Slot lag: bytes of WAL the slot holds back, and seconds since the last applied commit
    /// while it does.
    async fn measure_slot(&self, client: &tokio_postgres::Client, commit_us: i64) {
        let row = client
            .query_opt(
                "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::float8, wal_status FROM pg_replication_slots \
                 WHERE slot_name = $1",
                &[&self.slot],
            )
            .await;
        match row {
            Ok(Some(row)) => {
                let bytes: Option<f64> = row.get(0);
                let status: Option<String> = row.get(1);
                let bytes = bytes.unwrap_or(0.0).max(0.0);
                self.metrics.set_source("slot_lag_bytes", bytes);
                let seconds = if bytes > 0.0 && commit_us > 0 {
                    ((sluice_core::batch::now_us() - commit_us) as f64 / 1e6).max(0.0)
                } else {
                    0.0
                };
                self.metrics.set_source("slot_lag_seconds", seconds);
                if status.as_deref() == Some("lost") {
                    self.metrics.set_state(
                        "failed",
                        Some(format!(
                            "replication slot {} was invalidated (WAL removed): remove and re-create the stream to \
                             snapshot again",
                            self.slot
                        )),
                    );
                }
            }
            Ok(None) => self.metrics.set_state("failed", Some(format!("replication slot {} is gone", self.slot))),
            Err(e) => tracing::debug!(error = %e, "Slot lag query failed."),
        }
    }
}
