//! Push keys: generated once, shown once, stored as keyed hashes.
//!
//! A stored hash is `hmac-sha256:` and the hex HMAC-SHA-256 of the key under a pepper derived
//! from the secrets key (`SLUICE_SECRET_KEY` or `secret.key`, outside the database): the
//! database alone, copied or leaked, does not let anyone test guesses of a key. Hashes stored
//! before (plain hex SHA-256) are still accepted; a key declared again in the config file is
//! stored keyed.

use std::sync::OnceLock;

use rand::RngCore;
use sha2::{Digest, Sha256};
use sluice_connectors::workspace::keyed_hash;

/// The prefix of keyed hashes.
const KEYED: &str = "hmac-sha256:";

static PEPPER: OnceLock<[u8; 32]> = OnceLock::new();

/// Set the pepper once, at start (`sluice serve`), before any key is hashed or checked.
pub fn init(pepper: [u8; 32]) {
    let _ = PEPPER.set(pepper);
}

/// A new random push key.
pub fn generate() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    format!("sk_{}", hex::encode(bytes))
}

/// The stored form of a key: keyed once the pepper is set, plain SHA-256 before.
pub fn hash(key: &str) -> String {
    match PEPPER.get() {
        Some(pepper) => keyed(pepper, key),
        None => legacy(key),
    }
}

fn keyed(pepper: &[u8; 32], key: &str) -> String {
    format!("{KEYED}{}", hex::encode(keyed_hash(pepper, key.as_bytes())))
}

fn legacy(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A stored form no key matches (not hex), checked against when there is no stream, so that a
/// push to a name that does not exist takes the work a wrong key takes.
pub const NO_STREAM: &str = "hmac-sha256:no-stream-no-stream-no-stream-no-stream-no-stream-no-stream-nost";

/// Whether `key` matches `stored` (keyed or legacy), comparing in constant time.
pub fn verify(key: &str, stored: &str) -> bool {
    let given = if stored.starts_with(KEYED) {
        match PEPPER.get() {
            Some(pepper) => keyed(pepper, key),
            None => return false,
        }
    } else {
        legacy(key)
    };
    given.len() == stored.len() && given.bytes().zip(stored.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_and_legacy_hashes_both_verify() {
        init([7u8; 32]);
        let key = "sk_test_0123456789abcdef";
        let stored = hash(key);
        assert!(stored.starts_with(KEYED) && !stored.contains(&legacy(key)));
        assert!(verify(key, &stored) && !verify("sk_other", &stored));
        assert!(verify(key, &legacy(key)), "a hash stored before keyed hashes still verifies");
        assert!(!verify("sk_other", &legacy(key)));
    }
}
