//! A stream whose rows land in a destination (a database of the user's) instead of the
//! workspace, through the same `Destination` contract that syncs use: each technology is
//! written once. The destination keeps the stream's checkpoint in the transaction of the rows
//! (`Destination::write` with a `Stamp`), and a restart resumes from what it holds, so every
//! row lands once. The workspace stays the control plane: the rejects ledger, push
//! idempotency keys and the stream's totals are written there.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::{
    Checkpoint, Delivery, Destination, Error, ErrorKind, Result, Sink, Stamp, SyncMode, WriteUnit, rejects::RejectBatch,
};
use tokio::sync::Mutex;

use crate::sync::{DestinationConfig, build_destination};
use crate::workspace::Workspace;

/// The sink of a stream with a `destination`.
pub struct DeliverySink {
    stream: String,
    destination: Mutex<Box<dyn Destination>>,
    workspace: Workspace,
}

impl DeliverySink {
    /// A sink for `stream` into `config`; the ledger and totals go to `workspace`.
    pub fn new(stream: &str, config: &DestinationConfig, workspace: Workspace) -> Result<Self> {
        Ok(Self { stream: stream.to_string(), destination: Mutex::new(build_destination(config)?), workspace })
    }

    /// The key columns the destination declares for `table` (see `Destination::keys`).
    pub async fn keys(&self, table: &str) -> Result<Option<Vec<String>>> {
        self.destination.lock().await.keys(table).await
    }

    /// The checkpoint the destination holds for the stream: where it resumes.
    pub async fn checkpoint(&self) -> Result<Option<Checkpoint>> {
        let Some(text) = self.destination.lock().await.stamp(&self.stream).await? else { return Ok(None) };
        serde_json::from_str(&text).map(Some).map_err(|e| {
            Error::new(
                ErrorKind::Fatal,
                format!("the destination's position of stream '{}' is unreadable", self.stream),
            )
            .with_source(e)
        })
    }

    /// The unit's tables as deliveries: appended, or replacing the table for the first chunk
    /// of a snapshot copy.
    fn deliveries(&self, unit: &WriteUnit) -> Result<Vec<Delivery>> {
        let mut out = Vec::with_capacity(unit.tables.len());
        for table in &unit.tables {
            if let Some(mirror) = &table.mirror {
                out.extend(super::delivery_mirror::deliveries(&self.stream, table, mirror)?);
                continue;
            }
            let replace = table.snapshot.is_some_and(|s| s.clear);
            out.push(Delivery {
                sync: self.stream.clone(),
                run_id: String::new(),
                mode: if replace { SyncMode::Replace } else { SyncMode::Append },
                keys: Vec::new(),
                schema: table.data.schema(),
                rows: vec![table.data.clone()],
                deletes: Vec::new(),
                table: Some(table.table.clone()),
            });
        }
        Ok(out)
    }

    /// A unit for the workspace with no rows: the ledger rows, or the push keys and marks of
    /// replayed ledger rows, with the checkpoint (the stream's totals).
    fn control(unit: &WriteUnit, ledger: bool) -> Arc<WriteUnit> {
        Arc::new(WriteUnit {
            stream: unit.stream.clone(),
            tables: Vec::new(),
            rejects: if ledger { unit.rejects.clone() } else { RejectBatch::default() },
            idempotency: if ledger { Vec::new() } else { unit.idempotency.clone() },
            replayed: if ledger { Vec::new() } else { unit.replayed.clone() },
            checkpoint: unit.checkpoint.clone(),
        })
    }
}

#[async_trait]
impl Sink for DeliverySink {
    async fn write(&self, unit: Arc<WriteUnit>) -> Result<()> {
        // The ledger first: a crash after it replays the unit, and a ledger row twice is better
        // than none (the destination's position decides what is read again).
        if !unit.rejects.is_empty() {
            self.workspace.write(Self::control(&unit, true)).await?;
        }
        let deliveries = self.deliveries(&unit)?;
        let checkpoint = serde_json::to_string(&unit.checkpoint)
            .map_err(|e| Error::new(ErrorKind::Fatal, "could not encode a checkpoint").with_source(e))?;
        let stamp = Stamp { owner: self.stream.clone(), checkpoint };
        self.destination.lock().await.write(&deliveries, Some(&stamp)).await?;
        // Then the push keys and totals, once the rows are durable where they belong.
        self.workspace.write(Self::control(&unit, false)).await
    }
}
