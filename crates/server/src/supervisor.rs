//! Runs every stream: builds its source, restores its checkpoint and schema, runs the core loop,
//! and restarts it with backoff after a failure.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_connectors::DeliverySink;
use sluice_connectors::transform;
use sluice_connectors::workspace::{StoredStream, Workspace, WorkspaceState};
use sluice_connectors::{SourceContext, SourceHandle, StreamConfig, build_source};
use sluice_core::pipeline::{self, Stream};
use sluice_core::{Decoder, Error, ErrorKind, Result, StreamMetrics};

use crate::connections::Connections;
use tokio::sync::RwLock;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running stream as the API sees it.
pub struct RunningStream {
    /// Its config (secrets removed).
    pub config: StreamConfig,
    /// The push key's hash.
    pub key_hash: String,
    /// The way into its source, for push streams.
    pub handle: SourceHandle,
    /// Live metrics.
    pub metrics: Arc<StreamMetrics>,
    cancel: CancellationToken,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl RunningStream {
    async fn stop(&self) {
        self.cancel.cancel();
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
        if !self.config.paused {
            self.metrics.set_state("stopped", None);
        }
    }
}

/// All streams of this server.
#[derive(Clone)]
pub struct Supervisor {
    workspace: Workspace,
    streams: Arc<RwLock<HashMap<String, Arc<RunningStream>>>>,
    /// Streams being restarted with a new config: absent from `streams` for a moment, but not
    /// gone. Always locked before `streams` when both are held.
    /// Streams in the middle of a restart, with the hash of their push key (when it had one).
    restarting: Arc<RwLock<HashMap<String, Option<String>>>>,
    /// Serializes changes to the set of streams (create, patch, delete, resnapshot), so checks
    /// such as "the name is free" and "the table has no other writer" hold until the change.
    changes: Arc<tokio::sync::Mutex<()>>,
    /// The live feeds each stream's committed units go to (`crate::feed`).
    feeds: crate::feed::Feeds,
    /// Named connections, filled into configs as they come in and taken out as they are stored.
    connections: Connections,
}

/// Why [`Supervisor::save_and_start`] did not save a stream.
#[derive(Debug)]
pub enum SaveError {
    /// Another stream already writes the table in the same place: a table has one writer.
    TableTaken {
        /// The table.
        table: String,
        /// The stream that writes it.
        owner: String,
    },
    /// The config could not start, or could not be stored.
    Failed(Error),
}

impl From<Error> for SaveError {
    fn from(e: Error) -> Self {
        Self::Failed(e)
    }
}

impl std::fmt::Display for SaveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TableTaken { table, owner } => write!(f, "table '{table}' is already written by stream '{owner}'"),
            Self::Failed(e) => e.fmt(f),
        }
    }
}

/// What a name stands for right now.
pub enum Lookup {
    /// A running stream.
    Running(Arc<RunningStream>),
    /// A stream in the middle of a restart: try again in a moment. Its push key's hash, so a
    /// push is told 503 only once its key is checked.
    Restarting(Option<String>),
    /// No such stream.
    Missing,
}

impl Supervisor {
    /// A supervisor over `workspace`, with no stream started yet.
    pub fn new(workspace: Workspace, connections: Connections) -> Self {
        Self {
            workspace,
            streams: Arc::default(),
            restarting: Arc::default(),
            changes: Arc::default(),
            feeds: crate::feed::Feeds::default(),
            connections,
        }
    }

    /// The named connections.
    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    /// The live feeds: streams' committed rows, activity, metrics history.
    pub fn feeds(&self) -> &crate::feed::Feeds {
        &self.feeds
    }

    /// Hold this while checking and changing the set of streams.
    pub async fn lock_changes(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.changes.clone().lock_owned().await
    }

