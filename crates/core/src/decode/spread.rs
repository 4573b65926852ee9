//! A large batch of raw messages (Kafka, Kinesis) decoded on several threads, with the serial
//! decoder's result.
//!
//! Like the push edge ([`super::Edge`]) it is optimistic. The records are cut into runs of
//! about equal bytes, and each run is decoded on its own thread against the schemas the stream
//! last committed, its events numbered from 1. The runs are then taken in order for as long as
//! each one moved no schema (no table created, no column added or widened). From the first run
//! that did, the rest of the records are decoded again, serially, against the same schemas,
//! and the runs taken before are joined to its rows as the edge's batches are: so the result is
//! always the serial decoder's, and a batch that evolves the schema costs at most one more
//! decode of its part after the change.

use std::ops::Range;

use super::body::raw_events;
use super::{Ctx, Decoded, Decoder, Pending, TableBuilder, edge};
use crate::batch::{Payload, Record};
use crate::error::{Error, ErrorKind, Result};
use crate::format::json::{body_events, message_events};
use crate::schema::TableSchema;

/// Bytes of payload below which a thread is not worth starting (the run loop's setting): a run
/// of this size decodes in about a millisecond.
pub const SPREAD_MIN_RUN_BYTES: usize = 256 << 10;

impl Decoder {
    /// [`Decoder::decode`], on up to `threads` threads when the records are raw messages or
    /// bodies of the stream's one table, whose schema already exists, and there are at least
    /// `min_run_bytes` of them per thread; otherwise serially.
    pub fn decode_spread(
        &self,
        records: Vec<Record>,
        next_sequence: i64,
        threads: usize,
        min_run_bytes: usize,
    ) -> Result<(Decoded, Pending)> {
        let current = self.schemas.get(&self.table).filter(|s| s.exists() && !s.columns().is_empty());
        let (Some(current), Some(runs)) = (current, self.runs(&records, threads, min_run_bytes.max(1))) else {
            return self.decode(records, next_sequence);
        };
        // The threads share a copy with the one table's schema: nothing else of this decoder
        // (the edge, a transform) is needed or shared.
        let worker = Decoder::new(
            self.table.clone(),
            self.metadata.clone(),
            [(self.table.clone(), current.clone())].into_iter().collect(),
        );
        let parts: Vec<Option<Decoded>> = std::thread::scope(|scope| {
            let (worker, records) = (&worker, &records);
            // A thread the system refuses leaves its run, and those after it, to the serial decode.
            let others: Vec<_> = runs[1..]
                .iter()
                .map(|run| {
                    std::thread::Builder::new()
                        .spawn_scoped(scope, move || worker.decode_raw(&records[run.clone()]))
                        .ok()
                })
                .collect();
            let first = worker.decode_raw(&records[runs[0].clone()]);
            let others = others.into_iter().map(|h| h.and_then(|h| h.join().ok().flatten()));
            std::iter::once(first).chain(others).collect()
        });
        let taken: Vec<Decoded> = parts
            .into_iter()
            .map_while(|part| part.filter(|d| d.tables.iter().all(|t| t.table == self.table && t.changes.is_empty())))
            .collect();
        let mut records = records;
        let rest = records.split_off(runs.get(taken.len()).map_or(records.len(), |r| r.start));
        drop(records);
        self.joined(taken, rest, next_sequence, current)
    }

    /// Contiguous runs of `records` of about equal bytes, one per thread, or `None` when they
    /// should be decoded serially.
    fn runs(&self, records: &[Record], threads: usize, min_run_bytes: usize) -> Option<Vec<Range<usize>>> {
        if threads < 2 || !self.runs_at_edge() {
            return None;
        }
        let mut sizes = Vec::with_capacity(records.len());
        for record in records {
            match &record.payload {
                Payload::Bytes(raw) | Payload::Body(raw) => sizes.push(raw.len()),
                _ => return None,
            }
        }
        let total: usize = sizes.iter().sum();
        let n = threads.min(total / min_run_bytes).min(records.len());
        if n < 2 {
            return None;
        }
        let mut runs = Vec::with_capacity(n);
        let (mut start, mut seen) = (0, 0);
        for (i, size) in sizes.iter().enumerate() {
            seen += size;
            // Cut once this run reaches its share of the bytes.
            if seen * n >= total * (runs.len() + 1) && runs.len() + 1 < n {
                runs.push(start..i + 1);
                start = i + 1;
            }
        }
        runs.push(start..records.len());
        Some(runs)
    }

    /// Raw records decoded against this decoder's schemas, the first event numbered 1; `None`
    /// if the builder could not finish (the serial decode then says why).
    fn decode_raw(&self, records: &[Record]) -> Option<Decoded> {
        let table = &self.table;
        let mut out = Decoded::default();
        let mut builder = TableBuilder::new(self.schemas.get(table).cloned().unwrap_or_default());
        for record in records {
            let events = match &record.payload {
                Payload::Bytes(raw) => message_events(raw.clone()),
                Payload::Body(raw) => body_events(raw.clone()),
                _ => return None,
            };
            raw_events(events, &Ctx { table, meta: &record.meta, seq: 0 }, &self.metadata, &mut builder, &mut out);
            out.record_ends.push(out.last_sequence);
        }
        let (write, _, empty) = builder.finish(table).ok()?;
        out.add(write, empty);
        Some(out)
    }

    /// The runs taken, their sequences moved to follow `next_sequence`, then `rest` decoded
    /// serially after them, as one decode.
    fn joined(
        &self,
        taken: Vec<Decoded>,
        rest: Vec<Record>,
        next_sequence: i64,
        current: &TableSchema,
    ) -> Result<(Decoded, Pending)> {
        let table = &self.table;
        let mut out = Decoded { last_sequence: next_sequence - 1, ..Decoded::default() };
        let mut early = Vec::with_capacity(taken.len());
        for part in taken {
            let before = out.last_sequence;
            out.rejects.extend_shifted(&part.rejects, before);
            out.record_ends.extend(part.record_ends.iter().map(|end| end + before));
            out.events += part.events;
            out.filtered_at.extend(part.filtered_at.iter().map(|at| at + before));
            out.last_sequence += part.events as i64;
            early.extend(part.tables.into_iter().map(|t| t.data).filter(|b| b.num_rows() > 0));
        }
        let (later, pending) = if rest.is_empty() {
            (None, Pending { schemas: vec![(table.clone(), current.clone())] })
        } else {
            let (later, pending) = self.decode(rest, out.last_sequence + 1)?;
            out.rejects.extend_shifted(&later.rejects, 0);
            out.record_ends.extend(later.record_ends);
            out.events += later.events;
            out.filtered_at.extend(later.filtered_at);
            out.last_sequence = later.last_sequence;
            (Some(later.tables), pending)
        };
        let mut later = later.unwrap_or_default();
        if later.iter().any(|t| &t.table != table) {
            return Err(Error::new(ErrorKind::Fatal, "a spread decode met a second table"));
        }
        let write = later.pop();
        let write = if early.is_empty() {
            write
        } else {
            let schema = pending.schemas.iter().find(|(t, _)| t == table).map_or(current, |(_, s)| s);
            Some(edge::joined(table, early, write, schema)?)
        };
        if let Some(write) = write {
            out.rows = write.data.num_rows() as u64;
            out.tables.push(write);
        }
        Ok((out, pending))
    }
}
