//! Reverse ETL: what a destination is handed for one run, and the trait every destination
//! implements. Change detection happens before (in the workspace); a destination only applies.

use std::fmt;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::Result;

/// How a sync's result reaches its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// The destination holds exactly the result, swapped in atomically where it allows.
    #[default]
    Replace,
    /// The whole result is added.
    Append,
    /// Rows new or changed since the last successful run, matched on the key columns.
    Upsert,
    /// Upsert, plus deletes for the keys that disappeared.
    Mirror,
}

impl SyncMode {
    /// Whether this mode matches rows on key columns (and so keeps row hashes).
    pub fn keyed(self) -> bool {
        matches!(self, Self::Upsert | Self::Mirror)
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Replace => "replace",
            Self::Append => "append",
            Self::Upsert => "upsert",
            Self::Mirror => "mirror",
        })
    }
}

/// Where a stream's snapshot copy of a table stands. Loading the rows into a table without
/// its key and building the key once at the end is cheaper than keeping an index up row by
/// row (what `pg_dump` does); a destination that can add a key later may do so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyPhase {
    /// More rows of the copy follow.
    Copying,
    /// These are the copy's last rows: the table gets its key now.
    Complete,
}

/// Everything one run sends.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The sync's name.
    pub sync: String,
    /// This run's id.
    pub run_id: String,
    /// The mode.
    pub mode: SyncMode,
    /// Key columns (upsert and mirror).
    pub keys: Vec<String>,
    /// The result's schema: every column the destination receives, in order.
    pub schema: SchemaRef,
    /// Replace and append: the whole result. Upsert and mirror: rows new or changed.
    pub rows: Vec<RecordBatch>,
    /// Mirror: the key columns of rows that disappeared.
    pub deletes: Vec<RecordBatch>,
    /// The table, where the writer names it (a stream's routed table); `None`: the one the
    /// destination is configured with.
    pub table: Option<String>,
    /// Rows of a stream's snapshot copy (`keys` are then the source table's key).
    pub copy: Option<CopyPhase>,
    /// Mirror: columns these rows do not carry (the source marked them unavailable, as
    /// Debezium does an unchanged TOASTed value): a key already in the table keeps its value
    /// there; a new key gets NULL.
    pub keep: Vec<String>,
    /// Mirror of a table without a key: `rows` are appended (identical rows included), and each
    /// row of `deletes` (every key column) removes one matching row; NULLs match NULLs.
    pub multiset: bool,
}

/// Where a writer stands, kept by the destination in the same transaction as the rows it
/// brought: on restart a stream resumes from what the destination holds, so each row lands
/// once.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamp {
    /// The stream (or sync) that wrote.
    pub owner: String,
    /// Its checkpoint, as JSON.
    pub checkpoint: String,
}

impl Delivery {
    /// Rows to write (not counting deletes).
    pub fn row_count(&self) -> usize {
        self.rows.iter().map(RecordBatch::num_rows).sum()
    }

    /// Keys to delete.
    pub fn delete_count(&self) -> usize {
        self.deletes.iter().map(RecordBatch::num_rows).sum()
    }
}

/// A place a sync delivers to: a database table, files, an HTTP API, and later Iceberg and Delta
/// tables. A delivery either succeeds as a whole or returns an error; the caller commits row
/// hashes only after success, so a failed run is resent in full.
#[async_trait]
pub trait Destination: Send {
    /// Connect and check that the destination can be written (for example, that the
    /// connection is not read-only), without writing anything.
    async fn check(&mut self) -> Result<()>;

    /// Apply one run's delivery.
    async fn deliver(&mut self, delivery: &Delivery) -> Result<()>;

    /// Apply several deliveries and `stamp` as one: all of them, or none. A destination that
    /// keeps no stamps delivers one after another, and refuses a stamp.
    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        if stamp.is_some() {
            return Err(crate::Error::new(
                crate::ErrorKind::Config,
                "destination: this kind keeps no stream positions; streams cannot write to it yet",
            ));
        }
        for delivery in deliveries {
            self.deliver(delivery).await?;
        }
        Ok(())
    }

    /// [`Destination::write`] while the write before it may still be in flight on another
    /// session of the same destination: the rows may load at once, but this commits only once
    /// `previous` says that write is durable, and never if it failed. By default it waits first.
    async fn write_after(
        &mut self,
        deliveries: &[Delivery],
        stamp: Option<&Stamp>,
        previous: crate::sink::Preceding,
    ) -> Result<()> {
        previous.durable().await?;
        self.write(deliveries, stamp).await
    }

    /// Apply `deliveries` and roll them back: whether they would commit. A stream whose unit
    /// the destination refuses for good finds the refused rows this way (they go to the
    /// ledger, and to its dead-letter table), and writes the rest. `None`: this kind cannot
    /// try a write without keeping it, so a refused unit stops the stream.
    async fn probe(&mut self, deliveries: &[Delivery]) -> Option<Result<()>> {
        let _ = deliveries;
        None
    }

    /// The key columns of `table` as the destination declares them: its primary key, else its
    /// narrowest unique index. `None`: the table does not exist, or this kind cannot tell;
    /// empty: it has neither.
    async fn keys(&mut self, table: &str) -> Result<Option<Vec<String>>> {
        let _ = table;
        Ok(None)
    }

    /// The columns of `table` as the destination has them, as the decoder's types: a stream
    /// resumes knowing them, so a value that does not fit goes to the ledger instead of
    /// failing the write. `None`: the table does not exist, or this kind cannot tell.
    async fn table_schema(&mut self, table: &str) -> Result<Option<crate::schema::TableSchema>> {
        let _ = table;
        Ok(None)
    }

    /// The checkpoint `owner` last wrote with its rows, where the destination keeps stamps.
    async fn stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let _ = owner;
        Ok(None)
    }

    /// Periodic work of a destination that buffers rows (files closing by age); called about
    /// five times a second while a stream runs.
    async fn tick(&mut self) -> Result<()> {
        Ok(())
    }

    /// Figures of what the destination holds back (files: `pending_rows`, `pending_seconds`).
    fn gauges(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }

    /// The stream stops: write out what is buffered.
    async fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// What a destination can do beyond writing rows, said by its config alone (so validation
/// stays pure): the writers, validation and the API read it instead of matching on kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Keeps a stream's stamp in the commit of its rows (an HTTP API cannot: the workspace
    /// keeps the position, and delivery is at least once).
    pub stamps: bool,
    /// Commits several tables and the stamp at once: a dead-letter table, a history.
    pub multi_table: bool,
    /// Runs the user's SQL over every change instead of writing tables.
    pub custom_sql: bool,
    /// Takes a snapshot chunk on a second session while the one before commits.
    pub lanes: bool,
    /// May sit behind a local `stage` that loads many units at once.
    pub stage: bool,
    /// Keeps a row's columns a delivery lists in [`Delivery::keep`] (a row it replaces whole,
    /// as a ClickHouse table or a change file does, cannot).
    pub keeps_columns: bool,
    /// Applies a [`Delivery::multiset`]: a mirror of a table without a key.
    pub multiset: bool,
}

impl Default for Capabilities {
    /// A destination that keeps stamps and columns, and nothing more.
    fn default() -> Self {
        Self {
            stamps: true,
            multi_table: false,
            custom_sql: false,
            lanes: false,
            stage: false,
            keeps_columns: true,
            multiset: false,
        }
    }
}
