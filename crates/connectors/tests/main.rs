//! Connector tests against real services; the workspace is a real DuckDB file.

mod kinesis_lineage;
mod workspace;
