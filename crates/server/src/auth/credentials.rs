//! The three kinds of credentials and how each is checked:
//!
//! - **passwords**, stored as argon2id PHC strings (`$argon2id$v=19$m=19456,t=2,p=1$…`, the
//!   crate's defaults, OWASP's minimum), checked off the async threads;
//! - **opaque tokens**: API tokens (`sluice_at_` + 64 hex digits) and refresh tokens
//!   (`sluice_rt_` + 64 hex), 256 random bits each, stored as `hmac-sha256:` + the hex HMAC
//!   under a key derived from `secret.key` (a fast hash is enough for that much entropy, and the
//!   key keeps a copied database from being checked offline);
//! - **access tokens**: HS256 JWTs `{sub, role, iat, exp}` signed with another derived key,
//!   checked without the database (the user's current role is looked up in memory).

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sluice_connectors::workspace::keyed_hash;

/// Prefix of API tokens.
pub const API_TOKEN_PREFIX: &str = "sluice_at_";
/// Prefix of refresh tokens.
pub const REFRESH_TOKEN_PREFIX: &str = "sluice_rt_";

/// The server's keys: one signs access tokens, one keys the hashes of opaque tokens.
#[derive(Clone)]
pub struct Keys {
    signing: EncodingKey,
    verifying: DecodingKey,
    token_pepper: [u8; 32],
}

/// What an access token says.
#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    /// The user's name.
    pub sub: String,
    /// The role when it was issued (the current one is what counts).
    pub role: String,
    /// Issued at (seconds since the epoch).
    pub iat: i64,
    /// Expires at.
    pub exp: i64,
}

impl Keys {
    /// Keys from two 32-byte secrets derived from `secret.key`.
    pub fn new(signing: [u8; 32], token_pepper: [u8; 32]) -> Self {
        Self {
            signing: EncodingKey::from_secret(&signing),
            verifying: DecodingKey::from_secret(&signing),
            token_pepper,
        }
    }

    /// The stored form of an opaque token.
    pub fn hash_token(&self, token: &str) -> String {
        format!("hmac-sha256:{}", hex::encode(keyed_hash(&self.token_pepper, token.as_bytes())))
    }

    /// A signed access token for `user` with `role`, valid for `seconds`.
    pub fn access_token(&self, user: &str, role: &str, seconds: u64) -> Result<String, jsonwebtoken::errors::Error> {
        let now = chrono::Utc::now().timestamp();
        let exp = now.saturating_add(i64::try_from(seconds).unwrap_or(i64::MAX));
        let claims = Claims { sub: user.to_string(), role: role.to_string(), iat: now, exp };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.signing)
    }

    /// The claims of an access token that is well signed and not expired (no leeway).
    pub fn verify_access(&self, token: &str) -> Option<Claims> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp", "sub"]);
        jsonwebtoken::decode::<Claims>(token, &self.verifying, &validation).ok().map(|data| data.claims)
    }
}

/// A new random opaque token with `prefix`.
pub fn generate(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

/// A new random id with `prefix` (not a secret).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{:016x}", rand::random::<u64>())
}

/// The argon2id hash of a password (blocking: about 20 ms optimized).
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    let salt = SaltString::encode_b64(&bytes)?;
    Ok(Argon2::default().hash_password(password.as_bytes(), &salt)?.to_string())
}

/// Whether `password` matches `stored`. With no stored hash (an unknown user, or one without
/// a password) a hash is still computed, so the answer takes as long either way.
pub fn verify_password(password: &str, stored: Option<&str>) -> bool {
    match stored.and_then(|s| PasswordHash::new(s).ok()) {
        Some(hash) => Argon2::default().verify_password(password.as_bytes(), &hash).is_ok(),
        None => {
            let _ = hash_password(password);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_tokens_and_access_tokens_verify_only_as_issued() {
        let stored = hash_password("correct horse").unwrap();
        assert!(stored.starts_with("$argon2id$") && !stored.contains("correct horse"));
        assert!(verify_password("correct horse", Some(&stored)));
        assert!(!verify_password("wrong", Some(&stored)) && !verify_password("correct horse", None));

        let keys = Keys::new([1; 32], [2; 32]);
        let token = generate(API_TOKEN_PREFIX);
        assert_eq!(token.len(), API_TOKEN_PREFIX.len() + 64);
        let hash = keys.hash_token(&token);
        assert!(hash.starts_with("hmac-sha256:") && !hash.contains(&token[API_TOKEN_PREFIX.len()..]));
        assert_ne!(hash, Keys::new([1; 32], [3; 32]).hash_token(&token), "keyed");

        let jwt = keys.access_token("ada", "viewer", 60).unwrap();
        let claims = keys.verify_access(&jwt).unwrap();
        assert_eq!((claims.sub.as_str(), claims.role.as_str()), ("ada", "viewer"));
        assert!(Keys::new([9; 32], [2; 32]).verify_access(&jwt).is_none(), "another key");
        let expired = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &Claims { sub: "ada".into(), role: "admin".into(), iat: 0, exp: chrono::Utc::now().timestamp() - 1 },
            &EncodingKey::from_secret(&[1; 32]),
        )
        .unwrap();
        assert!(keys.verify_access(&expired).is_none());
        let none_alg = format!("{}.", jwt.rsplit_once('.').unwrap().0.replace("HS256", "none"));
        assert!(keys.verify_access(&none_alg).is_none());
    }
}
