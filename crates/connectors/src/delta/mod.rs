//! Delta Lake tables on a local folder or S3, written by Sluice itself: Parquet data files
//! and the JSON transaction log (`log.rs`), with log checkpoints (`checkpoint.rs`). A write is
//! one commit per table, put only if no other writer took its version; a stream's position is
//! in the table's configuration in that same commit, beside a `txn` action (the protocol's
//! application version), so a restart resumes from what the table holds. Merges rewrite the
//! files that hold the changed keys (`table.rs`), and small files are merged between writes
//! (`compact.rs`).

mod checkpoint;
mod compact;
mod config;
mod files;
mod log;
mod schema;
mod table;
mod target;

pub use compact::{CompactionReport, FileFigures};
pub(crate) use config::check_name as check_table;
pub use config::{DeltaCompaction, DeltaConfig};
pub use target::{DeltaTarget, compact};
