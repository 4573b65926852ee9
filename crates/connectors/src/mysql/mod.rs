//! MySQL and MariaDB: a table as a reverse ETL destination.

mod columns;
mod target;

pub use target::{MysqlTableConfig, MysqlTarget};