    /// A stream by name, telling a restart apart from a stream that does not exist.
    pub async fn lookup(&self, name: &str) -> Lookup {
        let restarting = self.restarting.read().await;
        let streams = self.streams.read().await;
        match streams.get(name) {
            Some(stream) => Lookup::Running(stream.clone()),
            None => match restarting.get(name) {
                Some(key_hash) => Lookup::Restarting(key_hash.clone()),
                None => Lookup::Missing,
            },
        }
    }

    /// Mark `name` restarting, remembering its push key's hash: `key_hash`, or the running one's.
    async fn mark_restarting(&self, name: &str, key_hash: Option<String>) {
        let key_hash = match key_hash {
            Some(hash) => Some(hash),
            None => self.streams.read().await.get(name).map(|s| s.key_hash.clone()),
        };
        self.restarting.write().await.insert(name.to_string(), key_hash);
    }

    /// The workspace.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// Start every stored stream.
    pub async fn start_stored(&self) -> Result<()> {
        for mut stored in self.workspace.registry().streams().await? {
            // A connection that is gone keeps its stream from starting, not the server.
            if let Err(e) = self.connections.fill(&mut stored.config) {
                tracing::error!(stream = %stored.name, error = %e, "Stored stream did not start.");
                continue;
            }
            let mut config: StreamConfig = match serde_json::from_value(stored.config) {
                Ok(config) => config,
                Err(e) => {
                    tracing::error!(stream = %stored.name, error = %e, "Stored stream is unreadable; it did not start.");
                    continue;
                }
            };
            config.restore_secrets(&stored.secrets);
            // One stream that cannot start (a TLS file gone, say) does not keep the rest down.
            if let Err(e) = self.start(config, stored.key_hash).await {
                tracing::error!(stream = %stored.name, error = %e, "Stored stream did not start.");
            }
        }
        Ok(())
    }

    /// A running stream by name.
    pub async fn get(&self, name: &str) -> Option<Arc<RunningStream>> {
        self.streams.read().await.get(name).cloned()
    }

    /// All running streams, by name.
    pub async fn list(&self) -> Vec<Arc<RunningStream>> {
        let mut all: Vec<_> = self.streams.read().await.values().cloned().collect();
        all.sort_by(|a, b| a.config.name.cmp(&b.config.name));
        all
    }

    /// Another stream that already writes `config`'s table in the same place (the workspace,
    /// or the same destination), if any.
    async fn table_owner(&self, config: &StreamConfig) -> Option<String> {
        let streams = self.streams.read().await;
        streams
            .values()
            .find(|s| {
                s.config.name != config.name
                    && s.config.table.eq_ignore_ascii_case(&config.table)
                    && s.config.destination == config.destination
            })
            .map(|s| s.config.name.clone())
    }

    /// (Re)start a stream and store it, the one way a new or changed config comes in (the API
    /// and the config file). A table has one writer: a config whose table another stream
    /// writes is refused. If the new config cannot start, the old one (if any) runs again and
    /// nothing is stored. Call it holding [`Self::lock_changes`].
    pub async fn save_and_start(&self, config: StreamConfig, key_hash: String) -> Result<(), SaveError> {
        if let Some(owner) = self.table_owner(&config).await {
            return Err(SaveError::TableTaken { table: config.table.clone(), owner });
        }
        let name = config.name.clone();
        self.mark_restarting(&name, Some(key_hash.clone())).await;
        let result = self.restart(config, key_hash).await;
        self.restarting.write().await.remove(&name);
        Ok(result?)
    }

