//! A broker node as a URL says it: where it is and who to log in as.

use std::fmt;
use std::net::IpAddr;

use url::Url;

/// One broker node.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `amqp` or `amqps`.
    pub scheme: String,
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The SASL user, percent-decoded; `None` logs in anonymously.
    pub user: Option<String>,
    /// The SASL password, percent-decoded.
    pub password: Option<String>,
}

impl Endpoint {
    /// Reads `amqp://user:password@host:port` (or `amqps://`). The error
    /// never repeats the password.
    pub fn parse(text: &str) -> Result<Endpoint, String> {
        let shown = redact(text);
        let url = Url::parse(text).map_err(|e| format!("`{shown}` is not a URL ({e})"))?;
        let default_port = match url.scheme() {
            "amqp" => 5672,
            "amqps" => 5671,
            other => {
                return Err(format!(
                    "`{shown}`: scheme `{other}` is not `amqp` or `amqps`"
                ));
            }
        };
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("`{shown}` names no host"))?;
        let decode = |part: &str| {
            percent_decode(part).ok_or_else(|| format!("`{shown}`: credentials are not UTF-8"))
        };
        let user = match url.username() {
            "" => None,
            user => Some(decode(user)?),
        };
        let password = url.password().map(decode).transpose()?;
        Ok(Endpoint {
            scheme: url.scheme().to_owned(),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: url.port().unwrap_or(default_port),
            user,
            password,
        })
    }
}

impl Endpoint {
    /// The node as the broker is reached, whoever logs in and however the
    /// URL is spelt: `host:port`, the host in lower case. Two URLs with the
    /// same node reach the same broker.
    pub fn node(&self) -> String {
        format!("{}:{}", self.host.to_ascii_lowercase(), self.port)
    }

    /// Whether a connection to it crosses a network unencrypted: an
    /// `amqp://` URL to another machine (on this one a password in the
    /// clear goes nowhere).
    pub fn in_clear_across_network(&self) -> bool {
        let loopback = self.host.eq_ignore_ascii_case("localhost")
            || self.host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        self.scheme == "amqp" && !loopback
    }
}

/// Shown with the password hidden, so it can go into logs and errors.
impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        if let Some(user) = &self.user {
            write!(f, "{user}")?;
            if self.password.is_some() {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `text` with `%XX` escapes decoded; `None` when the result is not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|b| (*b as char).to_digit(16));
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push(u8::try_from(high * 16 + low).expect("two hex digits fit a byte"));
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `text` with the password of a URL in it replaced, for logs and errors.
/// The credentials end at the last `@` before the host, so a password may
/// itself hold `@` and `:`.
pub fn redact(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_owned();
    };
    // The authority ends where the path, query or fragment begins, but an
    // unencoded `@` in the password may hide a `/` or `?` before the host.
    let end = rest
        .rfind('@')
        .map(|at| at + rest[at..].find(['/', '?', '#']).unwrap_or(rest.len() - at))
        .unwrap_or_else(|| rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split_once(':').map_or(credentials, |(u, _)| u);
            let hidden = if credentials.contains(':') {
                ":***"
            } else {
                ""
            };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_percent_decoded() {
        let e = Endpoint::parse("amqp://us%40er:p%40ss%3Aw%2Frd@broker.example:5673").expect("url");
        assert_eq!(e.user.as_deref(), Some("us@er"));
        assert_eq!(e.password.as_deref(), Some("p@ss:w/rd"));
        assert_eq!(e.host, "broker.example");
        assert_eq!(e.port, 5673);
        assert_eq!(e.to_string(), "amqp://us@er:***@broker.example:5673");
    }

    #[test]
    fn default_ports_and_anonymous() {
        let e = Endpoint::parse("amqps://broker").expect("url");
        assert_eq!((e.port, e.user, e.password), (5671, None, None));
        assert_eq!(Endpoint::parse("amqp://[::1]").expect("url").host, "::1");
    }

    #[test]
    fn bad_urls_name_the_fault_but_never_the_password() {
        let error = Endpoint::parse("http://u:hunter2@h").expect_err("scheme");
        assert!(error.contains("`http`"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
        let error = Endpoint::parse("amqp://u:hunter2@").expect_err("host");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn passwords_are_hidden_even_with_at_and_colon_in_them() {
        assert_eq!(
            redact("amqp://admin:secret@127.0.0.1:5672"),
            "amqp://admin:***@127.0.0.1:5672"
        );
        assert_eq!(redact("amqp://u:p@ss@host"), "amqp://u:***@host");
        assert_eq!(redact("amqp://u:p:a@s/s@host:1/x"), "amqp://u:***@host:1/x");
        assert_eq!(redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
        assert_eq!(redact("amqp://user@host"), "amqp://user@host");
    }
}
