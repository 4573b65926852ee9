//! Apache Iceberg: tables of a REST catalog (the `/v1` API: Polaris, Lakekeeper, Glue's and S3
//! Tables' endpoints, Nessie, …), written through DuckDB's `iceberg` extension by the lakehouse
//! writer. A write is one commit per table, its position a table property in that commit.
//! Compaction (`compact.rs`) commits through the catalog's own routes (`catalog.rs`), with
//! manifests written here (`manifest.rs`, `avro.rs`): DuckDB's extension has no rewrite.

mod avro;
mod catalog;
mod compact;
mod config;
mod manifest;
mod sql_catalog;
mod store;

pub use compact::{CompactionReport, FileFigures, compact, record, upkeep};
pub use config::{IcebergCompaction, IcebergConfig};
pub use sql_catalog::{IcebergSqlCatalog, SqlCatalogDatabase};

/// Writes Iceberg tables.
pub type IcebergTarget = crate::lakehouse::LakeTarget<IcebergConfig>;
