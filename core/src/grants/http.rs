//! Whom a handler may call over HTTP: origin patterns from `grants.http`,
//! and the addresses a wildcard does not reach.

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

    /// Whether the pattern names its host without `*`: what reaches a
    /// private address without `[host] allow_private_networks`.
    pub fn names_host(&self) -> bool {
        matches!(self.host, HostPattern::Name(_) | HostPattern::Ip(_))
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
    /// `[host] allow_private_networks`: wildcards reach private addresses.
    pub allow_private_networks: bool,
}

impl HttpGrants {
    /// Whether `pattern`, the grant that allowed a request, may connect to
    /// `addr`; otherwise why not.
    pub fn reaches(&self, pattern: &HttpPattern, addr: SocketAddr) -> Result<(), Guarded> {
        match guarded(addr, self.admin) {
            Some(Guarded::UnlessIpGranted(_)) if pattern.names_ip(addr.ip()) => Ok(()),
            Some(Guarded::Private(_)) if pattern.names_host() || self.allow_private_networks => {
                Ok(())
            }
            Some(guard) => Err(guard),
            None => Ok(()),
        }
    }
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

/// Why a resolved address is out of reach of a wildcard grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarded {
    /// Reached only by a grant naming this very IP address: link-local,
    /// cloud metadata, unspecified, multicast, the host's admin listener.
    UnlessIpGranted(&'static str),
    /// Reached only by a grant naming its host (name or IP) without `*`, or
    /// with `[host] allow_private_networks`: loopback, RFC 1918, CGNAT, ULA.
    Private(&'static str),
}

impl Guarded {
    /// What kind of address it is, for the refusal.
    pub fn why(self) -> &'static str {
        match self {
            Guarded::UnlessIpGranted(why) | Guarded::Private(why) => why,
        }
    }
}

/// The IPv4 address an IPv6 address carries, where it is a form that
/// reaches that IPv4 host: IPv4-mapped and -compatible, NAT64
/// (`64:ff9b::/96`, `64:ff9b:1::/48`), 6to4 (`2002::/16`) and Teredo's
/// client (`2001::/32`).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => Some(v4(hi, lo)),
        // `::` and `::1` are IPv6's own unspecified and loopback.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, hi, lo] => Some(v4(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] | [0x64, 0xff9b, 1, _, _, _, hi, lo] => Some(v4(hi, lo)),
        [0x2002, hi, lo, ..] => Some(v4(hi, lo)),
        [0x2001, 0, ..] => Some(v4(!s[6], !s[7])),
        _ => None,
    }
}

