//! Postgres source settings: the API's and the YAML's type, a pure `validate`, connections.

use serde::{Deserialize, Serialize};
use sluice_core::{Error, ErrorKind, Result, Secret};

/// A Postgres CDC source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// A named connection (`/api/connections`) that gives the fields left out here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// Host name or address.
    pub host: String,
    /// Port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Database.
    pub database: String,
    /// User: a superuser, or a user with the REPLICATION attribute that owns the tables.
    pub user: String,
    /// Password; never serialized back.
    #[serde(default, skip_serializing)]
    pub password: Option<Secret>,
    /// `disable`, `prefer`, `require`, `verify-ca` or `verify-full` (libpq's meanings).
    #[serde(default)]
    pub sslmode: SslMode,
    /// The CA certificate (PEM) for `verify-ca` and `verify-full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sslrootcert: Option<std::path::PathBuf>,
    /// Schema-qualified tables (`public.orders`). Give these or `schema`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
    /// Every table of this schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Copy the existing rows first.
    #[serde(default = "yes")]
    pub snapshot: bool,
    /// Rows per snapshot chunk, at most; a chunk also ends at 64 MiB of rows, so wide rows
    /// keep it small.
    #[serde(default = "default_chunk")]
    pub snapshot_chunk_rows: u32,
    /// How long the stream may see no transaction before it writes a heartbeat (a logical
    /// decoding message), so the slot moves on and WAL is not held on an idle database; ms.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_ms: u64,
}

fn default_heartbeat() -> u64 {
    10_000
}

fn default_port() -> u16 {
    5432
}

fn yes() -> bool {
    true
}

fn default_chunk() -> u32 {
    200_000
}

/// TLS to the server, as libpq's `sslmode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, else plain TCP; the certificate is not checked.
    #[default]
    Prefer,
    /// TLS; the certificate is not checked.
    Require,
    /// TLS; the certificate must chain to `sslrootcert`.
    VerifyCa,
    /// TLS; the certificate must chain to `sslrootcert` and name the host.
    VerifyFull,
}

/// Where and how to connect: the fields a Postgres source and a Postgres destination share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Endpoint<'a> {
    pub host: &'a str,
    pub port: u16,
    pub database: &'a str,
    pub user: &'a str,
    pub password: &'a str,
    pub sslmode: SslMode,
    pub sslrootcert: Option<&'a std::path::Path>,
}

fn identifier_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl PostgresConfig {
    /// Check every field; pure. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.host.is_empty() {
            return Err(Error::config("source.host", "must not be empty"));
        }
        if self.database.is_empty() {
            return Err(Error::config("source.database", "must not be empty"));
        }
        if self.user.is_empty() {
            return Err(Error::config("source.user", "must not be empty"));
        }
        validate_tls("source", self.sslmode, self.sslrootcert.as_deref())?;
        if self.sslmode == SslMode::VerifyFull && self.host.parse::<std::net::IpAddr>().is_ok() {
            return Err(Error::config(
                "source.host",
                "verify-full compares the certificate with a host name, and the replication client cannot do \
                 that for an IP address: give the name in the certificate, or use verify-ca",
            ));
        }
        match (self.tables.is_empty(), &self.schema) {
            (true, None) => return Err(Error::config("source.tables", "give tables (schema.table) or schema")),
            (false, Some(_)) => return Err(Error::config("source.schema", "give tables or schema, not both")),
            _ => {}
        }
        for t in &self.tables {
            let ok = t.split_once('.').is_some_and(|(s, n)| identifier_ok(s) && identifier_ok(n));
            if !ok {
                return Err(Error::config("source.tables", format!("'{t}' is not schema.table (letters, digits, _)")));
            }
        }
        if let Some(s) = &self.schema
            && !identifier_ok(s)
        {
            return Err(Error::config("source.schema", "letters, digits and _ only"));
        }
        if !(100..=3_600_000).contains(&self.heartbeat_ms) {
            return Err(Error::config("source.heartbeat_ms", "must be between 100 and 3600000"));
        }
        if !(100..=1_000_000).contains(&self.snapshot_chunk_rows) {
            return Err(Error::config("source.snapshot_chunk_rows", "must be between 100 and 1000000"));
        }
        Ok(())
    }

    /// The slot and publication names of `stream`.
    pub fn slot_name(stream: &str) -> String {
        let clean: String =
            stream.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
        format!("sluice_{clean}")
    }

    pub(crate) fn password(&self) -> String {
        self.password.as_ref().map(|p| p.expose().to_string()).unwrap_or_default()
    }

    /// A SQL session.
    pub(crate) async fn connect(&self) -> Result<tokio_postgres::Client> {
        Ok(self.session().await?.detach())
    }

    /// A SQL session whose connection is cut when it is dropped before [`Session::detach`]:
    /// a statement still streaming (a snapshot's `COPY`) ends with it, on the server too.
    pub(crate) async fn session(&self) -> Result<Session> {
        let password = self.password();
        open(Endpoint {
            host: &self.host,
            port: self.port,
            database: &self.database,
            user: &self.user,
            password: &password,
            sslmode: self.sslmode,
            sslrootcert: self.sslrootcert.as_deref(),
        })
        .await
    }
}