    /// Stop the old run of a stream (if any) and start the new config, or the old one again.
    async fn restart(&self, config: StreamConfig, key_hash: String) -> Result<()> {
        let config = with_detected_keys(config).await?;
        let mut stored = serde_json::to_value(&config)
            .map_err(|e| Error::new(ErrorKind::Fatal, "cannot serialize config").with_source(e))?;
        // What named connections gave is not stored with the stream: it is filled in again
        // from them at each start, so a changed connection reaches the stream.
        let mut secrets = config.secrets();
        self.connections.strip(&mut stored, &mut secrets);
        let previous = self.stop(&config.name).await;
        if let Err(e) = self.start(config.clone(), key_hash.clone()).await {
            if let Some(old) = previous {
                let _ = self.start(old.config.clone(), old.key_hash.clone()).await;
            }
            return Err(e);
        }
        let record = StoredStream { name: config.name.clone(), config: stored, key_hash, secrets };
        if let Err(e) = self.workspace.registry().save_stream(record).await {
            self.stop(&config.name).await;
            return Err(e);
        }
        Ok(())
    }

    /// Stop a stream and forget it; its table stays unless `drop_table`.
    pub async fn remove(&self, name: &str, drop_table: bool) -> Result<bool> {
        let Some(stream) = self.stop(name).await else { return Ok(false) };
        if let Err(e) = sluice_connectors::release_source(&stream.config.source, name).await {
            tracing::warn!(stream = name, error = %e, "Could not release the source's resources.");
        }
        if let Some(destination) = &stream.config.destination
            && let Err(e) = DeliverySink::forget(&stream.config, destination, &self.workspace).await
        {
            tracing::warn!(stream = name, error = %e, "The destination keeps the stream's position; a new stream of this name would resume from it.");
        }
        let table = drop_table.then(|| stream.config.table.clone());
        self.workspace.registry().delete_stream(name, table).await?;
        Ok(true)
    }

    /// Start `name` over from its source: release what it holds there (a Postgres slot), forget
    /// its position, and start it again (a Postgres stream then copies its tables again).
    pub async fn resnapshot(&self, name: &str) -> Result<bool> {
        self.mark_restarting(name, None).await;
        let result = self.start_over(name).await;
        self.restarting.write().await.remove(name);
        result
    }

    async fn start_over(&self, name: &str) -> Result<bool> {
        let Some(stream) = self.stop(name).await else { return Ok(false) };
        if let Err(e) = sluice_connectors::release_source(&stream.config.source, name).await {
            tracing::warn!(stream = name, error = %e, "Could not release the source's resources.");
        }
        // A destination keeps its own copy of the position: it forgets it too, or the stream
        // would resume from it instead of starting over.
        let forgotten = match &stream.config.destination {
            Some(destination) => DeliverySink::forget(&stream.config, destination, &self.workspace).await,
            None => Ok(()),
        };
        if let Err(e) = forgotten {
            self.start(stream.config.clone(), stream.key_hash.clone()).await?;
            return Err(e);
        }
        self.workspace.state().reset_position(name).await?;
        self.start(stream.config.clone(), stream.key_hash.clone()).await?;
        Ok(true)
    }

    /// Stop `name`, run `change` while nothing of it runs (it gets the config and returns the
    /// config to start again with, and what to answer), then start it again. If `change` fails,
    /// the stream starts again as it was. `None` when there is no such stream.
    pub async fn while_stopped<F, Fut, T>(&self, name: &str, change: F) -> Result<Option<T>>
    where
        F: FnOnce(StreamConfig) -> Fut,
        Fut: std::future::Future<Output = Result<(StreamConfig, T)>>,
    {
        self.mark_restarting(name, None).await;
        let result = async {
            let Some(stream) = self.stop(name).await else { return Ok(None) };
            match change(stream.config.clone()).await {
                Ok((config, answer)) => {
                    let same = serde_json::to_value(&config).ok() == serde_json::to_value(&stream.config).ok();
                    let started = if same {
                        self.start(config, stream.key_hash.clone()).await
                    } else {
                        self.restart(config, stream.key_hash.clone()).await
                    };
                    if let Err(e) = started {
                        self.start(stream.config.clone(), stream.key_hash.clone()).await?;
                        return Err(e);
                    }
                    Ok(Some(answer))
                }
                Err(e) => {
                    self.start(stream.config.clone(), stream.key_hash.clone()).await?;
                    Err(e)
                }
            }
        }
        .await;
        self.restarting.write().await.remove(name);
        result
    }

