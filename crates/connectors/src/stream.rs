//! A stream's config (the API's and the YAML's type) and the one place sources are built.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_core::secret::{keep, restore};
use sluice_core::transform::TransformConfig;
use sluice_core::{
    ChangeConfig, FlushConfig, Format, MetadataConfig, Mode, Position, Result, Secret, Source, StreamMetrics,
    error::Error, secret::REDACTED,
};

use crate::http_push::{self, HttpPushConfig, PushHandle};
use crate::kafka::{KafkaConfig, KafkaSource, is_secret_property};
use crate::kinesis::{KinesisConfig, KinesisSource};
use crate::postgres::{Check, PostgresConfig, PostgresSource};
use crate::sync::DestinationConfig;

/// One stream: a source, a destination table in the workspace, and how to batch.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// Unique name; also the stream's id in URLs. Letters, digits, `_` and `-`.
    pub name: String,
    /// Destination table in the workspace. Any characters; `*` is replaced by the record's
    /// route (a topic, a source table) for sources that have one.
    pub table: String,
    /// Where events come from. Defaults to HTTP push.
    #[serde(default)]
    pub source: SourceConfig,
    /// Optional metadata columns.
    #[serde(default)]
    pub metadata: MetadataConfig,
    /// Micro-batch rules.
    #[serde(default)]
    pub flush: FlushConfig,
    /// `append` (every event a row) or `mirror` (one row per key: inserts and updates replace
    /// it, deletes remove it).
    #[serde(default)]
    pub mode: Mode,
    /// Key columns for `mirror`; Debezium events default to their key's fields.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// With `mirror`: also append every change to `<table>__changes`.
    #[serde(default)]
    pub history: bool,
    /// `json`, or `debezium` change events.
    #[serde(default)]
    pub format: Format,
    /// Where the rows land: absent, the embedded workspace; else a destination (a database
    /// table, files, an HTTP API), which keeps the stream's position with the rows where it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<DestinationConfig>,
    /// With a database or warehouse destination: a table there that receives, in the unit's
    /// own transaction, every ledger row of the stream (events the decoder refused, and rows the
    /// destination refused, with its error), as the workspace ledger has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_table: Option<String>,
    /// With a database destination: stage units on the local disk and load them every
    /// `every_ms` in one transaction (a staged bulk load), instead of one transaction per unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<StageConfig>,
    /// What happens to events on the way: field rules (drop, rename, mask, type, computed
    /// columns), a filter, validation rules and a route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<TransformConfig>,
    /// For declared streams: the push key to accept. When absent one is generated and shown
    /// once. Stored hashed, never serialized back.
    #[serde(default, skip_serializing)]
    pub push_key: Option<Secret>,
    /// Stopped by a person (`POST /api/streams/:id/pause`) until resumed: nothing is read, a
    /// push gets 503, and the position stays where it was (a Postgres slot keeps its WAL, a
    /// Kafka group its offsets).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

