//! TLS to a broker: wharf makes the TLS session itself, with the roots,
//! server name and client certificate the config gives, then opens AMQP on
//! it. Errors name the file at fault, or say what was wrong with the
//! broker's certificate.

use std::io;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{CertificateError, ClientConfig};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

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
        CertificateError::Revoked => "the broker's certificate has been revoked".to_owned(),
        CertificateError::BadSignature => "the broker's certificate has a bad signature".to_owned(),
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            "the broker's certificate is not for a TLS server (its extended key usage)".to_owned()
        }
        CertificateError::BadEncoding => {
            "the broker's certificate does not parse as X.509 v3".to_owned()
        }
        other => format!("the broker's certificate was refused ({other})"),
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
                "TLS: the broker refused wharf's client certificate, or its absence (TLS alert `{}`; see `tls.cert_file`)",
                alert_name(alert)
            ),
        )
    })
}

/// A TLS alert's name as the TLS specification writes it, e.g.
/// `certificate_required`.
fn alert_name(alert: &rustls::AlertDescription) -> String {
    let camel = format!("{alert:?}");
    let mut name = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_lowercase());
    }
    name
}
