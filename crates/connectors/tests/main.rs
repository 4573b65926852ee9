//! Connector tests against real services (the workspace is a real DuckDB file), and the
//! replication stream's parsers under generated input.

mod fuzz;
mod kinesis_lineage;
mod workspace;
