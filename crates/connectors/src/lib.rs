//! Every Source and Sink, one folder per technology, registered by one serde enum and one match.

pub mod clickhouse;
mod connection;
mod delivery;
pub mod delta;
pub mod ducklake;
pub mod files;
pub mod http_api;
pub mod http_push;
pub mod iceberg;
pub mod kafka;
pub mod kinesis;
mod lakehouse;
mod local_files;
pub mod mysql;
pub mod postgres;
pub mod snowflake;
mod sql_table;
pub mod sqlite;
mod stream;
mod sync;
pub mod transform;
pub mod workspace;

pub use connection::{
    ConnectionConfig, fill as fill_connections, named_in as connections_named_in, strip as strip_connections,
    test_connection,
};
pub use delivery::DeliverySink;
pub use stream::{
    SourceConfig, SourceContext, SourceHandle, StreamConfig, build_source, probe_source, release_source, test_source,
};
pub use sync::{DestinationConfig, Schedule, SyncConfig, build_destination};
#[cfg(test)]
mod test_rows;
