//! Key-pair login: a JWT signed with the user's RSA private key (RS256), as Snowflake's drivers
//! send it (`AUTHENTICATOR: SNOWFLAKE_JWT`). The issuer names the public key by its fingerprint,
//! `SHA256:` and the base64 SHA-256 of its SubjectPublicKeyInfo DER: the value Snowflake shows as
//! `RSA_PUBLIC_KEY_FP` for the user. Signed with ring (already here for rustls).

use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{KeyPair as _, RSA_PKCS1_SHA256, RsaKeyPair};
use serde_json::json;
use sluice_core::{Error, ErrorKind, Result};

/// A user's private key and its public key's fingerprint.
pub(super) struct KeyPair {
    key: RsaKeyPair,
    fingerprint: String,
}

fn refused(why: &str) -> Error {
    Error::new(ErrorKind::Config, format!("destination.private_key: {why}"))
}

impl KeyPair {
    /// A key from PEM text: PKCS#8 (`BEGIN PRIVATE KEY`) or PKCS#1 (`BEGIN RSA PRIVATE KEY`).
    pub(super) fn from_pem(pem: &str) -> Result<Self> {
        if pem.contains("ENCRYPTED") {
            return Err(refused(
                "an encrypted key is not taken; store it unencrypted here (Sluice encrypts it at rest)",
            ));
        }
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).map(str::trim).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| refused("not a PEM private key (its base64 does not decode)"))?;
        let key = if pem.contains("BEGIN RSA PRIVATE KEY") {
            RsaKeyPair::from_der(&der)
        } else {
            RsaKeyPair::from_pkcs8(&der)
        }
        .map_err(|e| refused(&format!("not an RSA private key Snowflake takes ({e})")))?;
        let spki = subject_public_key_info(key.public_key().as_ref());
        let digest = ring::digest::digest(&ring::digest::SHA256, &spki);
        let fingerprint = format!("SHA256:{}", base64::engine::general_purpose::STANDARD.encode(digest.as_ref()));
        Ok(Self { key, fingerprint })
    }

    /// A JWT for `user` of `account` (the account locator, before any region), valid 59
    /// minutes from `now` (seconds since the epoch): an hour is Snowflake's most, and a clock a
    /// little ahead would pass it.
    pub(super) fn token(&self, account: &str, user: &str, now: i64) -> Result<String> {
        let account = account.split('.').next().unwrap_or(account).to_uppercase();
        let subject = format!("{account}.{}", user.to_uppercase());
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = url.encode(json!({"alg": "RS256", "typ": "JWT"}).to_string());
        let claims =
            json!({"iss": format!("{subject}.{}", self.fingerprint), "sub": subject, "iat": now, "exp": now + 3540});
        let signed = format!("{header}.{}", url.encode(claims.to_string()));
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), signed.as_bytes(), &mut signature)
            .map_err(|_| Error::new(ErrorKind::Fatal, "Snowflake: signing the login token failed"))?;
        Ok(format!("{signed}.{}", url.encode(signature)))
    }
}

/// The DER of a SubjectPublicKeyInfo holding the PKCS#1 RSA public key `pkcs1`.
fn subject_public_key_info(pkcs1: &[u8]) -> Vec<u8> {
    fn length(n: usize, out: &mut Vec<u8>) {
        match n {
            0..=127 => out.push(n as u8),
            128..=255 => out.extend([0x81, n as u8]),
            _ => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
    }
    // rsaEncryption (1.2.840.113549.1.1.1) with NULL parameters.
    const ALGORITHM: [u8; 15] =
        [0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00];
    let mut bits = vec![0x03];
    length(pkcs1.len() + 1, &mut bits);
    bits.push(0);
    bits.extend_from_slice(pkcs1);
    let mut out = vec![0x30];
    length(ALGORITHM.len() + bits.len(), &mut out);
    out.extend_from_slice(&ALGORITHM);
    out.extend_from_slice(&bits);
    out
}

#[cfg(test)]
mod tests {
    use ring::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
    use serde_json::Value;

    use super::*;

    /// A key made for this test with `openssl genpkey -algorithm RSA`; its fingerprint is
    /// `openssl pkey -pubout -outform DER | openssl dgst -sha256 -binary | base64`.
    const KEY: &str = include_str!("testdata/test_only_rsa_key.pem");
    const FINGERPRINT: &str = "SHA256:A4kYksKK6SyfMdCqNUvZpuCdalMscGRBwklWn3zCJas=";

    #[test]
    fn the_token_names_the_key_as_snowflake_does_and_its_signature_verifies() {
        let pair = KeyPair::from_pem(KEY).unwrap();
        assert_eq!(pair.fingerprint, FINGERPRINT);
        let token = pair.token("xy12345.eu-west-1", "etl_user", 1_700_000_000).unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let claims: Value = serde_json::from_slice(&url.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["iss"], format!("XY12345.ETL_USER.{FINGERPRINT}"));
        assert_eq!(claims["sub"], "XY12345.ETL_USER");
        assert_eq!(claims["exp"], 1_700_003_540);
        let public = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, pair.key.public_key().as_ref().to_vec());
        let signed = format!("{}.{}", parts[0], parts[1]);
        public.verify(signed.as_bytes(), &url.decode(parts[2]).unwrap()).unwrap();
    }

    #[test]
    fn keys_snowflake_cannot_use_are_refused_with_the_field() {
        for pem in ["-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----", "not a key"] {
            let e = KeyPair::from_pem(pem).err().unwrap();
            assert!(e.message().contains("destination.private_key"), "{e}");
        }
    }
}
