//! PostgreSQL change data capture: test connection, publication and `pgoutput` slot, a
//! consistent snapshot, then logical replication into mirrored tables.

mod apply;
mod cdc;
mod checks;
pub(crate) mod config;
mod custom;
/// The pure parsers of the replication stream, for the property tests and the fuzz targets
/// (`fuzz/`, which include `fuzz.rs`, `pgoutput.rs`, `types.rs` and `values.rs` by path). Not
/// an API.
#[doc(hidden)]
pub mod fuzz;
mod pgoutput;
mod snapshot;
mod stream;
mod target;
mod tls;
mod types;
mod values;

pub use cdc::{PostgresSource, release};
pub use checks::{Check, test_connection};
pub use config::{PostgresConfig, SslMode};
pub use target::{PostgresTableConfig, PostgresTarget};
