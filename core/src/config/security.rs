//! Who wharf is to a broker and to the readers of its admin endpoint: TLS
//! files, the SASL mechanism, and secrets read from files or the
//! environment, so a config can be committed and its secrets mounted.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::{Checker, ConfigError};
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

/// `[broker.tls]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    ca_file: Option<PathBuf>,
    server_name: Option<String>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

/// The security keys of a `[broker]` table as written.
pub(super) struct RawBrokerSecurity {
    pub url: Spanned<()>,
    pub user: Option<Spanned<String>>,
    pub password_file: Option<Spanned<PathBuf>>,
    pub password_env: Option<Spanned<String>>,
    pub sasl: Option<Spanned<SaslMechanism>>,
    pub allow_plain_without_tls: bool,
    pub tls: Option<Spanned<RawTls>>,
}

impl Checker<'_> {
    /// Reads a secret from the file or environment variable a key names;
    /// errors name the key and the file or variable, never the value.
    pub(super) fn secret(
        &self,
        here: &str,
        file: Option<&Spanned<PathBuf>>,
        env: Option<&Spanned<String>>,
        key: &str,
    ) -> Result<Option<Secret>, ConfigError> {
        match (file, env) {
            (Some(file), Some(_)) => Err(self.invalid(
                file,
                format!("{here}: give `{key}_file` or `{key}_env`, not both"),
            )),
            (Some(file), None) => {
                let path = self.base().join(file.get_ref());
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    self.invalid(
                        file,
                        format!(
                            "{here}: `{key}_file`: cannot read `{}`: {}",
                            path.display(),
                            crate::words::io(&e)
                        ),
                    )
                })?;
                // Secret files made with `echo` end in a newline that is
                // not part of the secret.
                let value = text.trim_end_matches(['\n', '\r']);
                if value.is_empty() {
                    return Err(self.invalid(
                        file,
                        format!("{here}: `{key}_file`: `{}` is empty", path.display()),
                    ));
                }
                Ok(Some(Secret::new(value)))
            }
            (None, Some(env)) => match std::env::var(env.get_ref()) {
                Ok(value) if !value.is_empty() => Ok(Some(Secret::new(value))),
                _ => Err(self.invalid(
                    env,
                    format!(
                        "{here}: `{key}_env`: the environment variable `{}` is not set",
                        env.get_ref()
                    ),
                )),
            },
            (None, None) => Ok(None),
        }
    }

    /// Checks how a broker is logged in to and secured, reading every
    /// secret and TLS file now so a bad one is refused at load.
    pub(super) fn broker_security(
        &self,
        here: &str,
        endpoints: &[Endpoint],
        raw: RawBrokerSecurity,
    ) -> Result<(Credentials, Option<TlsFiles>), ConfigError> {
        let password = self.secret(
            here,
            raw.password_file.as_ref(),
            raw.password_env.as_ref(),
            "password",
        )?;
        let url = &raw.url;
        let tls_urls = endpoints.iter().filter(|e| e.scheme == "amqps").count();
        if tls_urls != 0 && tls_urls != endpoints.len() {
            return Err(self.invalid(
                url,
                format!("{here}: `url` mixes `amqp://` and `amqps://` nodes"),
            ));
        }
        let tls = match raw.tls {
            Some(tls) if tls_urls == 0 => {
                return Err(self.invalid(&tls, format!("{here}: `[tls]` needs `amqps://` URLs")));
            }
            Some(tls) => Some(self.tls_files(here, tls)?),
            None if tls_urls > 0 => Some(self.tls_files_checked(here, url, TlsFiles::default())?),
            None => None,
        };
        for endpoint in endpoints {
            if endpoint.password.is_some() && password.is_some() {
                return Err(self.invalid(
                    url,
                    format!(
                        "{here}: `{endpoint}` carries a password and `password_file` or `password_env` gives another; give it once"
                    ),
                ));
            }
        }
        let user = raw.user.map(Spanned::into_inner);
        let client_cert = tls.as_ref().is_some_and(|t| t.cert_file.is_some());
        let has_user = |e: &Endpoint| e.user.is_some() || user.is_some();
        let mechanism = match &raw.sasl {
            Some(sasl) => *sasl.get_ref(),
            None if endpoints.iter().any(has_user) => SaslMechanism::Plain,
            None if client_cert => SaslMechanism::External,
            None => SaslMechanism::Anonymous,
        };
        let at = raw.sasl.as_ref().map_or(url.span(), Spanned::span);
        let at = Spanned::new(at, ());
        if mechanism.needs_password() {
            for endpoint in endpoints {
                let has_password = endpoint.password.is_some() || password.is_some();
                if !has_user(endpoint) || !has_password {
                    return Err(self.invalid(
                        &at,
                        format!(
                            "{here}: SASL {mechanism} needs a user and a password for `{endpoint}` (in the URL, or `user` with `password_file` or `password_env`)"
                        ),
                    ));
                }
            }
        }
        if mechanism == SaslMechanism::External && !client_cert {
            return Err(self.invalid(
                &at,
                format!(
                    "{here}: SASL EXTERNAL needs `amqps://` URLs and a client certificate (`tls.cert_file`, `tls.key_file`)"
                ),
            ));
        }
        if mechanism == SaslMechanism::Plain
            && !raw.allow_plain_without_tls
            && let Some(endpoint) = endpoints.iter().find(|e| e.in_clear_across_network())
        {
            return Err(self.invalid(
                &at,
                format!(
                    "{here}: SASL PLAIN would send the password to `{endpoint}` without TLS; use `amqps://`, or set `allow_plain_without_tls = true`"
                ),
            ));
        }
        Ok((
            Credentials {
                mechanism,
                user,
                password,
                allow_plain_without_tls: raw.allow_plain_without_tls,
            },
            tls,
        ))
    }

    fn tls_files(&self, here: &str, raw: Spanned<RawTls>) -> Result<TlsFiles, ConfigError> {
        let at = Spanned::new(raw.span(), ());
        let raw = raw.into_inner();
        let base = self.base();
        let files = TlsFiles {
            ca_file: raw.ca_file.map(|p| base.join(p)),
            server_name: raw.server_name,
            cert_file: raw.cert_file.map(|p| base.join(p)),
            key_file: raw.key_file.map(|p| base.join(p)),
        };
        self.tls_files_checked(here, &at, files)
    }

    /// Loads the TLS material as a connection would, so `wharf check`
    /// names a missing or unreadable file.
    fn tls_files_checked<T>(
        &self,
        here: &str,
        at: &Spanned<T>,
        files: TlsFiles,
    ) -> Result<TlsFiles, ConfigError> {
        match crate::tls::client_config(&files) {
            Ok(_) => Ok(files),
            Err(e) => Err(self.invalid(at, format!("{here}: [tls]: {e}"))),
        }
    }

    fn base(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }
}