    /// Stop every stream (shutdown).
    pub async fn stop_all(&self) {
        let names: Vec<String> = self.streams.read().await.keys().cloned().collect();
        for name in names {
            self.stop(&name).await;
        }
    }

    async fn stop(&self, name: &str) -> Option<Arc<RunningStream>> {
        let stream = self.streams.write().await.remove(name)?;
        stream.stop().await;
        Some(stream)
    }

    async fn start(&self, config: StreamConfig, key_hash: String) -> Result<()> {
        config.validate()?;
        // A stream with a destination starts from the workspace's copy of its checkpoint and,
        // once the destination answers, moves to the one the destination holds (`supervise`):
        // a destination that is down must not keep the server from starting.
        let (checkpoint, decoder) = reload(self.workspace.state(), None, &config).await?;
        let metrics = Arc::new(StreamMetrics::new(&checkpoint.totals));
        if config.paused {
            // Listed, with its figures, but nothing of it runs: no source, no destination.
            metrics.set_state("paused", None);
            let paused = RunningStream {
                config: config.clone(),
                key_hash,
                handle: SourceHandle::None,
                metrics,
                cancel: CancellationToken::new(),
                task: tokio::sync::Mutex::new(None),
            };
            self.streams.write().await.insert(config.name.clone(), Arc::new(paused));
            tracing::info!(stream = %config.name, "Stream paused.");
            return Ok(());
        }
        let ctx = SourceContext { stream: &config.name, position: &checkpoint.position, metrics: metrics.clone() };
        let (source, handle) = build_source(&config.source, ctx)?;
        // A push stream's bodies are decoded on the requests' tasks against its schemas.
        let edge = match &handle {
            SourceHandle::Push(push) => Some(push.edge.clone()),
            _ => None,
        };
        let decoder = decoder.with_edge(edge.clone());
        let delivery = match &config.destination {
            Some(destination) => {
                let sink = DeliverySink::new(&config, destination, self.workspace.clone(), metrics.clone())?;
                Some(Arc::new(match &handle {
                    SourceHandle::Push(push) => sink.with_push_keys(push.keys.clone()),
                    _ => sink,
                }))
            }
            None => None,
        };
        if let SourceHandle::Push(push) = &handle {
            // A destination that answers at once hands back the push keys a crash kept from
            // the workspace before the route takes pushes; one that is down does it on resume.
            if let Some(delivery) = &delivery
                && let Err(e) = tokio::time::timeout(Duration::from_secs(5), delivery.checkpoint())
                    .await
                    .unwrap_or_else(|_| Err(Error::new(ErrorKind::Connect, "no answer in 5 s")))
            {
                tracing::warn!(stream = %config.name, error = %e, "The destination's position is not known yet.");
            }
            let window = push.keys.window().as_secs();
            push.keys.load(self.workspace.state().push_keys(&config.name, window, push.keys.limit()).await?);
        }
        let cancel = CancellationToken::new();
        // Every unit the stream commits goes to its live feed; a destination stream's schema
        // changes are recorded in the workspace's history after the destination applied them.
        let sink: Arc<dyn sluice_core::Sink> = match &delivery {
            Some(d) => d.clone(),
            None => Arc::new(self.workspace.sink().clone()),
        };
        let history = delivery.is_some().then(|| self.workspace.schema_history());
        let sink = crate::feed::FeedSink::wrap(sink, &config.name, &self.feeds, history);
        let task = tokio::spawn(supervise(
            config.clone(),
            source,
            (decoder, edge),
            (sink, self.workspace.state().clone(), delivery),
            checkpoint,
            metrics.clone(),
            cancel.clone(),
        ));
        let running = RunningStream {
            config: config.clone(),
            key_hash,
            handle,
            metrics,
            cancel,
            task: tokio::sync::Mutex::new(Some(task)),
        };
        self.streams.write().await.insert(config.name.clone(), Arc::new(running));
        tracing::info!(stream = %config.name, table = %config.table, "Stream started.");
        Ok(())
    }
}

