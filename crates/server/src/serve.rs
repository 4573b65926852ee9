//! `sluice serve`: open the workspace, start the streams, serve the API until a signal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sluice_connectors::workspace::Workspace;

use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState, SqlLimits};
use crate::auth::{Auth, AuthSettings};
use crate::config::FileConfig;
use crate::connections::Connections;
use crate::keys;
use crate::supervisor::{SaveError, Supervisor};
use crate::syncs::Syncs;

/// Limits on user SQL (`/api/sql`) and on push bodies held at once. DuckDB's memory limit, the whole workspace's (DuckDB has no
/// per-query cap), is set when it opens: `SLUICE_DUCKDB_MEMORY`, 112MB by default.
#[derive(Debug, Clone, clap::Args)]
pub struct Limits {
    /// Longest an `/api/sql` query may run, in milliseconds; a request's `timeout_ms` may ask for
    /// less.
    #[arg(long, default_value_t = 30_000)]
    pub sql_timeout_ms: u64,
    /// Most bytes of JSON rows one `/api/sql` answer may hold; past it the answer is a 413.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub sql_max_result_bytes: usize,
    /// Memory for push bodies held at once, in MiB, server-wide: from the first byte read
    /// until the answer. A push that finds no room within 10 s gets 429.
    #[arg(long, default_value_t = 64)]
    pub push_memory_mb: usize,
}

/// Who may call the API (see `auth`).
#[derive(Debug, Clone, clap::Args)]
pub struct Access {
    /// How long a login's access token (JWT) is valid, in seconds; refresh it at
    /// `/api/auth/refresh`.
    #[arg(long, default_value_t = 600)]
    pub access_token_seconds: u64,
    /// Serve `/metrics` (Prometheus) without a token.
    #[arg(long)]
    pub open_metrics: bool,
}

/// What the page shows.
#[derive(Debug, Clone, clap::Args)]
pub struct Page {
    /// How often each stream's msg/s, lag and latency are sampled for the page's charts (an
    /// hour of samples is kept in memory), in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub history_sample_ms: u64,
    /// Events one client of a live feed gets a second at most; the rest are skipped and
    /// counted in a `skipped` event.
    #[arg(long, default_value_t = crate::feed::MAX_EVENTS_PER_SEC)]
    pub feed_max_events_per_sec: u32,
}

