//! Snowflake as a destination, through the REST protocol Snowflake's own drivers speak
//! (`/session/v1/login-request`, `/queries/v1/query-request`): `config.rs` the config,
//! `client.rs` the session, statements with bind variables and their results, `target.rs` the
//! writes, `stage.rs` bulk loads. Each unit is one Snowflake transaction: its rows (array-bound
//! INSERTs, a mirror's keys deleted first; or, from `copy_rows` rows on, a Parquet file put into
//! the stage `SLUICE_STAGE` and loaded by `COPY INTO`, through a landing table for keyed
//! modes), then a new row with the stream's position in `SLUICE_POSITIONS` (insert-only
//! inside the transaction, so a transaction left open by a killed process does not conflict
//! with the restarted stream's position rows or appends; keyed and replace modes still delete
//! rows such a transaction may have deleted), then COMMIT; a restart resumes from the newest
//! position row. Tables are created on the first rows
//! and gain columns (`ALTER TABLE … ADD COLUMN`); DDL runs before the transaction, as
//! Snowflake commits DDL on its own.

mod client;
mod config;
mod keypair;
mod stage;
mod target;

pub use config::SnowflakeConfig;
pub use target::SnowflakeTarget;
