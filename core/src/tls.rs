//! TLS files: the CAs, server name and client certificate a connection to
//! a broker uses, loaded into a rustls client configuration. Errors name
//! the key and the file at fault.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// TLS to a broker (`amqps://` URLs). Paths are resolved against the
/// config file's folder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates of the CAs that may sign the broker's certificate;
    /// `None` trusts the platform's CA store.
    pub ca_file: Option<PathBuf>,
    /// The name the broker's certificate must carry, when it is not the
    /// URL's host.
    pub server_name: Option<String>,
    /// PEM client certificate chain for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    pub key_file: Option<PathBuf>,
}

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
            let chain = certificates("cert_file", cert)?;
            let first = chain[0].clone();
            builder
                .with_client_auth_cert(chain, private_key(key)?)
                .map_err(|e| unusable_client_certificate(cert, &first, e))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err(TlsError::Unpaired),
    };
    Ok(Arc::new(config))
}

/// Why rustls refused the client certificate in `path` (`first` is its
/// first certificate), in words, with how to make a usable one.
fn unusable_client_certificate(
    path: &Path,
    first: &CertificateDer<'_>,
    error: rustls::Error,
) -> TlsError {
    let reason = match &error {
        _ if x509_version(first) == Some(1) => "an X.509 v1 certificate, which TLS libraries refuse for a client: make a v3 one (`openssl x509 -req ... -extfile client.ext` with `extendedKeyUsage = clientAuth` in client.ext, or `openssl req -x509 ...`, which makes v3)".to_owned(),
        rustls::Error::InconsistentKeys(_) => {
            "does not go with `key_file`: the key is not the certificate's".to_owned()
        }
        rustls::Error::InvalidCertificate(_) => {
            "not a usable certificate (it does not parse as X.509 v3)".to_owned()
        }
        other => format!("refused: {other}"),
    };
    TlsError::File {
        key: "cert_file",
        path: path.to_owned(),
        reason,
    }
}

/// The X.509 version of a DER certificate (1 when the version field is
/// absent, as in v1), or `None` when it does not parse that far.
fn x509_version(der: &[u8]) -> Option<u8> {
    /// The content of the DER element at the start of `bytes` with `tag`.
    fn content(bytes: &[u8], tag: u8) -> Option<&[u8]> {
        let (&found, rest) = bytes.split_first()?;
        if found != tag {
            return None;
        }
        let (&first, rest) = rest.split_first()?;
        let (length, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return None;
            }
            let (digits, rest) = rest.split_at(count);
            let length = digits
                .iter()
                .fold(0usize, |n, &b| (n << 8) | usize::from(b));
            (length, rest)
        };
        rest.get(..length)
    }
    const SEQUENCE: u8 = 0x30;
    const VERSION: u8 = 0xa0;
    const INTEGER: u8 = 0x02;
    let certificate = content(der, SEQUENCE)?;
    let signed = content(certificate, SEQUENCE)?;
    match content(signed, VERSION) {
        Some(version) => match content(version, INTEGER)? {
            [v] => v.checked_add(1),
            _ => None,
        },
        None => Some(1),
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        key,
        path: path.to_owned(),
        reason: format!("cannot read it: {}", crate::words::io(&e)),
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
