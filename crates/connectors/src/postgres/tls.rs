//! TLS to Postgres, with libpq's `sslmode` meanings: `disable` (plain TCP), `prefer` (TLS when
//! the server offers it, unverified), `require` (TLS, unverified), `verify-ca` (TLS, the chain
//! checked against `sslrootcert`) and `verify-full` (also the host name). Used by the SQL
//! sessions (tokio-postgres) and, as the same settings, by the replication session.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sluice_core::{Error, ErrorKind, Result};

use super::config::SslMode;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls client config for `mode`; `None` for `disable`.
pub(crate) fn client_config(mode: SslMode, root: Option<&Path>) -> Result<Option<rustls::ClientConfig>> {
    let chain = match mode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer | SslMode::Require => None,
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let root = root.ok_or_else(|| Error::config("sslrootcert", "verify-ca and verify-full need a CA file"))?;
            let mut roots = RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(root)
                .map_err(|e| Error::config("sslrootcert", format!("cannot read {}: {e}", root.display())))?;
            for cert in certs {
                let cert = cert.map_err(|e| Error::config("sslrootcert", format!("{}: {e}", root.display())))?;
                roots.add(cert).map_err(|e| Error::config("sslrootcert", format!("{}: {e}", root.display())))?;
            }
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| Error::config("sslrootcert", e))?;
            Some(webpki)
        }
    };
    let verifier = Verifier { chain, host: mode == SslMode::VerifyFull, provider: provider() };
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::new(ErrorKind::Fatal, "TLS setup").with_source(e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(Some(config))
}

/// libpq's checks: none (`prefer`, `require`: encrypted, the certificate not checked), the
/// chain against the CA (`verify-ca`), or the chain and the host name (`verify-full`).
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    host: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.host => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The replication session's TLS settings for the same mode.
pub(crate) fn replication_tls(mode: SslMode, root: Option<&Path>) -> pgwire_replication::config::TlsConfig {
    use pgwire_replication::config::{SslMode as Mode, TlsConfig};
    let mode = match mode {
        SslMode::Disable => Mode::Disable,
        SslMode::Prefer => Mode::Prefer,
        SslMode::Require => Mode::Require,
        SslMode::VerifyCa => Mode::VerifyCa,
        SslMode::VerifyFull => Mode::VerifyFull,
    };
    TlsConfig { mode, ca_pem_path: root.map(Path::to_path_buf), ..TlsConfig::default() }
}
