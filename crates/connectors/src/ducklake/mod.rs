//! DuckLake: tables whose metadata lives in a SQL catalog (SQLite or Postgres) and whose data
//! are Parquet files in a folder or on S3, written through DuckDB's `ducklake` extension.

mod config;
mod maintenance;

pub use config::{Compaction, DuckLakeConfig};
pub use maintenance::{CompactionReport, FileFigures, compact, files, record, upkeep};

/// Writes DuckLake tables.
pub type DuckLakeTarget = crate::lakehouse::LakeTarget<DuckLakeConfig>;
