//! TLS towards PostgreSQL, the same for the source's and the sink's
//! `[postgres]` sections: the modes of libpq's `sslmode` and the rustls
//! settings that implement them.

use std::sync::Arc;

pub use crate::tls::{validate_tls, TlsMode};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::{Error, Result};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca_file: Option<&str>) -> Result<RootCertStore> {
    let path = ca_file
        .ok_or_else(|| Error::needs_operator("postgres.tls_ca_file is required to verify the server certificate"))?;
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| Error::needs_operator(format!("cannot read postgres.tls_ca_file {path}: {e}")))?;
    for cert in certs {
        let cert = cert.map_err(|e| {
            Error::needs_operator(format!("postgres.tls_ca_file {path} is not a PEM certificate file: {e}"))
        })?;
        roots.add(cert).map_err(|e| {
            Error::needs_operator(format!("postgres.tls_ca_file {path} holds an unusable certificate: {e}"))
        })?;
    }
    Ok(roots)
}

/// The client configuration for `mode` (never `Disable`).
pub fn client_config(mode: TlsMode, ca_file: Option<&str>) -> Result<rustls::ClientConfig> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::needs_operator(format!("TLS setup failed: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        TlsMode::Disable | TlsMode::Require => Arc::new(AcceptAny(provider)),
        TlsMode::VerifyCa | TlsMode::VerifyFull => {
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots(ca_file)?), provider)
                .build()
                .map_err(|e| Error::needs_operator(format!("TLS setup failed: {e}")))?;
            if mode == TlsMode::VerifyCa {
                Arc::new(IgnoreHostName(webpki))
            } else {
                webpki
            }
        }
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// `sslmode=require`: encrypted, the certificate is not checked.
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain must lead to the CA, any host name.
#[derive(Debug)]
struct IgnoreHostName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for IgnoreHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