impl StreamConfig {
    /// Check every field; pure. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(Error::config("name", "must be 1-64 letters, digits, '_' or '-'"));
        }
        if self.table.trim().is_empty() || self.table.len() > 255 || self.table.contains('\0') {
            return Err(Error::config("table", "must be 1-255 characters without NUL"));
        }
        if let Some(key) = &self.push_key
            && key.expose().len() < 16
        {
            return Err(Error::config("push_key", "must be at least 16 characters"));
        }
        self.flush.validate()?;
        if !self.detects_keys() {
            self.changes().validate()?;
        }
        self.validate_destination()?;
        self.validate_transform()?;
        match &self.source {
            SourceConfig::HttpPush(c) => c.validate(),
            SourceConfig::Kafka(c) => c.validate(),
            SourceConfig::Kinesis(c) => c.validate(),
            SourceConfig::Postgres(c) => c.validate(),
        }
    }

    /// The transform's structure, what the stream's mode allows of it, and its expressions
    /// (parsed and bound by an in-memory DuckDB: no I/O).
    fn validate_transform(&self) -> Result<()> {
        let Some(t) = &self.transform else { return Ok(()) };
        t.validate()?;
        if self.changes().mode == Mode::Mirror && t.has_row_rules() {
            return Err(Error::config(
                "transform",
                "a mirror stream takes field rules only (drop, rename, mask, type): a filter, rule, route or \
                 computed column would leave keys behind",
            ));
        }
        crate::transform::check(t)
    }

    /// Whether the stream's keys come from its destination table: a JSON mirror with a
    /// destination and no `keys` (the supervisor looks them up before it starts the stream).
    pub fn detects_keys(&self) -> bool {
        let changes = self.changes();
        self.destination.is_some()
            && changes.keys.is_empty()
            && changes.mode == Mode::Mirror
            && changes.format == Format::Json
    }

    /// A dead-letter table is a second table in the unit's transaction: for destinations that
    /// commit several tables at once, and not beside custom SQL (which writes only its blocks)
    /// or a staged load.
    fn validate_dead_letters(&self, table: &str) -> Result<()> {
        let field = "dead_letter_table";
        // 63: the longest name Postgres keeps (MySQL's is 64).
        if table.is_empty() || table.len() > 63 || table.contains(['*', '[', '"', '`', '.', '\0']) {
            return Err(Error::config(field, "a plain table name of at most 63 bytes (no '.', quotes, '*' or '[')"));
        }
        if table.eq_ignore_ascii_case("sluice_positions") || table.to_ascii_lowercase().contains("__sluice_landing") {
            return Err(Error::config(field, "that name is Sluice's own"));
        }
        if let Some(DestinationConfig::Postgres(c)) = &self.destination
            && c.schema_is_template()
        {
            return Err(Error::config(field, "a Postgres schema template names many schemas; name one schema"));
        }
        let capabilities = self.destination.as_ref().map(DestinationConfig::capabilities);
        if !capabilities.is_some_and(|c| c.multi_table) {
            return Err(Error::config(
                field,
                "a dead-letter table needs a destination that commits it with the rows (postgres, mysql or \
                 sqlite without custom SQL; snowflake, clickhouse, ducklake; iceberg with multi_table_commit)",
            ));
        }
        if self.stage.is_some() {
            return Err(Error::config(field, "a staged load is not checked row by row; leave out `stage`"));
        }
        if table.eq_ignore_ascii_case(&self.table) {
            return Err(Error::config(field, "must differ from the stream's table"));
        }
        Ok(())
    }

    /// A stream's destination: a database table named by the stream's `table`, files, or an
    /// HTTP API.
    fn validate_destination(&self) -> Result<()> {
        if let Some(table) = &self.dead_letter_table {
            self.validate_dead_letters(table)?;
        }
        if let Some(stage) = &self.stage {
            stage.validate()?;
            let capabilities = self.destination.as_ref().map(DestinationConfig::capabilities);
            if capabilities.is_some_and(|c| c.custom_sql) {
                return Err(Error::config(
                    "stage",
                    "a staged load merges units; custom SQL runs every change of each unit",
                ));
            }
            if !capabilities.is_some_and(|c| c.stage) {
                return Err(Error::config(
                    "stage",
                    "staged loads are for a postgres, mysql, sqlite or snowflake destination",
                ));
            }
        }
        let Some(destination) = &self.destination else { return Ok(()) };
        let table = match destination {
            DestinationConfig::Postgres(c) => {
                c.validate_connection()?;
                &c.table
            }
            DestinationConfig::Mysql(c) => {
                c.validate_connection()?;
                &c.table
            }
            DestinationConfig::Sqlite(c) => {
                c.validate_connection()?;
                &c.table
            }
            DestinationConfig::Ducklake(c) => {
                c.validate_connection()?;
                &c.table
            }
            DestinationConfig::Iceberg(c) => {
                c.validate_connection()?;
                // Without a multi-table commit, rows of two tables and the position could not
                // be committed at once: a stream into such a catalog writes one table.
                let routed = self.transform.as_ref().is_some_and(|t| t.route.is_some());
                if !c.multi_table_commit && (self.table.contains(['*', '[']) || routed) {
                    return Err(Error::config(
                        "table",
                        "an Iceberg catalog without multi_table_commit takes one table per stream; name it",
                    ));
                }
                if !c.multi_table_commit && self.history {
                    return Err(Error::config(
                        "history",
                        "the history is a second table, which an Iceberg catalog without multi_table_commit \
                         cannot commit with the mirror's rows",
                    ));
                }
                &c.table
            }
            DestinationConfig::Delta(c) => {
                c.validate_connection()?;
                // A Delta commit holds one table: rows of two tables and the position could
                // not land at once.
                let routed = self.transform.as_ref().is_some_and(|t| t.route.is_some());
                if self.table.contains(['*', '[']) || routed {
                    return Err(Error::config(
                        "table",
                        "a stream into Delta writes one table (one commit holds one); name it",
                    ));
                }
                if self.history {
                    return Err(Error::config(
                        "history",
                        "the history is a second table, which a Delta commit cannot hold with the mirror's rows",
                    ));
                }
                crate::delta::check_table("table", &self.table)?;
                &c.table
            }
            DestinationConfig::Clickhouse(c) => {
                c.validate_connection()?;
                &c.table
            }
            DestinationConfig::Snowflake(c) => {
                c.validate_connection()?;
                &c.table
            }
            DestinationConfig::Files(c) => {
                c.validate()?;
                if c.name.is_some() {
                    return Err(Error::config("destination.name", "a stream names its files with `path`"));
                }
                return Ok(());
            }
            DestinationConfig::Http(c) => return c.validate(),
        };
        if !table.is_empty() {
            return Err(Error::config(
                "destination.table",
                "leave it out: the stream's `table` names the destination table",
            ));
        }
        Ok(())
    }

    /// Mode, keys, history and format, as the decoder takes them.
    pub fn changes(&self) -> ChangeConfig {
        match self.source {
            // Postgres changes always mirror, keyed by each table's primary key. They come typed
            // (`Payload::Change`), so no format reads them; the format only says what holds for
            // Debezium's changes too: their keys come with each change, none are configured.
            SourceConfig::Postgres(_) => {
                ChangeConfig { mode: Mode::Mirror, keys: Vec::new(), history: self.history, format: Format::Debezium }
            }
            _ => ChangeConfig { mode: self.mode, keys: self.keys.clone(), history: self.history, format: self.format },
        }
    }

    /// The secrets inside the source config, by field path. The server keeps them apart from
    /// the serialized config, which never contains them.
    pub fn secrets(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        match &self.source {
            SourceConfig::Kafka(kafka) => {
                keep(&mut out, "source.sasl.password", kafka.sasl.as_ref().and_then(|s| s.password.as_ref()));
                for (name, value) in &kafka.properties {
                    if is_secret_property(name) && value != REDACTED {
                        out.insert(format!("source.properties.{name}"), value.clone());
                    }
                }
            }
            SourceConfig::Kinesis(kinesis) => {
                let credentials = kinesis.credentials.as_ref();
                keep(
                    &mut out,
                    "source.credentials.secret_access_key",
                    credentials.and_then(|c| c.secret_access_key.as_ref()),
                );
                keep(&mut out, "source.credentials.session_token", credentials.and_then(|c| c.session_token.as_ref()));
            }
            SourceConfig::Postgres(pg) => keep(&mut out, "source.password", pg.password.as_ref()),
            SourceConfig::HttpPush(_) => {}
        }
        if let Some(destination) = &self.destination {
            out.extend(destination.secrets());
        }
        out
    }

    /// Put secrets back where [`StreamConfig::secrets`] found them, unless the config already
    /// carries a new value.
    pub fn restore_secrets(&mut self, secrets: &BTreeMap<String, String>) {
        match &mut self.source {
            SourceConfig::Kafka(kafka) => {
                if let Some(sasl) = kafka.sasl.as_mut() {
                    restore(&mut sasl.password, secrets, "source.sasl.password");
                }
                // A secret property shows as `***`; sent back so, it keeps the stored value.
                for (name, value) in kafka.properties.iter_mut() {
                    if value == REDACTED
                        && let Some(s) = secrets.get(&format!("source.properties.{name}"))
                    {
                        value.clone_from(s);
                    }
                }
            }
            SourceConfig::Kinesis(kinesis) => {
                if let Some(c) = kinesis.credentials.as_mut() {
                    restore(&mut c.secret_access_key, secrets, "source.credentials.secret_access_key");
                    restore(&mut c.session_token, secrets, "source.credentials.session_token");
                }
            }
            SourceConfig::Postgres(pg) => restore(&mut pg.password, secrets, "source.password"),
            SourceConfig::HttpPush(_) => {}
        }
        if let Some(destination) = self.destination.as_mut() {
            destination.restore_secrets(secrets);
        }
    }
}

