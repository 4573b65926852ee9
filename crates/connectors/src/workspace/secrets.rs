//! Stream secrets (passwords) in `secrets.json` beside the workspace, readable by its owner
//! only. They are kept out of the database so that no SQL, read-only or not, can see them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sluice_core::{Error, ErrorKind, Result};

/// Secrets by stream, then by field path.
pub(crate) type Secrets = BTreeMap<String, BTreeMap<String, String>>;

/// The secrets file, with a lock for read-modify-write.
pub(crate) struct SecretFile {
    path: PathBuf,
    lock: Mutex<()>,
}

impl SecretFile {
    pub(crate) fn new(dir: &Path) -> Self {
        Self { path: dir.join("secrets.json"), lock: Mutex::new(()) }
    }

    pub(crate) fn load(&self) -> Result<Secrets> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                Error::new(ErrorKind::Fatal, format!("{} is unreadable", self.path.display())).with_source(e)
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Secrets::new()),
            Err(e) => Err(Error::new(ErrorKind::Fatal, format!("cannot read {}", self.path.display())).with_source(e)),
        }
    }

    /// Replace one stream's secrets (an empty map removes the stream).
    pub(crate) fn set(&self, stream: &str, secrets: BTreeMap<String, String>) -> Result<()> {
        let _guard = self.lock.lock().map_err(|_| Error::new(ErrorKind::Fatal, "secrets lock poisoned"))?;
        let mut all = self.load()?;
        if secrets.is_empty() {
            if all.remove(stream).is_none() {
                return Ok(());
            }
        } else {
            all.insert(stream.to_string(), secrets);
        }
        let io = |e: std::io::Error| Error::new(ErrorKind::Fatal, "cannot write the secrets file").with_source(e);
        let tmp = self.path.with_extension("json.tmp");
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp).map_err(io)?;
        let bytes = serde_json::to_vec(&all).map_err(|e| Error::new(ErrorKind::Fatal, "secrets").with_source(e))?;
        file.write_all(&bytes).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)
    }
}
