//! SQLite: a table in a database file as a reverse ETL destination.

mod target;

pub use target::{SqliteTableConfig, SqliteTarget};
