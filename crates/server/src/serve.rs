//! `sluice serve`: open the workspace, start the streams, serve the API until a signal.

use std::net::SocketAddr;
use std::path::PathBuf;

use sluice_connectors::workspace::Workspace;

use crate::api::{self, AppState};
use crate::config::FileConfig;
use crate::keys;
use crate::supervisor::Supervisor;
use crate::syncs::Syncs;

/// Run until SIGINT or SIGTERM.
pub async fn run(
    data_dir: PathBuf,
    listen: SocketAddr,
    config: Option<PathBuf>,
    push_memory: usize,
) -> Result<(), String> {
    // A bad config fails before anything is opened or created.
    let declared = match &config {
        Some(path) => Some(FileConfig::load(path)?),
        None => None,
    };
    let workspace = Workspace::open(&data_dir).map_err(|e| e.to_string())?;
    let supervisor = Supervisor::new(workspace.clone());
    supervisor.start_stored().await.map_err(|e| e.to_string())?;
    let syncs = Syncs::new(workspace.clone());
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
    let push_budget = api::PushBudget::new(push_memory);
    let app = api::router(AppState { supervisor: supervisor.clone(), syncs: syncs.clone(), push_budget });
    crate::listener::serve(listener, app, shutdown_signal()).await;
    syncs.stop_all().await;
    supervisor.stop_all().await;
    tracing::info!("Sluice stopped.");
    Ok(())
}

/// Create or update the streams of a config file. A new stream without a `push_key` gets a
/// generated one, printed once.
async fn apply_declared(supervisor: &Supervisor, declared: FileConfig) -> Result<(), String> {
    let _changing = supervisor.lock_changes().await;
    for mut config in declared.streams {
        if let Some(owner) = supervisor.table_owner(&config.table, &config.name).await {
            return Err(format!(
                "streams.{}.table: '{}' is already written by stream '{owner}'",
                config.name, config.table
            ));
        }
        let given = config.push_key.take();
        let existing = supervisor.get(&config.name).await;
        let key_hash = match (&given, &existing) {
            (Some(key), _) => keys::hash(key.expose()),
            (None, Some(running)) => running.key_hash.clone(),
            (None, None) => {
                let key = keys::generate();
                println!("  stream '{}' push key (shown once): {key}", config.name);
                keys::hash(&key)
            }
        };
        supervisor.save_and_start(config, key_hash).await.map_err(|e| e.to_string())?;
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
