//! TLS to a broker: wharf makes the TLS session itself, with the roots,
//! server name and client certificate the config gives, then opens AMQP on
//! it. Errors name the file at fault, or say what was wrong with the
//! broker's certificate.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::config::TlsFiles;

/// TLS material that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds nothing usable.
    #[error("`{key}` `{path}`: {reason}")]
    File {
        /// The config key that names it.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A client certificate without its key, or a key without certificate.
    #[error("`cert_file` and `key_file` go together")]
    Unpaired,
    /// The platform's CA store is empty or unreadable.
    #[error("no CA certificates in the platform's store ({0}); set `ca_file`")]
    NoPlatformRoots(String),
    /// rustls refused the material.
    #[error("{0}")]
    Refused(#[from] rustls::Error),
}

/// A rustls client configuration from `files`: the CAs of `ca_file` (else
/// the platform's), and the client certificate when one is given.
pub fn client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    match &files.ca_file {
        Some(path) => {
            for cert in certificates("ca_file", path)? {
                roots.add(cert).map_err(|e| TlsError::File {
                    key: "ca_file",
                    path: path.clone(),
                    reason: format!("not a CA certificate: {e}"),
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "none found".to_owned(), ToString::to_string);
                return Err(TlsError::NoPlatformRoots(why));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            builder.with_client_auth_cert(certificates("cert_file", cert)?, private_key(key)?)?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err(TlsError::Unpaired),
    };
    Ok(Arc::new(config))
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        key,
        path: path.to_owned(),
        reason: format!("cannot read it: {e}"),
    })
}

fn certificates(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(key, path)?;
    let bad = |reason: String| TlsError::File {
        key,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate".to_owned()));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read("key_file", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::File {
        key: "key_file",
        path: path.to_owned(),
        reason: format!("holds no PEM private key ({e})"),
    })
}

/// Makes a TLS session on `stream`, checking the broker's certificate
/// against `server_name`. The error says what was wrong with the
/// certificate in words an operator can act on.
pub async fn handshake(
    config: Arc<ClientConfig>,
    server_name: &str,
    stream: TcpStream,
) -> io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{server_name}` is not a valid TLS server name: {e}"),
        )
    })?;
    TlsConnector::from(config)
        .connect(name, stream)
        .await
        .map_err(|e| explain(e, server_name))
}

fn explain(error: io::Error, server_name: &str) -> io::Error {
    let Some(rustls::Error::InvalidCertificate(reason)) = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    else {
        return io::Error::new(error.kind(), format!("TLS handshake failed: {error}"));
    };
    let why = match reason {
        CertificateError::UnknownIssuer => {
            "the broker's certificate is not signed by a CA wharf trusts (see `tls.ca_file`)"
                .to_owned()
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "the broker's certificate has expired".to_owned()
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the broker's certificate is not valid yet".to_owned()
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            format!(
                "the broker's certificate is not valid for `{server_name}` (see `tls.server_name`)"
            )
        }
        other => format!("the broker's certificate was refused: {other:?}"),
    };
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("TLS handshake failed: {why}"),
    )
}

/// The broker's TLS alert about wharf's client certificate, in words, when
/// `error` is one: with TLS 1.3 it arrives after the handshake, as the
/// AMQP open reads its first bytes.
pub fn refused_certificate(error: &fe2o3_amqp::connection::OpenError) -> Option<io::Error> {
    use rustls::AlertDescription as Alert;
    let fe2o3_amqp::connection::OpenError::Io(io) = error else {
        return None;
    };
    let Some(rustls::Error::AlertReceived(alert)) =
        io.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>())
    else {
        return None;
    };
    matches!(
        alert,
        Alert::BadCertificate
            | Alert::CertificateRequired
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::CertificateRevoked
            | Alert::UnknownCA
            | Alert::AccessDenied
    )
    .then(|| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "TLS: the broker refused wharf's client certificate, or its absence ({alert:?}; see `tls.cert_file`)"
            ),
        )
    })
}
