//! Named connections, as the server holds them: loaded from the registry at start, kept in
//! memory for filling in stream and sync configs (`sluice_connectors::fill_connections`), and
//! saved back with their secrets apart.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;
use sluice_connectors::ConnectionConfig;
use sluice_connectors::workspace::{Registry, StoredConnection};
use sluice_core::{Error, ErrorKind, Result};

/// Every named connection. Cheap to clone.
#[derive(Clone)]
pub struct Connections {
    registry: Registry,
    all: Arc<RwLock<BTreeMap<String, ConnectionConfig>>>,
}

impl Connections {
    /// The stored connections.
    pub async fn load(registry: Registry) -> Result<Self> {
        let mut all = BTreeMap::new();
        for stored in registry.connections().await? {
            let mut config: ConnectionConfig = serde_json::from_value(stored.config).map_err(|e| {
                Error::new(ErrorKind::Config, format!("stored connection '{}' is unreadable", stored.name))
                    .with_source(e)
            })?;
            config.restore_secrets(&stored.secrets);
            all.insert(stored.name, config);
        }
        Ok(Self { registry, all: Arc::new(RwLock::new(all)) })
    }

    /// A connection by name.
    pub fn get(&self, name: &str) -> Option<ConnectionConfig> {
        self.all.read().ok()?.get(name).cloned()
    }

    /// Every connection, by name.
    pub fn list(&self) -> Vec<ConnectionConfig> {
        self.all.read().map(|all| all.values().cloned().collect()).unwrap_or_default()
    }

    /// Store a new or changed connection; the previous one of that name, if any.
    pub async fn save(&self, config: ConnectionConfig) -> Result<Option<ConnectionConfig>> {
        config.validate()?;
        let stored = serde_json::to_value(&config)
            .map_err(|e| Error::new(ErrorKind::Fatal, "cannot serialize a connection").with_source(e))?;
        let name = config.name().to_string();
        let record = StoredConnection { name: name.clone(), config: stored, secrets: config.secrets() };
        self.registry.save_connection(record).await?;
        Ok(self.all.write().map_err(|_| poisoned())?.insert(name, config))
    }

    /// Forget a connection.
    pub async fn remove(&self, name: &str) -> Result<bool> {
        if self.get(name).is_none() {
            return Ok(false);
        }
        self.registry.delete_connection(name).await?;
        self.all.write().map_err(|_| poisoned())?.remove(name);
        Ok(true)
    }

    /// Fill in what the connections `config` names give (a stream's or sync's JSON).
    pub fn fill(&self, config: &mut Value) -> Result<()> {
        sluice_connectors::fill_connections(config, |name| self.get(name))
    }

    /// Take back out of a serialized config and its secrets what its connections gave.
    pub fn strip(&self, config: &mut Value, secrets: &mut BTreeMap<String, String>) {
        sluice_connectors::strip_connections(config, secrets, |name| self.get(name));
    }

    /// A config (with its secrets) filled from `old` instead, filled again from the current
    /// connections: after a connection changed.
    pub fn refill(
        &self,
        config: &mut Value,
        secrets: &mut BTreeMap<String, String>,
        name: &str,
        old: &ConnectionConfig,
    ) -> Result<()> {
        sluice_connectors::strip_connections(
            config,
            secrets,
            |n| {
                if n == name { Some(old.clone()) } else { self.get(n) }
            },
        );
        self.fill(config)
    }
}

fn poisoned() -> Error {
    Error::new(ErrorKind::Fatal, "the connections lock is poisoned")
}