/// A staged bulk load's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// How often the staged units are loaded, in milliseconds.
    #[serde(default = "default_every_ms")]
    pub every_ms: u64,
    /// Staged rows (and deletes) past which a unit waits for a load: the stream then moves
    /// at the destination's pace.
    #[serde(default = "default_max_pending_rows")]
    pub max_pending_rows: u64,
}

fn default_every_ms() -> u64 {
    1000
}

fn default_max_pending_rows() -> u64 {
    1_000_000
}

impl StageConfig {
    /// Check the fields; pure.
    pub fn validate(&self) -> Result<()> {
        if self.every_ms < 100 {
            return Err(Error::config("stage.every_ms", "must be at least 100"));
        }
        if self.max_pending_rows == 0 {
            return Err(Error::config("stage.max_pending_rows", "must be above 0"));
        }
        Ok(())
    }
}

/// Where a stream's events come from. The `type` field picks the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SourceConfig {
    /// Events POSTed to `/api/streams/:id/push`.
    HttpPush(HttpPushConfig),
    /// Messages from Kafka topics.
    Kafka(Box<KafkaConfig>),
    /// Records from every shard of an Amazon Kinesis data stream.
    Kinesis(Box<KinesisConfig>),
    /// Tables of a PostgreSQL database through logical replication, mirrored.
    Postgres(Box<PostgresConfig>),
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self::HttpPush(HttpPushConfig::default())
    }
}

