//! Secrets (passwords, HTTP headers) in `secrets.json` beside the workspace, readable by its
//! owner only, each value encrypted with ChaCha20-Poly1305. The key comes from
//! `SLUICE_SECRET_KEY` (64 hex digits) or else from `secret.key` beside the file, created on first
//! use with mode 0600; keep that key elsewhere and `secrets.json` alone reveals nothing. They are
//! kept out of the database so that no SQL, read-only or not, can see them. The same key, through
//! [`keyed_hash`], keys the stored hashes of push keys.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sha2::{Digest, Sha256};
use sluice_core::{Error, ErrorKind, Result};

/// Encrypted values start with this; older plain values are still read.
const SEALED: &str = "enc1:";

/// Secrets by stream, then by field path.
pub(crate) type Secrets = BTreeMap<String, BTreeMap<String, String>>;

/// The secrets file, with a lock for read-modify-write.
pub(crate) struct SecretFile {
    path: PathBuf,
    key_path: PathBuf,
    lock: Mutex<()>,
}

impl SecretFile {
    pub(crate) fn new(dir: &Path) -> Self {
        Self { path: dir.join("secrets.json"), key_path: dir.join("secret.key"), lock: Mutex::new(()) }
    }

    pub(crate) fn load(&self) -> Result<Secrets> {
        match std::fs::read(&self.path) {
            Ok(bytes) => {
                let sealed: Secrets = serde_json::from_slice(&bytes).map_err(|e| {
                    Error::new(ErrorKind::Fatal, format!("{} is unreadable", self.path.display())).with_source(e)
                })?;
                let cipher = self.cipher()?;
                let mut all = Secrets::new();
                for (owner, fields) in sealed {
                    let mut open = BTreeMap::new();
                    for (field, value) in fields {
                        open.insert(field, unseal(&cipher, &value)?);
                    }
                    all.insert(owner, open);
                }
                Ok(all)
            }
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
        let cipher = self.cipher()?;
        let mut sealed = Secrets::new();
        for (owner, fields) in all {
            let fields = fields.into_iter().map(|(f, v)| seal(&cipher, &v).map(|v| (f, v))).collect::<Result<_>>()?;
            sealed.insert(owner, fields);
        }
        let bytes = serde_json::to_vec(&sealed).map_err(|e| Error::new(ErrorKind::Fatal, "secrets").with_source(e))?;
        file.write_all(&bytes).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)
    }
}

impl SecretFile {
    /// The cipher, from `SLUICE_SECRET_KEY` or the key file (created when missing).
    fn cipher(&self) -> Result<ChaCha20Poly1305> {
        Ok(ChaCha20Poly1305::new(Key::from_slice(&self.key()?)))
    }

    /// A 32-byte key for `purpose`, derived from the secret key (which never leaves this file).
    pub(crate) fn derive(&self, purpose: &str) -> Result<[u8; 32]> {
        Ok(keyed_hash(&self.key()?, purpose.as_bytes()))
    }

    /// The secret key, from `SLUICE_SECRET_KEY` or the key file (created when missing).
    fn key(&self) -> Result<[u8; 32]> {
        let bad = |what: &str| Error::new(ErrorKind::Config, format!("{what} must be 64 hex digits (a 32-byte key)"));
        let hex_key = match std::env::var("SLUICE_SECRET_KEY") {
            Ok(key) => key,
            Err(_) => match std::fs::read_to_string(&self.key_path) {
                Ok(key) => key,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let key = hex::encode(ChaCha20Poly1305::generate_key(&mut OsRng));
                    write_private(&self.key_path, key.as_bytes())?;
                    key
                }
                Err(e) => {
                    return Err(
                        Error::new(ErrorKind::Fatal, format!("cannot read {}", self.key_path.display())).with_source(e)
                    );
                }
            },
        };
        let bytes = hex::decode(hex_key.trim()).map_err(|_| bad("the secret key"))?;
        bytes.try_into().map_err(|_| bad("the secret key"))
    }
}

/// HMAC-SHA-256 (RFC 2104) of `message` under `key`.
pub fn keyed_hash(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner_pad: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
    let outer_pad: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new().chain_update(&inner_pad).chain_update(message).finalize();
    Sha256::new().chain_update(&outer_pad).chain_update(inner).finalize().into()
}

fn seal(cipher: &ChaCha20Poly1305, value: &str) -> Result<String> {
    let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
    let sealed = cipher
        .encrypt(&nonce, value.as_bytes())
        .map_err(|_| Error::new(ErrorKind::Fatal, "cannot encrypt a secret"))?;
    let mut out = nonce.to_vec();
    out.extend(sealed);
    Ok(format!("{SEALED}{}", hex::encode(out)))
}

fn unseal(cipher: &ChaCha20Poly1305, value: &str) -> Result<String> {
    let Some(hex_text) = value.strip_prefix(SEALED) else { return Ok(value.to_string()) };
    let wrong = || {
        Error::new(
            ErrorKind::Config,
            "a stored secret cannot be decrypted: SLUICE_SECRET_KEY or secret.key is not the key it was saved with",
        )
    };
    let bytes = hex::decode(hex_text).map_err(|_| wrong())?;
    if bytes.len() < 12 {
        return Err(wrong());
    }
    let (nonce, sealed) = bytes.split_at(12);
    let plain = cipher.decrypt(Nonce::from_slice(nonce), sealed).map_err(|_| wrong())?;
    String::from_utf8(plain).map_err(|_| wrong())
}

/// Write a file only its owner can read.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let io =
        |e: std::io::Error| Error::new(ErrorKind::Fatal, format!("cannot write {}", path.display())).with_source(e);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    #[test]
    fn keyed_hash_is_hmac_sha256() {
        // RFC 4231, test case 2.
        let mac = super::keyed_hash(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex::encode(mac), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }
}