/// Run until SIGINT or SIGTERM.
pub async fn run(
    data_dir: PathBuf,
    listen: SocketAddr,
    config: Option<PathBuf>,
    limits: Limits,
    access: Access,
    page: Page,
) -> Result<(), String> {
    if limits.sql_timeout_ms == 0 || limits.sql_max_result_bytes == 0 {
        return Err("--sql-timeout-ms and --sql-max-result-bytes must be above 0".into());
    }
    if page.feed_max_events_per_sec == 0 {
        return Err("--feed-max-events-per-sec must be above 0".into());
    }
    if access.access_token_seconds == 0 {
        return Err("--access-token-seconds must be above 0".into());
    }
    // A bad config fails before anything is opened or created.
    let declared = match &config {
        Some(path) => Some(FileConfig::load(path)?),
        None => None,
    };
    let workspace = Workspace::open(&data_dir).map_err(|e| e.to_string())?;
    keys::init(workspace.push_key_pepper().map_err(|e| e.to_string())?);
    let settings = AuthSettings {
        access_token_lifetime: Duration::from_secs(access.access_token_seconds),
        open_metrics: access.open_metrics,
    };
    let auth = Auth::open(&workspace, settings).await.map_err(|e| e.to_string())?;
    crate::auth::setup::first_start(&auth, &data_dir).await.map_err(|e| e.to_string())?;
    let connections = Connections::load(workspace.registry().clone()).await.map_err(|e| e.to_string())?;
    if let Some(declared) = &declared {
        for connection in &declared.connections {
            let name = connection.name().to_string();
            // A secret left out of the file keeps the stored one, as the API's PUT does.
            let mut connection = connection.clone();
            if let Some(stored) = connections.get(&name) {
                connection.restore_secrets(&stored.secrets());
            }
            connections.save(connection).await.map_err(|e| format!("connections.{name}: {e}"))?;
        }
    }
    let supervisor = Supervisor::new(workspace.clone(), connections.clone());
    supervisor.start_stored().await.map_err(|e| e.to_string())?;
    let syncs = Syncs::new(workspace.registry().clone(), workspace.planner().clone(), connections)
        .with_activity(supervisor.feeds().activity().clone());
    syncs.load_stored().await.map_err(|e| e.to_string())?;
    if let Some(mut declared) = declared {
        for sync in std::mem::take(&mut declared.syncs) {
            let name = sync.name.clone();
            syncs.save_declared(sync).await.map_err(|e| format!("syncs.{name}: {e}"))?;
        }
        apply_declared(&supervisor, declared).await?;
    }
    let listener =
        tokio::net::TcpListener::bind(listen).await.map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!("Sluice is running.");
    println!("  workspace: {}", workspace.path().display());
    println!("  API:       http://{local}");
    tracing::info!(workspace = %workspace.path().display(), api = %local, "Sluice started.");
    let shutdown = CancellationToken::new();
    // A full disk: the workspace is reopened once there is room, and streams resume.
    tokio::spawn(workspace.clone().recover_storage(shutdown.clone().cancelled_owned()));
    tokio::spawn(crate::feed::watch(
        supervisor.clone(),
        supervisor.feeds().clone(),
        Duration::from_millis(page.history_sample_ms),
        shutdown.clone(),
    ));
    let sql = SqlLimits {
        timeout: Duration::from_millis(limits.sql_timeout_ms),
        max_result_bytes: limits.sql_max_result_bytes,
        shutdown: shutdown.clone(),
    };
    let push_budget = api::PushBudget::new(limits.push_memory_mb << 20);
    let query = workspace.sql().clone();
    let app = api::router(AppState {
        supervisor: supervisor.clone(),
        syncs: syncs.clone(),
        push_budget,
        sql,
        query,
        auth,
        feed_max_events_per_sec: page.feed_max_events_per_sec,
    });
    // On a signal, running queries are interrupted (their requests answer 503) so that the
    // graceful shutdown, which waits for requests in flight, ends promptly.
    let signal = async move {
        shutdown_signal().await;
        tracing::info!("Stopping: interrupting running queries.");
        shutdown.cancel();
    };
    crate::listener::serve(listener, app, signal).await;
    syncs.stop_all().await;
    supervisor.stop_all().await;
    tracing::info!("Sluice stopped.");
    Ok(())
}

/// Create or update the streams of a config file. A new stream without a `push_key` gets a
/// generated one, printed once it is saved.
async fn apply_declared(supervisor: &Supervisor, declared: FileConfig) -> Result<(), String> {
    let _changing = supervisor.lock_changes().await;
    for mut config in declared.streams {
        let name = config.name.clone();
        let given = config.push_key.take();
        let existing = supervisor.get(&name).await;
        // A stream paused through the API stays paused when the file declares it again.
        config.paused |= existing.as_ref().is_some_and(|e| e.config.paused);
        let (key_hash, generated) = match (&given, &existing) {
            (Some(key), _) => (keys::hash(key.expose()), None),
            (None, Some(running)) => (running.key_hash.clone(), None),
            (None, None) => {
                let key = keys::generate();
                (keys::hash(&key), Some(key))
            }
        };
        supervisor.save_and_start(config, key_hash).await.map_err(|e| match e {
            SaveError::TableTaken { table, owner } => {
                format!("streams.{name}.table: '{table}' is already written by stream '{owner}'")
            }
            SaveError::Failed(e) => e.to_string(),
        })?;
        if let Some(key) = generated {
            println!("  stream '{name}' push key (shown once): {key}");
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = terminate => {} }
}
