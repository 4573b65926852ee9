//! `POST /api/streams/:id/replay`: run a stream again over part of its input, exactly once
//! (the rules are in `sluice_connectors::workspace::replay`).

use std::sync::Arc;

use serde_json::{Value, json};
use sluice_connectors::kinesis::KinesisStart;
use sluice_connectors::transform;
use sluice_connectors::workspace::{LedgerEvent, ReplayRequest, Workspace};
use sluice_connectors::{SourceConfig, StreamConfig};
use sluice_core::batch::now_us;
use sluice_core::{Checkpoint, Error, ErrorKind, Format, Mode, Payload, Record, RecordMeta, Result, Sink, WriteUnit};

use crate::supervisor::{Supervisor, reload};

/// Most ledger rows one replay decodes again; ask again for the rest.
const LEDGER_BATCH: usize = 100_000;

/// Replay `name` as `request` asks; `None` when there is no such stream.
pub async fn replay(supervisor: &Supervisor, name: &str, request: ReplayRequest) -> Result<Option<Value>> {
    request.validate()?;
    let workspace = supervisor.workspace().clone();
    supervisor
        .while_stopped(name, |config| async move {
            if config.destination.is_some() {
                return Err(Error::new(
                    ErrorKind::Config,
                    "replay: this stream delivers to a destination, which replay does not reach yet",
                ));
            }
            let state = workspace.state();
            let tables = state.tables_matching(&config.table).await?;
            let mirror = config.mode == Mode::Mirror;
            match request {
                ReplayRequest::Offsets { offsets } => {
                    let SourceConfig::Kafka(kafka) = &config.source else {
                        return Err(wrong_source("offsets", "a Kafka stream"));
                    };
                    let partitions = offsets
                        .iter()
                        .map(|(t, ps)| {
                            (t.clone(), ps.iter().filter_map(|(p, o)| Some((p.parse().ok()?, *o))).collect())
                        })
                        .collect();
                    // The group first: should the workspace part fail, the stored offsets still
                    // win over it (the larger of the two is read from), and nothing is lost.
                    sluice_connectors::kafka::rewind_group(kafka, &config.name, &partitions).await?;
                    let positioned = mirror && config.format == Format::Debezium;
                    let deleted = state.replay_offsets(&config.name, tables, (mirror, positioned), offsets).await?;
                    Ok((config, json!({ "from": "offsets", "rows_deleted": deleted })))
                }
                ReplayRequest::Timestamp { timestamp } => {
                    let mut config = config;
                    let SourceConfig::Kinesis(kinesis) = &mut config.source else {
                        return Err(wrong_source("timestamp", "a Kinesis stream"));
                    };
                    // With its position cleared, the stream starts where its config says.
                    kinesis.start = KinesisStart::AtTimestamp(timestamp.clone());
                    let deleted = state.replay_since(&config.name, tables, mirror, timestamp).await?;
                    Ok((config, json!({ "from": "timestamp", "rows_deleted": deleted })))
                }
                ReplayRequest::Ledger { since, until, reason_contains } => {
                    let events = state.ledger_events(&config.name, since, until, reason_contains, LEDGER_BATCH).await?;
                    let answer = decode_again(&workspace, &config, events).await?;
                    Ok((config, answer))
                }
            }
        })
        .await
}

fn wrong_source(from: &str, needs: &str) -> Error {
    Error::new(ErrorKind::Config, format!("from: '{from}' replays {needs}; use 'ledger' for any stream"))
}

/// Decode the ledger's events again and write them, marking their ledger rows replayed, in one
/// transaction. The position stays; the stream's sequence moves on.
async fn decode_again(workspace: &Workspace, config: &StreamConfig, events: Vec<LedgerEvent>) -> Result<Value> {
    if events.is_empty() {
        return Ok(json!({ "from": "ledger", "events": 0, "rows": 0, "rejected_again": 0 }));
    }
    let (checkpoint, decoder) = reload(workspace.state(), None, config).await?;
    // Ledger rows were written after the field rules: they are not applied a second time.
    let mut decoder = decoder.with_transform(transform::build_for_ledger(config.transform.as_ref())?);
    let received_us = now_us();
    let replayed: Vec<i64> = events.iter().map(|e| e.position).collect();
    let records = events
        .into_iter()
        .map(|e| Record {
            payload: Payload::Bytes(bytes::Bytes::from(e.value)),
            meta: RecordMeta { received_us, ..RecordMeta::default() },
        })
        .collect();
    let (decoded, pending) = decoder.decode(records, checkpoint.sequence + 1)?;
    decoder.commit(pending);
    let (events, rows, rejected_again) = (decoded.events, decoded.rows, decoded.rejects.len());
    let mut totals = checkpoint.totals.clone();
    totals.rows_written += decoded.rows;
    totals.filtered += decoded.filtered_at.len() as u64;
    totals.rejects += decoded.rejects.len() as u64;
    totals.batches += 1;
    let unit = WriteUnit {
        stream: config.name.clone(),
        tables: decoded.tables,
        rejects: decoded.rejects.finish(),
        idempotency: Vec::new(),
        replayed,
        checkpoint: Checkpoint { position: checkpoint.position, sequence: decoded.last_sequence, totals },
    };
    workspace.sink().write(Arc::new(unit)).await?;
    Ok(json!({ "from": "ledger", "events": events, "rows": rows, "rejected_again": rejected_again }))
}