/// A run that lasted this long before failing counts as healthy: the backoff starts over.
const HEALTHY_RUN: Duration = Duration::from_secs(10);

/// Run the loop; after a failure wait with backoff, reload the checkpoint and run again.
async fn supervise(
    config: StreamConfig,
    mut source: Box<dyn sluice_core::Source>,
    (mut decoder, edge): (Decoder, Option<Arc<sluice_core::decode::Edge>>),
    (sink, state, delivery): (Arc<dyn sluice_core::Sink>, WorkspaceState, Option<Arc<DeliverySink>>),
    mut checkpoint: sluice_core::Checkpoint,
    metrics: Arc<StreamMetrics>,
    cancel: CancellationToken,
) {
    const FIRST_BACKOFF: Duration = Duration::from_millis(200);
    let mut backoff = FIRST_BACKOFF;
    if let Some(delivery) = delivery.as_deref() {
        loop {
            let resumed = match reload(&state, Some(delivery), &config).await {
                Ok((cp, d)) => source.rewind(&cp.position).await.map(|()| (cp, d)),
                Err(e) => Err(e),
            };
            match resumed {
                Ok((cp, d)) => {
                    (checkpoint, decoder) = (cp, d.with_edge(edge.clone()));
                    break;
                }
                Err(e) => {
                    tracing::warn!(stream = %config.name, error = %e, "Waiting for the destination.");
                    metrics.set_state("reconnecting", Some(format!("destination: {e}")));
                }
            }
            if !pause(&cancel, &mut backoff).await {
                source.close().await;
                return;
            }
        }
        backoff = FIRST_BACKOFF;
    }
    loop {
        let started = std::time::Instant::now();
        let stream = Stream {
            name: &config.name,
            source: source.as_mut(),
            decoder: &mut decoder,
            sink: sink.clone(),
            flush: &config.flush,
            metrics: metrics.clone(),
            cancel: cancel.clone(),
        };
        match pipeline::run(stream, checkpoint.clone()).await {
            Ok(_) => {
                source.close().await;
                if let Some(delivery) = &delivery {
                    delivery.finish().await;
                }
                return;
            }
            Err(e) => {
                // A run that went well for a while starts the backoff over: a failure now and
                // then must not leave the stream waiting 30 s after each one.
                if started.elapsed() >= HEALTHY_RUN {
                    backoff = FIRST_BACKOFF;
                }
                if e.kind() == ErrorKind::Storage && delivery.is_none() {
                    tracing::warn!(stream = %config.name, error = %e, "The disk is full; waiting for room.");
                    metrics.set_state("disk_full", Some(e.message().to_string()));
                    if !wait_for_room(&state, source.as_mut(), &e, &cancel).await {
                        source.close().await;
                        return;
                    }
                    backoff = FIRST_BACKOFF;
                } else {
                    tracing::error!(stream = %config.name, error = %e, "Stream failed; restarting.");
                    metrics.set_state("failed", Some(e.to_string()));
                }
                // Resume from what is durable, with the table as it is now: never from the
                // checkpoint and decoder of the run that failed (its schema changes may not be
                // stored), so a reload that fails is tried again.
                loop {
                    if !pause(&cancel, &mut backoff).await {
                        source.close().await;
                        return;
                    }
                    match reload(&state, delivery.as_deref(), &config).await {
                        Ok((cp, d)) => match source.rewind(&cp.position).await {
                            Ok(()) => {
                                checkpoint = cp;
                                decoder = d.with_edge(edge.clone());
                                break;
                            }
                            Err(e) => tracing::error!(stream = %config.name, error = %e, "Rewind failed."),
                        },
                        Err(e) => tracing::error!(stream = %config.name, error = %e, "Reload failed."),
                    }
                }
            }
        }
    }
}

