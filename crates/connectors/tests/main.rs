//! Connector tests against real services; the workspace is a real DuckDB file.

mod workspace;
