//! Outbound HTTP for handlers (`wasi:http/outgoing-handler`), deny by
//! default. wharf sends every request itself: it checks the URL against the
//! mount's `grants.http`, resolves the host, refuses addresses a handler
//! must never reach unless the grant names them literally (link-local and
//! cloud metadata addresses, the unspecified address, the host's own admin
//! listener), then connects, with TLS from the platform's CAs for `https`.
//! The mount's `timeout` covers the whole call, so a slow server is the
//! handler's time-out.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::uri::Scheme;
use http_body_util::BodyExt as _;
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::store::InstanceSetup;

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

    fn matches(&self, target: &Target) -> bool {
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
struct Target {
    scheme: String,
    host: Host,
    port: u16,
}

#[derive(Debug)]
enum Host {
    Name(String),
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
    fn of(uri: &http::Uri) -> Option<Target> {
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let host = uri.host()?.to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or_else(|| default_port(&scheme));
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let host = match bare.parse() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => Host::Name(host),
        };
        Some(Target { scheme, host, port })
    }
}

/// Why a resolved address is out of a handler's reach unless granted by
/// its literal IP.
fn guarded(addr: SocketAddr, admin: Option<SocketAddr>) -> Option<&'static str> {
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

/// The `wasi:http` hooks of one handler instance: every request goes
/// through the mount's grants.
pub(crate) struct HttpGate {
    setup: Arc<InstanceSetup>,
}

impl HttpGate {
    pub(crate) fn new(setup: Arc<InstanceSetup>) -> HttpGate {
        HttpGate { setup }
    }

    fn refuse(&self, target: &Target, why: &str) -> Error {
        let tags = &self.setup.tags;
        tracing::warn!(
            tenant = &*tags.tenant,
            mount = &*tags.mount,
            "HTTP request to {target} refused: {why}"
        );
        Error::HttpRequestDenied
    }

    /// The addresses the request may connect to, or why none.
    async fn addresses(&self, target: &Target) -> Result<Vec<SocketAddr>, Error> {
        let grants = &self.setup.grants.http;
        let Some(pattern) = grants.allowed.iter().find(|p| p.matches(target)) else {
            return Err(self.refuse(target, "no `grants.http` entry names it"));
        };
        let found: Vec<SocketAddr> = match &target.host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
            Host::Name(name) => tokio::net::lookup_host((name.as_str(), target.port))
                .await
                .map_err(|e| Error::DnsError {
                    rcode: Some(e.to_string()),
                    info_code: None,
                })?
                .collect(),
        };
        let literal = |addr: &SocketAddr| pattern.host == HostPattern::Ip(addr.ip());
        let mut refused = None;
        let allowed: Vec<SocketAddr> = found
            .into_iter()
            .filter(|addr| match guarded(*addr, grants.admin) {
                Some(why) if !literal(addr) => {
                    refused = Some((*addr, why));
                    false
                }
                _ => true,
            })
            .collect();
        match (allowed.is_empty(), refused) {
            (true, Some((addr, why))) => Err(self.refuse(
                target,
                &format!("{addr} is {why}, which only a grant naming its IP reaches"),
            )),
            (true, None) => Err(Error::DestinationNotFound),
            (false, _) => Ok(allowed),
        }
    }

    async fn send(
        &self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        let target = Target::of(request.uri()).ok_or(Error::HttpRequestUriInvalid)?;
        let addresses = self.addresses(&target).await?;
        let options = options.unwrap_or_default();
        let connect_timeout = options.connect_timeout.unwrap_or(Duration::MAX);
        let connect = TcpStream::connect(addresses.as_slice());
        let tcp = match tokio::time::timeout(connect_timeout, connect).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(Error::ConnectionRefused);
            }
            Ok(Err(e)) => return Err(Error::Connect(e)),
            Err(_) => return Err(Error::ConnectionTimeout),
        };
        let _ = tcp.set_nodelay(true);
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .map_err(|_| Error::HttpRequestUriInvalid)?;
        *request.uri_mut() = path;
        let response = if target.scheme == Scheme::HTTPS.as_str() {
            let server_name = match &target.host {
                Host::Ip(ip) => rustls::pki_types::ServerName::IpAddress((*ip).into()),
                Host::Name(name) => rustls::pki_types::ServerName::try_from(name.clone())
                    .map_err(|_| Error::HttpRequestUriInvalid)?,
            };
            let tls = tokio_rustls::TlsConnector::from(tls_config()?)
                .connect(server_name, tcp)
                .await
                .map_err(
                    |e| match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                        Some(rustls::Error::InvalidCertificate(_)) => Error::TlsCertificateError,
                        _ => Error::Tls(e),
                    },
                )?;
            exchange(TokioIo::new(tls), request, options).await?
        } else {
            exchange(TokioIo::new(tcp), request, options).await?
        };
        Ok(response)
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

/// One HTTP/1.1 request on a fresh connection; the connection is driven on
/// its own task and ends with the response body.
async fn exchange<S>(
    io: TokioIo<S>,
    request: http::Request<WasiBody>,
    options: RequestOptions,
) -> Result<(http::Response<WasiBody>, IoFuture), Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    let mut driven = Connection(tokio::spawn(connection));
    let sent = sender.send_request(request);
    let response = match options.first_byte_timeout {
        Some(limit) => tokio::time::timeout(limit, sent)
            .await
            .map_err(|_| Error::ConnectionReadTimeout)??,
        None => sent.await?,
    };
    let io: IoFuture = Box::new(async move {
        match (&mut driven.0).await {
            Ok(result) => result.map_err(Error::from),
            Err(_) => Err(Error::ConnectionTerminated),
        }
    });
    Ok((
        response.map(|body| body.map_err(Error::from).boxed_unsync()),
        io,
    ))
}

/// The task driving one request's connection, ended with whatever holds
/// it: the instance that made the request may be dropped mid-call.
struct Connection(tokio::task::JoinHandle<hyper::Result<()>>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// TLS for handlers' `https` calls: the platform's CAs, loaded once.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, Error> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            crate::broker::tls::client_config(&Default::default()).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| {
            tracing::warn!("HTTPS from handlers is unavailable: {e}");
            Error::TlsCertificateError
        })
}

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: IoFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send> {
        let gate = HttpGate::new(self.setup.clone());
        Box::new(async move { gate.send(request, options).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Target {
        Target::of(&url.parse().expect("a URL")).expect("a target")
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
