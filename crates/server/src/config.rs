//! The YAML file given with `--config`: the same stream and sync types as the API.

use std::path::Path;

use serde::Deserialize;
use sluice_connectors::{StreamConfig, SyncConfig};

/// A config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Declared streams, created or updated at start.
    #[serde(default)]
    pub streams: Vec<StreamConfig>,
    /// Declared reverse ETL syncs, created or updated at start.
    #[serde(default)]
    pub syncs: Vec<SyncConfig>,
}

impl FileConfig {
    /// Read and validate a file; errors name the file and the field.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let config: FileConfig = serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut names = std::collections::HashSet::new();
        for (i, stream) in config.streams.iter().enumerate() {
            stream.validate().map_err(|e| format!("{}: streams[{i}].{e}", path.display()))?;
            if !names.insert(stream.name.clone()) {
                return Err(format!("{}: streams[{i}].name: '{}' is declared twice", path.display(), stream.name));
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, sync) in config.syncs.iter().enumerate() {
            sync.validate().map_err(|e| format!("{}: syncs[{i}].{e}", path.display()))?;
            if !names.insert(sync.name.clone()) {
                return Err(format!("{}: syncs[{i}].name: '{}' is declared twice", path.display(), sync.name));
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