/// Whether a resolved address is out of reach of a wildcard grant, and why.
pub fn guarded(addr: SocketAddr, admin: Option<SocketAddr>) -> Option<Guarded> {
    const METADATA_V4: [Ipv4Addr; 2] = [
        Ipv4Addr::new(169, 254, 169, 254),
        Ipv4Addr::new(100, 100, 100, 200),
    ];
    const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    let ip = match addr.ip() {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let is_admin = admin.is_some_and(|admin| {
        admin.port() == addr.port()
            && (admin.ip() == ip
                || admin.ip().is_unspecified()
                || (admin.ip().is_loopback() && ip.is_loopback()))
    });
    use Guarded::{Private, UnlessIpGranted};
    let guard = match ip {
        _ if is_admin => UnlessIpGranted("the host's admin listener"),
        IpAddr::V4(v4) if METADATA_V4.contains(&v4) => UnlessIpGranted("a cloud metadata address"),
        IpAddr::V6(v6) if v6 == METADATA_V6 => UnlessIpGranted("a cloud metadata address"),
        IpAddr::V4(v4) if v4.is_link_local() => UnlessIpGranted("a link-local address"),
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => {
            UnlessIpGranted("a link-local address")
        }
        IpAddr::V4(v4) if v4.octets()[0] == 0 || v4.is_broadcast() => {
            UnlessIpGranted("the unspecified address")
        }
        ip if ip.is_unspecified() => UnlessIpGranted("the unspecified address"),
        ip if ip.is_multicast() => UnlessIpGranted("a multicast address"),
        ip if ip.is_loopback() => Private("a loopback address"),
        IpAddr::V4(v4) if v4.is_private() => Private("a private (RFC 1918) address"),
        IpAddr::V4(v4) if v4.octets()[0] == 100 && v4.octets()[1] & 0xc0 == 64 => {
            Private("a shared (CGNAT) address")
        }
        IpAddr::V6(v6) if v6.segments()[0] & 0xfe00 == 0xfc00 => {
            Private("a unique local (ULA) address")
        }
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfec0 => Private("a site-local address"),
        _ => return None,
    };
    Some(guard)
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

    fn at(s: &str) -> SocketAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn metadata_link_local_and_the_admin_listener_are_reached_by_their_ip_only() {
        let admin = Some(at("127.0.0.1:9090"));
        let ip_only =
            |s: &str, admin| matches!(guarded(at(s), admin), Some(Guarded::UnlessIpGranted(_)));
        for addr in [
            "169.254.169.254:80",
            "[fd00:ec2::254]:80",
            "169.254.1.1:80",
            "[fe80::1]:80",
            "[::ffff:169.254.169.254]:80",
            "0.0.0.0:80",
            "[::]:80",
            "255.255.255.255:80",
            "224.0.0.1:80",
            "[ff02::1]:80",
        ] {
            assert!(ip_only(addr, None), "{addr}");
        }
        assert!(ip_only("127.0.0.1:9090", admin));
        assert!(ip_only("127.0.0.2:9090", admin));
        assert!(!ip_only("127.0.0.1:9091", admin));
        assert!(!ip_only("10.0.0.1:9090", admin));
        assert_eq!(guarded(at("93.184.216.34:443"), admin), None);
    }

    #[test]
    fn private_addresses_in_every_form_are_kept_from_wildcards() {
        for addr in [
            "127.0.0.1:80",
            "127.1.2.3:80",
            "[::1]:80",
            "10.1.2.3:80",
            "172.16.0.1:80",
            "172.31.255.255:80",
            "192.168.1.1:80",
            "100.64.0.1:80",
            "100.127.255.255:80",
            "[fd12:3456::1]:80",
            "[fc00::1]:80",
            "[fec0::1]:80",
            // 10.0.0.1 mapped, IPv4-compatible, NAT64, local NAT64, 6to4,
            // and a Teredo client.
            "[::ffff:10.0.0.1]:80",
            "[::10.0.0.1]:80",
            "[64:ff9b::10.0.0.1]:80",
            "[64:ff9b:1::a00:1]:80",
            "[2002:a00:1::1]:80",
            "[2001:0:4136:e378:8000:63bf:f5ff:fffe]:80",
            "[64:ff9b::127.0.0.1]:80",
        ] {
            assert!(
                matches!(guarded(at(addr), None), Some(Guarded::Private(_))),
                "{addr}: {:?}",
                guarded(at(addr), None)
            );
        }
        // Public addresses, in the same forms.
        for addr in [
            "93.184.216.34:443",
            "100.128.0.1:443",
            "172.32.0.1:443",
            "[2606:2800:220:1::1]:443",
            "[64:ff9b::93.184.216.34]:443",
            "[2002:5db8:d822::1]:443",
        ] {
            assert_eq!(guarded(at(addr), None), None, "{addr}");
        }
    }

    #[test]
    fn a_private_address_is_reached_by_a_grant_naming_its_host_or_when_allowed() {
        let mut grants = HttpGrants::default();
        let reaches = |grants: &HttpGrants, p: &str, addr| {
            grants
                .reaches(&HttpPattern::parse(p).expect("a pattern"), addr)
                .is_ok()
        };
        let loopback = at("127.0.0.1:8080");
        assert!(!reaches(&grants, "*://*:*", loopback));
        assert!(!reaches(&grants, "http://*.corp:*", loopback));
        assert!(reaches(&grants, "http://localhost:8080", loopback));
        assert!(reaches(&grants, "http://127.0.0.1:8080", loopback));
        let metadata = at("169.254.169.254:80");
        assert!(!reaches(&grants, "http://metadata.internal", metadata));
        assert!(reaches(&grants, "http://169.254.169.254", metadata));
        grants.allow_private_networks = true;
        assert!(reaches(&grants, "*://*:*", loopback));
        assert!(!reaches(&grants, "*://*:*", metadata));
    }
}
