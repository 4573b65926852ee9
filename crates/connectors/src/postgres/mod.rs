//! PostgreSQL change data capture: test connection, publication and `pgoutput` slot, a
//! consistent snapshot, then logical replication into mirrored tables.

mod cdc;
mod checks;
mod config;
mod pgoutput;
mod snapshot;
mod stream;
mod target;
mod tls;
mod values;

pub use cdc::{PostgresSource, release};
pub use checks::{Check, test_connection};
pub use config::{PostgresConfig, SslMode};
pub use target::{PostgresTableConfig, PostgresTarget};