/// What the server keeps to feed a running source from outside.
#[derive(Debug, Clone)]
pub enum SourceHandle {
    /// The push endpoint's way into the stream.
    Push(PushHandle),
    /// The source reads by itself.
    None,
}

/// What a source is built with besides its config.
pub struct SourceContext<'a> {
    /// The stream's name.
    pub stream: &'a str,
    /// The stream's last durable position, to resume from.
    pub position: &'a Position,
    /// The stream's metrics, for state and lag.
    pub metrics: Arc<StreamMetrics>,
}

/// Build a source from its config: the one place connectors are wired.
pub fn build_source(config: &SourceConfig, ctx: SourceContext<'_>) -> Result<(Box<dyn Source>, SourceHandle)> {
    match config {
        SourceConfig::HttpPush(c) => {
            let (source, handle) = http_push::channel(c);
            Ok((Box::new(source), SourceHandle::Push(handle)))
        }
        SourceConfig::Kafka(c) => {
            let source = KafkaSource::build(c, ctx.stream, ctx.position, ctx.metrics)?;
            Ok((Box::new(source), SourceHandle::None))
        }
        SourceConfig::Kinesis(c) => {
            let source = KinesisSource::build(c, ctx.position, ctx.metrics)?;
            Ok((Box::new(source), SourceHandle::None))
        }
        SourceConfig::Postgres(c) => {
            let source = PostgresSource::build(c, ctx.stream, ctx.position, ctx.metrics)?;
            Ok((Box::new(source), SourceHandle::None))
        }
    }
}

/// What a source needs, checked before anything is created (Postgres: connection, wal_level,
/// privileges, free slots and senders, keyed tables). Sources without checks pass.
pub async fn test_source(config: &SourceConfig, stream: &str) -> Result<Vec<Check>> {
    match config {
        SourceConfig::Postgres(c) => crate::postgres::test_connection(c, stream).await,
        _ => Ok(Vec::new()),
    }
}

/// Test source, as the page's button asks: [`test_source`]'s checks, and for Kafka and
/// Kinesis (which a stream may be created without, and waits for) whether the source answers.
pub async fn probe_source(config: &SourceConfig, stream: &str) -> Result<Vec<Check>> {
    let answer = match config {
        SourceConfig::Kafka(c) => crate::kafka::probe(c).await,
        SourceConfig::Kinesis(c) => crate::kinesis::probe(c).await,
        _ => return test_source(config, stream).await,
    };
    Ok(vec![match answer {
        Ok(message) => Check { name: "connect", ok: true, message },
        Err(e) => Check { name: "connect", ok: false, message: e.to_string() },
    }])
}

/// Release what a removed stream held at its source (Postgres: its slot and publication).
pub async fn release_source(config: &SourceConfig, stream: &str) -> Result<()> {
    match config {
        SourceConfig::Postgres(c) => crate::postgres::release(c, stream).await,
        _ => Ok(()),
    }
}
