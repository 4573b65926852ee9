//! The YAML file given with `--config`: the same stream and sync types as the API.

use std::path::Path;

use serde::Deserialize;
use sluice_connectors::{ConnectionConfig, StreamConfig, SyncConfig};

/// A config file.
#[derive(Debug)]
pub struct FileConfig {
    /// Declared named connections, saved at start; the file's streams and syncs may name them.
    pub connections: Vec<ConnectionConfig>,
    /// Declared streams, created or updated at start.
    pub streams: Vec<StreamConfig>,
    /// Declared reverse ETL syncs, created or updated at start.
    pub syncs: Vec<SyncConfig>,
}

/// The file as written: streams and syncs are read into their types once the connections
/// they name have filled them in.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    connections: Vec<ConnectionConfig>,
    #[serde(default)]
    streams: Vec<serde_json::Value>,
    #[serde(default)]
    syncs: Vec<serde_json::Value>,
}

impl FileConfig {
    /// Read and validate a file; errors name the file and the field.
    pub fn load(path: &Path) -> Result<Self, String> {
        let at = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {at}: {e}"))?;
        let raw: RawFile = serde_yaml::from_str(&text).map_err(|e| format!("{at}: {e}"))?;
        let mut names = std::collections::HashSet::new();
        for (i, c) in raw.connections.iter().enumerate() {
            c.validate().map_err(|e| format!("{at}: connections[{i}].{e}"))?;
            if !names.insert(c.name().to_string()) {
                return Err(format!("{at}: connections[{i}].name: '{}' is declared twice", c.name()));
            }
        }
        let lookup = |name: &str| raw.connections.iter().find(|c| c.name() == name).cloned();
        let mut streams = Vec::new();
        for (i, mut value) in raw.streams.into_iter().enumerate() {
            sluice_connectors::fill_connections(&mut value, lookup).map_err(|e| format!("{at}: streams[{i}].{e}"))?;
            streams
                .push(serde_json::from_value::<StreamConfig>(value).map_err(|e| format!("{at}: streams[{i}]: {e}"))?);
        }
        let mut syncs = Vec::new();
        for (i, mut value) in raw.syncs.into_iter().enumerate() {
            sluice_connectors::fill_connections(&mut value, lookup).map_err(|e| format!("{at}: syncs[{i}].{e}"))?;
            syncs.push(serde_json::from_value::<SyncConfig>(value).map_err(|e| format!("{at}: syncs[{i}]: {e}"))?);
        }
        let config = FileConfig { connections: raw.connections, streams, syncs };
        let mut names = std::collections::HashSet::new();
        for (i, stream) in config.streams.iter().enumerate() {
            stream.validate().map_err(|e| format!("{at}: streams[{i}].{e}"))?;
            if !names.insert(stream.name.clone()) {
                return Err(format!("{at}: streams[{i}].name: '{}' is declared twice", stream.name));
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, sync) in config.syncs.iter().enumerate() {
            sync.validate().map_err(|e| format!("{at}: syncs[{i}].{e}"))?;
            if !names.insert(sync.name.clone()) {
                return Err(format!("{at}: syncs[{i}].name: '{}' is declared twice", sync.name));
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                FileConfig::load(&path).unwrap();
                seen += 1;
            }
        }
        assert!(seen >= 3, "examples found: {seen}");
    }
}
