//! Whom a handler may call over HTTP: origin patterns from `grants.http`,
//! and the addresses only a literal grant reaches.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// An origin, or with `*` a family of them, a handler may call:
/// `https://api.example.com`, `http://127.0.0.1:8080`, `https://*.example.com`,
/// `*://localhost:*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpPattern {
    text: String,
    /// `None`: either scheme.
    scheme: Option<String>,
    host: HostPattern,
    port: PortPattern,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Any,
    /// `*.example.com`: any name ending in `.example.com`.
    Suffix(String),
    Name(String),
    Ip(IpAddr),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortPattern {
    /// The scheme's own: 80 for `http`, 443 for `https`.
    Default,
    Any,
    Is(u16),
}

/// Why a `grants.http` entry is not an origin pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{pattern}` is not an origin like `https://api.example.com` or `http://127.0.0.1:8080`: {why}"
)]
pub struct BadHttpPattern {
    pattern: String,
    why: &'static str,
}

impl HttpPattern {
    /// Reads `text`: `SCHEME://HOST[:PORT]`, where `SCHEME` is `http`,
    /// `https` or `*`, `HOST` a name, an IP address (IPv6 in brackets), `*`
    /// or `*.DOMAIN`, and `PORT` a number or `*`.
    pub fn parse(text: &str) -> Result<HttpPattern, BadHttpPattern> {
        let bad = |why| BadHttpPattern {
            pattern: text.to_owned(),
            why,
        };
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("no `://`"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "*" => None,
            s @ ("http" | "https") => Some(s.to_owned()),
            _ => return Err(bad("the scheme must be `http`, `https` or `*`")),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err(bad("it has a path; grants name origins only"));
        }
        if authority.contains('@') {
            return Err(bad("it has user information"));
        }
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(|| bad("an unclosed `[`"))?;
                (host, after.strip_prefix(':'))
            }
            None => match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            },
        };
        let port = match port {
            None => PortPattern::Default,
            Some("*") => PortPattern::Any,
            Some(port) => {
                PortPattern::Is(port.parse().map_err(|_| bad("the port is not a number"))?)
            }
        };
        let host = host.to_ascii_lowercase();
        let host = if host == "*" {
            HostPattern::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            HostPattern::Suffix(format!(".{domain}"))
        } else if host.contains('*') {
            return Err(bad(
                "`*` stands for a whole host or its leading labels (`*.example.com`)",
            ));
        } else if let Ok(ip) = host.parse() {
            HostPattern::Ip(ip)
        } else if host.is_empty() {
            return Err(bad("no host"));
        } else {
            HostPattern::Name(host)
        };
        Ok(HttpPattern {
            text: text.to_owned(),
            scheme,
            host,
            port,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the pattern names the host by this very IP address: the
    /// only way to reach a guarded address.
    pub fn names_ip(&self, ip: IpAddr) -> bool {
        self.host == HostPattern::Ip(ip)
    }

    /// Whether a request to `target` is one this pattern allows.
    pub fn matches(&self, target: &Target) -> bool {
        let scheme = self.scheme.as_deref().is_none_or(|s| s == target.scheme);
        let port = match self.port {
            PortPattern::Default => target.port == default_port(&target.scheme),
            PortPattern::Any => true,
            PortPattern::Is(port) => target.port == port,
        };
        let host = match (&self.host, &target.host) {
            (HostPattern::Any, _) => true,
            (HostPattern::Ip(ip), Host::Ip(target)) => ip == target,
            (HostPattern::Name(name), Host::Name(target)) => name == target,
            (HostPattern::Suffix(suffix), Host::Name(target)) => target.ends_with(suffix.as_str()),
            _ => false,
        };
        scheme && port && host
    }
}

impl fmt::Display for HttpPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Whom a mount's handlers may call over HTTP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpGrants {
    /// The origins of `grants.http`; none by default.
    pub allowed: Vec<HttpPattern>,
    /// The host's admin listener, which only a literal grant reaches.
    pub admin: Option<SocketAddr>,
}

/// Where a request goes, read from its URL.
#[derive(Debug)]
pub struct Target {
    /// `http` or `https`, lowercase.
    pub scheme: String,
    /// The host, a name or an address.
    pub host: Host,
    /// The port, the scheme's own when the URL names none.
    pub port: u16,
}

