//! What DuckLake and Iceberg destinations share: one writer (`target.rs`) over DuckDB's
//! extensions, and the [`Lakehouse`] each format implements: how to attach its catalog as
//! `lake`, and where a stream's position goes in the same commit as the rows.

mod tables;
mod target;

use std::path::PathBuf;

use duckdb::Connection;
use sluice_core::{Result, Stamp};

pub(crate) use tables::existing_columns;
pub use target::LakeTarget;
pub(crate) use target::{Lake, lake_error, on_lake, on_lake_detaching, shared};

/// `text` for inside single quotes in DuckDB's SQL.
pub(crate) fn literal(text: &str) -> String {
    text.replace('\'', "''")
}

/// A lake format: its catalog, attached as `lake` on a DuckDB of the destination's own.
pub trait Lakehouse: Clone + Send + Sync + 'static {
    /// The statements that attach the catalog as `lake` on a new connection (for a catalog
    /// Sluice serves itself, after starting it).
    fn attach_sql(&self) -> Result<String>;
    /// The schema (namespace) of the tables.
    fn schema(&self) -> &str;
    /// The table of a sync; empty for a stream (its deliveries name theirs).
    fn table(&self) -> &str;
    /// `message` with this config's secrets replaced by `***`.
    fn redact(&self, message: &str) -> String;
    /// The extension folder to load from.
    fn extensions(&self) -> Option<PathBuf>;
    /// The format's name, for messages.
    fn label(&self) -> &'static str;
    /// The extensions it needs, for a message when they are missing.
    fn needs(&self) -> &'static str;
    /// Whether an integer column can become a double in place (DuckLake can; Iceberg's type
    /// promotions are int → long and float → double only).
    fn widens_integers(&self) -> bool {
        true
    }
    /// The catalog, for messages (no secret in it).
    fn catalog_name(&self) -> String;
    /// Record `stamp` (a stream's position) inside the open transaction that wrote `tables`.
    fn write_stamp(&self, conn: &Connection, tables: &[String], stamp: &Stamp) -> Result<()>;
    /// The position `owner` recorded last.
    fn read_stamp(&self, conn: &Connection, owner: &str) -> Result<Option<String>>;
}
