//! Push keys: generated once, shown once, stored as SHA-256 hashes.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// A new random push key.
pub fn generate() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    format!("sk_{}", hex::encode(bytes))
}

/// The stored form of a key.
pub fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Whether `key` matches `stored`, comparing hashes in constant time.
pub fn verify(key: &str, stored: &str) -> bool {
    let given = hash(key);
    given.len() == stored.len() && given.bytes().zip(stored.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}