/// A JSON mirror into a destination without `keys` takes the destination table's primary key
/// (or narrowest unique index); the keys are then stored with the config. A table that does
/// not exist or has neither is refused, saying what to do.
async fn with_detected_keys(mut config: StreamConfig) -> Result<StreamConfig> {
    let Some(destination) = config.destination.as_ref().filter(|_| config.detects_keys()) else { return Ok(config) };
    let refuse = |why: String| Error::new(ErrorKind::Config, format!("keys: {why}; set `keys` on the stream"));
    if config.table.contains(['*', '[']) {
        return Err(refuse(format!("the table name '{}' is a template, so no one table's key applies", config.table)));
    }
    match sluice_connectors::build_destination(destination)?.keys(&config.table).await? {
        None => Err(refuse(format!(
            "the destination table '{}' does not exist (or this kind cannot tell its key), so its key cannot be read",
            config.table
        ))),
        Some(keys) if keys.is_empty() => Err(refuse(format!(
            "the destination table '{}' has no primary key or unique index to match rows on",
            config.table
        ))),
        Some(keys) => {
            tracing::info!(stream = %config.name, keys = ?keys, "Keys taken from the destination table.");
            config.keys = keys;
            Ok(config)
        }
    }
}

/// Wait until the workspace stores again, answering pushes that arrive meanwhile with the
/// full disk (a push source's `abort`); false when the stream is cancelled meanwhile.
async fn wait_for_room(
    state: &WorkspaceState,
    source: &mut dyn sluice_core::Source,
    error: &Error,
    cancel: &CancellationToken,
) -> bool {
    let mut storage = state.watch_storage();
    while storage.borrow_and_update().is_some() {
        source.abort(error).await;
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = storage.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
    true
}

/// Wait `backoff` and double it (up to 30 s); false when the stream is cancelled meanwhile.
async fn pause(cancel: &CancellationToken, backoff: &mut Duration) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => return false,
        _ = tokio::time::sleep(*backoff) => {}
    }
    *backoff = (*backoff * 2).min(Duration::from_secs(30));
    true
}

/// The checkpoint to resume from and a decoder that knows the tables as they are. A stream
/// with a destination resumes from the position the destination holds; its tables are not in
/// the workspace, and the destination adds the columns it lacks itself.
pub(crate) async fn reload(
    state: &WorkspaceState,
    delivery: Option<&DeliverySink>,
    config: &StreamConfig,
) -> Result<(sluice_core::Checkpoint, Decoder)> {
    let changes = config.changes();
    if let Some(delivery) = delivery {
        let checkpoint = delivery.checkpoint().await?.unwrap_or_default();
        // A table the stream names outright starts from the destination's columns, so a value
        // that does not fit them goes to the ledger rather than failing the write.
        let mut schemas = HashMap::new();
        let template =
            config.destination.as_ref().map_or_else(|| config.table.clone(), |d| d.table_template(&config.table));
        if !template.contains(['*', '['])
            && let Some(schema) = delivery.table_schema(&template).await?
        {
            schemas.insert(template.clone(), schema);
        }
        let decoder = Decoder::new(template, config.metadata.clone(), schemas)
            .with_changes(changes)
            .with_transform(transform::build(config.transform.as_ref())?);
        return Ok((checkpoint, decoder));
    }
    // A routed stream's tables are the route's, whatever its `table` says.
    let tables = match config.transform.as_ref().and_then(|t| t.route.as_deref()) {
        Some(route) => sluice_core::transform::Route::pattern(route),
        None => config.table.clone(),
    };
    let resume = state.resume(&config.name, &tables).await?;
    let decoder = Decoder::new(config.table.clone(), config.metadata.clone(), resume.schemas)
        .with_changes(changes)
        .with_transform(transform::build(config.transform.as_ref())?);
    Ok((resume.checkpoint, decoder))
}
