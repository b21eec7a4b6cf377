//! Who wharf is to a broker and to the readers of its admin endpoint: TLS
//! files, the SASL mechanism, and secrets read from files or the
//! environment, so a config can be committed and its secrets mounted.

use std::fmt;

use serde::Deserialize;

use crate::endpoint::Endpoint;
pub use crate::tls::TlsFiles;

/// A password or token. It never shows itself: `Debug` prints `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that must send or compare it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// How wharf authenticates to a broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SaslMechanism {
    /// No identity.
    Anonymous,
    /// User and password in the clear: only over TLS, or to this machine,
    /// unless `allow_plain_without_tls` says otherwise.
    Plain,
    /// The identity of the TLS client certificate.
    External,
    /// Salted challenge-response: the password never crosses the wire.
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    /// As `scram-sha-256`, with SHA-512.
    #[serde(rename = "scram-sha-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// Whether it logs in with a user and password.
    pub fn needs_password(self) -> bool {
        matches!(
            self,
            SaslMechanism::Plain | SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512
        )
    }
}

impl fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SaslMechanism::Anonymous => "ANONYMOUS",
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::External => "EXTERNAL",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        })
    }
}

/// How wharf logs in to a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The SASL mechanism.
    pub mechanism: SaslMechanism,
    /// The user, when the URLs name none.
    pub user: Option<String>,
    /// The password, when the URLs carry none (read from a file or the
    /// environment).
    pub password: Option<Secret>,
    /// PLAIN over a connection without TLS to another machine was allowed
    /// explicitly (wharf warns when it connects so).
    pub allow_plain_without_tls: bool,
}

impl Credentials {
    /// Anonymous, or PLAIN with the URL's user: what a bare URL asks for.
    pub fn from_url(url: &str) -> Credentials {
        let user = Endpoint::parse(url).ok().and_then(|e| e.user);
        Credentials {
            mechanism: if user.is_some() {
                SaslMechanism::Plain
            } else {
                SaslMechanism::Anonymous
            },
            user: None,
            password: None,
            allow_plain_without_tls: false,
        }
    }
}

/// `text` with every quoted value (`"..."`, `'...'`, up to the closing
/// quote or the end of the line) replaced by `***`, for error messages
/// that quote config lines.
pub(super) fn redact_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '"' && c != '\'' {
            continue;
        }
        out.push_str("***");
        let mut escaped = false;
        for inner in chars.by_ref() {
            if inner == '\n' {
                out.push('\n');
                break;
            }
            if inner == c && !escaped {
                out.push(c);
                break;
            }
            escaped = c == '"' && inner == '\\' && !escaped;
        }
    }
    out
}