/// A request's host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name, lowercase.
    Name(String),
    /// An IP address.
    Ip(IpAddr),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Name(name) => write!(f, "{}://{name}:{}", self.scheme, self.port),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "{}://[{ip}]:{}", self.scheme, self.port),
            Host::Ip(ip) => write!(f, "{}://{ip}:{}", self.scheme, self.port),
        }
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

impl Target {
    /// The target of a URL with this scheme, host and (if any) port.
    pub fn new(scheme: &str, host: &str, port: Option<u16>) -> Target {
        let scheme = scheme.to_ascii_lowercase();
        let host = host.to_ascii_lowercase();
        let port = port.unwrap_or_else(|| default_port(&scheme));
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let host = match bare.parse() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => Host::Name(host),
        };
        Target { scheme, host, port }
    }
}

/// Why a resolved address is out of a handler's reach unless granted by
/// its literal IP.
pub fn guarded(addr: SocketAddr, admin: Option<SocketAddr>) -> Option<&'static str> {
    const METADATA_V4: [Ipv4Addr; 2] = [
        Ipv4Addr::new(169, 254, 169, 254),
        Ipv4Addr::new(100, 100, 100, 200),
    ];
    const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    let ip = match addr.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let is_admin = admin.is_some_and(|admin| {
        admin.port() == addr.port()
            && (admin.ip() == ip
                || admin.ip().is_unspecified()
                || (admin.ip().is_loopback() && ip.is_loopback()))
    });
    match ip {
        _ if is_admin => Some("the host's admin listener"),
        IpAddr::V4(v4) if METADATA_V4.contains(&v4) => Some("a cloud metadata address"),
        IpAddr::V6(v6) if v6 == METADATA_V6 => Some("a cloud metadata address"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address"),
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => Some("a link-local address"),
        ip if ip.is_unspecified() => Some("the unspecified address"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Target {
        let url = url::Url::parse(url).expect("a URL");
        Target::new(url.scheme(), url.host_str().expect("a host"), url.port())
    }

    fn allows(pattern: &str, url: &str) -> bool {
        HttpPattern::parse(pattern)
            .expect("a pattern")
            .matches(&target(url))
    }

    #[test]
    fn patterns_name_scheme_host_and_port() {
        assert!(allows(
            "https://api.example.com",
            "https://api.example.com/v1?q=1"
        ));
        assert!(allows(
            "https://API.example.com/",
            "https://api.example.com:443/"
        ));
        assert!(!allows(
            "https://api.example.com",
            "http://api.example.com/"
        ));
        assert!(!allows(
            "https://api.example.com",
            "https://api.example.com:8443/"
        ));
        assert!(allows("http://127.0.0.1:8080", "http://127.0.0.1:8080/x"));
        assert!(!allows("http://127.0.0.1:8080", "http://127.0.0.2:8080/x"));
        assert!(allows("http://[::1]:8080", "http://[::1]:8080/"));
        assert!(allows("https://*.example.com", "https://a.b.example.com/"));
        assert!(!allows("https://*.example.com", "https://example.com/"));
        assert!(!allows("https://*.example.com", "https://badexample.com/"));
        assert!(allows("*://localhost:*", "http://localhost:1234/"));
        assert!(allows("*://*:*", "https://anything:1/"));
    }

    #[test]
    fn what_is_not_an_origin_is_refused() {
        for bad in [
            "api.example.com",
            "ftp://x",
            "https://x/path",
            "https://u:p@x",
            "https://x:port",
            "https://a*b.com",
            "https://",
            "http://[::1",
        ] {
            assert!(HttpPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn metadata_link_local_and_the_admin_listener_are_guarded() {
        let at = |s: &str| s.parse::<SocketAddr>().expect("an address");
        let admin = Some(at("127.0.0.1:9090"));
        assert!(guarded(at("169.254.169.254:80"), None).is_some());
        assert!(guarded(at("[fd00:ec2::254]:80"), None).is_some());
        assert!(guarded(at("169.254.1.1:80"), None).is_some());
        assert!(guarded(at("[fe80::1]:80"), None).is_some());
        assert!(guarded(at("[::ffff:169.254.169.254]:80"), None).is_some());
        assert!(guarded(at("0.0.0.0:80"), None).is_some());
        assert!(guarded(at("127.0.0.1:9090"), admin).is_some());
        assert!(guarded(at("127.0.0.2:9090"), admin).is_some());
        assert!(guarded(at("127.0.0.1:9091"), admin).is_none());
        assert!(guarded(at("10.0.0.1:9090"), admin).is_none());
        assert!(guarded(at("93.184.216.34:443"), admin).is_none());
    }
}