/// A client and its connection's task, aborted on drop unless detached. tokio-postgres reads
/// a response to its end even after its reader is gone, so a `COPY` left half-read would
/// otherwise go on streaming the rest of the table, its transaction open, in the background.
pub(crate) struct Session {
    pub(crate) client: tokio_postgres::Client,
    task: AbortOnDrop,
}

struct AbortOnDrop(Option<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

impl Session {
    /// The client, its connection left to end when the client is dropped.
    pub(crate) fn detach(mut self) -> tokio_postgres::Client {
        self.task.0 = None;
        self.client
    }
}

/// Check `sslmode` and `sslrootcert` together; pure. `prefix` is `source` or `destination`.
pub(crate) fn validate_tls(prefix: &str, mode: SslMode, root: Option<&std::path::Path>) -> Result<()> {
    match (mode, root) {
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            Err(Error::config(&format!("{prefix}.sslrootcert"), "verify-ca and verify-full need the CA file (PEM)"))
        }
        _ => Ok(()),
    }
}

/// A SQL session, over TLS as `sslmode` asks.
pub(crate) async fn connect(to: Endpoint<'_>) -> Result<tokio_postgres::Client> {
    Ok(open(to).await?.detach())
}

async fn open(to: Endpoint<'_>) -> Result<Session> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(to.host)
        .port(to.port)
        .dbname(to.database)
        .user(to.user)
        .password(to.password)
        .application_name("sluice")
        .connect_timeout(std::time::Duration::from_secs(10));
    config.ssl_mode(match to.sslmode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    let failed = |e: tokio_postgres::Error| {
        Error::new(ErrorKind::Connect, format!("cannot connect to {}:{}: {}", to.host, to.port, cause(&e)))
    };
    Ok(match super::tls::client_config(to.sslmode, to.sslrootcert)? {
        None => spawned(config.connect(tokio_postgres::NoTls).await.map_err(failed)?),
        Some(tls) => {
            let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls);
            spawned(config.connect(tls).await.map_err(failed)?)
        }
    })
}

/// A session whose connection runs on a task of its own.
fn spawned<S, T>((client, connection): (tokio_postgres::Client, tokio_postgres::Connection<S, T>)) -> Session
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "Postgres connection ended.");
        }
    });
    Session { client, task: AbortOnDrop(Some(task.abort_handle())) }
}

/// The server's own message for an error, when it sent one.
pub(crate) fn cause(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text = format!("{text}: {s}");
                source = s.source();
            }
            text
        }
    }
}

/// A SQL error as a Sluice error: connection trouble is transient.
pub(crate) fn sql_error(what: &str, e: &tokio_postgres::Error) -> Error {
    let kind = if e.as_db_error().is_some() { ErrorKind::Fatal } else { ErrorKind::Transient };
    Error::new(kind, format!("{what}: {}", cause(e)))
}
