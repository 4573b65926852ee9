//! Apache Iceberg: tables of a REST catalog (the `/v1` API: Polaris, Lakekeeper, Glue's and S3
//! Tables' endpoints, Nessie, …), written through DuckDB's `iceberg` extension by the lakehouse
//! writer. A write is one commit per table, its position a table property in that commit.

mod config;

pub use config::IcebergConfig;

/// Writes Iceberg tables.
pub type IcebergTarget = crate::lakehouse::LakeTarget<IcebergConfig>;
