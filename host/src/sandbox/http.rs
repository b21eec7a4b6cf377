//! Outbound HTTP for handlers (`wasi:http/outgoing-handler`), deny by
//! default. wharf sends every request itself: it checks the URL against the
//! mount's `grants.http`, resolves the host, refuses addresses a wildcard
//! grant must not reach (private ones unless the grant names the host or
//! `[host] allow_private_networks` is set; link-local and cloud metadata
//! addresses, the unspecified address and the host's own admin listener
//! unless the grant names the IP), IPv6 forms of IPv4 addresses judged as
//! the IPv4 address, then connects, with TLS from the platform's CAs for
//! `https`.
//! The mount's `timeout` covers the whole call, so a slow server is the
//! handler's time-out. An instance holds at most
//! [`MAX_CONNECTIONS_PER_INSTANCE`] connections and a tenant's handlers at
//! most its `max_http_connections`; past either, a request fails at once
//! with `connection-limit-reached`.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::uri::Scheme;
use http_body_util::BodyExt as _;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::telemetry::{Kind, Telemetry};
use wharf_core::grants::{Guarded, Host, HttpGrants, Target};
use wharf_core::text::shown;
use wharf_core::trace::{TRACEPARENT, TRACESTATE, TraceContext};

/// Outbound HTTP connections one instance may hold at once.
pub const MAX_CONNECTIONS_PER_INSTANCE: usize = 16;

/// The most of an outgoing request body buffered on the host per write.
pub const MAX_BODY_CHUNK: usize = 64 * 1024;

/// Name lookups one tenant's handlers may have in flight at once. A lookup
/// runs on a blocking thread until the resolver answers, even when the
/// handler that asked has timed out: the bound keeps a tenant whose names
/// resolve slowly from filling the threads the host resolves brokers on.
pub const MAX_LOOKUPS_PER_TENANT: usize = 4;

/// Name lookups all handlers may have in flight at once.
pub const MAX_LOOKUPS: usize = 32;

/// Outbound HTTP connections one tenant's handlers may hold at once
/// (`max_http_connections`), and the name lookups they may have in flight;
/// clones share them.
#[derive(Clone)]
pub struct HttpConnections {
    connections: Arc<Semaphore>,
    lookups: Arc<Semaphore>,
}

impl HttpConnections {
    /// Room for `max` connections.
    pub fn new(max: u32) -> HttpConnections {
        HttpConnections {
            connections: Arc::new(Semaphore::new(max as usize)),
            lookups: Arc::new(Semaphore::new(MAX_LOOKUPS_PER_TENANT)),
        }
    }
}

/// The addresses of `name`, looked up on a blocking thread that holds a
/// place in `tenant`'s and the host's lookups until the resolver answers,
/// whether or not anyone still waits for it. With no place free it fails
/// at once.
async fn lookup(
    name: String,
    port: u16,
    tenant: &Arc<Semaphore>,
    host: &Arc<Semaphore>,
) -> Result<Vec<SocketAddr>, Error> {
    let resolve = move || {
        std::net::ToSocketAddrs::to_socket_addrs(&(name.as_str(), port))
            .map(Iterator::collect::<Vec<_>>)
    };
    bounded_lookup(resolve, tenant, host).await
}

/// Runs `resolve` on a blocking thread holding a place in `tenant` and
/// `host` until it returns.
async fn bounded_lookup(
    resolve: impl FnOnce() -> std::io::Result<Vec<SocketAddr>> + Send + 'static,
    tenant: &Arc<Semaphore>,
    host: &Arc<Semaphore>,
) -> Result<Vec<SocketAddr>, Error> {
    let busy = || Error::DnsError {
        rcode: Some("too many name lookups in flight".to_owned()),
        info_code: None,
    };
    let tenant = tenant.clone().try_acquire_owned().map_err(|_| busy())?;
    let host = host.clone().try_acquire_owned().map_err(|_| busy())?;
    let resolved = tokio::task::spawn_blocking(move || {
        let _places = (tenant, host);
        resolve()
    });
    match resolved.await {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(e)) => Err(Error::DnsError {
            rcode: Some(e.to_string()),
            info_code: None,
        }),
        Err(_) => Err(busy()),
    }
}

/// The places every handler's name lookups share.
fn host_lookups() -> &'static Arc<Semaphore> {
    static LOOKUPS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    LOOKUPS.get_or_init(|| Arc::new(Semaphore::new(MAX_LOOKUPS)))
}

/// What one connection holds until it closes: its places in the
/// instance's and the tenant's caps.
type ConnectionPermits = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// The `wasi:http` hooks of one handler instance: every request goes
/// through the mount's grants and the connection caps.
pub(crate) struct HttpGate {
    /// What the mount grants.
    grants: Arc<HttpGrants>,
    /// The tenant's connections and lookups.
    tenant: HttpConnections,
    connections: Arc<Semaphore>,
    /// The delivery being handled, in its trace: each request is a span
    /// below it and carries that span's context.
    pub(crate) trace: HttpTrace,
}

/// Where a handler's requests stand in a trace.
#[derive(Clone, Default)]
pub(crate) struct HttpTrace {
    /// The delivery's context, if it has one.
    pub(crate) context: Option<TraceContext>,
    /// Where request spans go.
    pub(crate) telemetry: Telemetry,
}

impl HttpGate {
    pub(crate) fn new(grants: Arc<HttpGrants>, tenant: HttpConnections) -> HttpGate {
        HttpGate {
            grants,
            tenant,
            connections: Arc::new(Semaphore::new(MAX_CONNECTIONS_PER_INSTANCE)),
            trace: HttpTrace::default(),
        }
    }

    /// Places for one more connection, or none when a cap is reached: the
    /// request then fails at once with `connection-limit-reached`.
    fn connection_permits(&self) -> Option<ConnectionPermits> {
        let instance = self.connections.clone().try_acquire_owned().ok()?;
        let tenant = self.tenant.connections.clone().try_acquire_owned().ok()?;
        Some((instance, tenant))
    }

    fn refuse(&self, target: &Target, why: &str) -> Error {
        tracing::warn!(
            "HTTP request to {} refused: {why}",
            shown(&target.to_string())
        );
        Error::HttpRequestDenied
    }

    /// The addresses the request may connect to, or why none.
    async fn addresses(&self, target: &Target) -> Result<Vec<SocketAddr>, Error> {
        let grants = &self.grants;
        let Some(pattern) = grants.allowed.iter().find(|p| p.matches(target)) else {
            return Err(self.refuse(target, "no `grants.http` entry names it"));
        };
        let found: Vec<SocketAddr> = match &target.host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
            Host::Name(name) => {
                let tenant = &self.tenant.lookups;
                lookup(name.clone(), target.port, tenant, host_lookups()).await?
            }
        };
        let mut refused = None;
        let allowed: Vec<SocketAddr> = found
            .into_iter()
            .filter(|addr| match grants.reaches(pattern, *addr) {
                Ok(()) => true,
                Err(guard) => {
                    refused = Some((*addr, guard));
                    false
                }
            })
            .collect();
        match (allowed.is_empty(), refused) {
            (true, Some((addr, guard))) => {
                let needs = match guard {
                    Guarded::UnlessIpGranted(_) => "only a grant naming its IP reaches",
                    Guarded::Private(_) => {
                        "only a grant naming its host without `*` (or `[host] allow_private_networks`) reaches"
                    }
                };
                Err(self.refuse(target, &format!("{addr} is {}, which {needs}", guard.why())))
            }
            (true, None) => Err(Error::DestinationNotFound),
            (false, _) => Ok(allowed),
        }
    }

    async fn send(
        &self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        permits: ConnectionPermits,
    ) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        let target = target_of(request.uri()).ok_or(Error::HttpRequestUriInvalid)?;
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
        if let Some(trace) = &self.trace.context {
            carry_trace(request.headers_mut(), trace);
        }
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
            exchange(TokioIo::new(tls), request, options, permits).await?
        } else {
            exchange(TokioIo::new(tcp), request, options, permits).await?
        };
        Ok(response)
    }
}

/// A request's URL as a span shows it, as OpenTelemetry's conventions
/// advise: credentials in it replaced, the value of every query parameter
/// replaced (API keys and signatures travel there), bounded and escaped.
fn redacted(uri: &http::Uri) -> String {
    let mut url = String::new();
    if let Some(scheme) = uri.scheme_str() {
        url.push_str(scheme);
        url.push_str("://");
    }
    if let Some(authority) = uri.authority() {
        if authority.as_str().contains('@') {
            url.push_str("REDACTED:REDACTED@");
        }
        url.push_str(authority.host());
        if let Some(port) = authority.port_u16() {
            url.push_str(&format!(":{port}"));
        }
    }
    url.push_str(uri.path());
    if let Some(query) = uri.query() {
        let keys: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) => format!("{key}=REDACTED"),
                None => pair.to_owned(),
            })
            .collect();
        url.push('?');
        url.push_str(&keys.join("&"));
    }
    shown(&url).to_string()
}

/// Puts `trace` on a request as W3C trace context headers, replacing any
/// the handler set.
fn carry_trace(headers: &mut http::HeaderMap, trace: &TraceContext) {
    let mut set = |name: &'static str, value: &str| match http::HeaderValue::from_str(value) {
        Ok(value) => {
            headers.insert(name, value);
        }
        Err(_) => {
            headers.remove(name);
        }
    };
    set(TRACEPARENT, &trace.traceparent());
    match &trace.state {
        Some(state) => set(TRACESTATE, state),
        None => {
            headers.remove(TRACESTATE);
        }
    }
}

/// Where a request goes, read from its URL.
fn target_of(uri: &http::Uri) -> Option<Target> {
    Some(Target::new(uri.scheme_str()?, uri.host()?, uri.port_u16()))
}

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

/// One HTTP/1.1 request on a fresh connection; the connection is driven on
/// its own task, holding `permits`, and ends with the response body.
async fn exchange<S>(
    io: TokioIo<S>,
    request: http::Request<WasiBody>,
    options: RequestOptions,
    permits: ConnectionPermits,
) -> Result<(http::Response<WasiBody>, IoFuture), Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    let mut driven = Connection(tokio::spawn(async move {
        let _permits = permits;
        connection.await
    }));
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
            wharf_core::tls::client_config(&Default::default()).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| {
            tracing::warn!("HTTPS from handlers is unavailable: {e}");
            Error::TlsCertificateError
        })
}

impl WasiHttpHooks for HttpGate {
    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        MAX_BODY_CHUNK
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: IoFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send> {
        let Some(permits) = self.connection_permits() else {
            tracing::debug!(
                "HTTP request refused: the instance or the tenant holds its most connections"
            );
            return Box::new(async { Err(Error::ConnectionLimitReached) });
        };
        let method = request.method().as_str();
        let (context, mut span) = self.trace.telemetry.child(
            self.trace.context.as_ref(),
            format_args!("{method}"),
            Kind::Client,
        );
        if let Some(span) = &mut span {
            span.set("http.request.method", method);
            span.set("url.full", redacted(request.uri()));
            if let Some(host) = request.uri().host() {
                span.set("server.address", host);
            }
            if let Some(port) = request.uri().port_u16() {
                span.set("server.port", i64::from(port));
            }
        }
        let gate = HttpGate {
            grants: self.grants.clone(),
            tenant: self.tenant.clone(),
            connections: self.connections.clone(),
            trace: HttpTrace {
                context,
                telemetry: self.trace.telemetry.clone(),
            },
        };
        Box::new(async move {
            let sent = gate.send(request, options, permits).await;
            if let Some(span) = &mut span {
                match &sent {
                    Ok((response, _)) => {
                        let status = response.status().as_u16();
                        span.set("http.response.status_code", i64::from(status));
                        if status >= 400 {
                            span.fail(status.to_string(), "");
                        }
                    }
                    Err(e) => {
                        // The error's variant: `ConnectionRefused`, `Connect`, …
                        let kind = format!("{e:?}");
                        let kind = kind.split(['(', ' ', '{']).next().unwrap_or("Error");
                        span.fail(kind.to_owned(), e.to_string());
                    }
                }
            }
            sent
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spans_url_keeps_no_credentials_or_query_values() {
        let uri: http::Uri =
            "https://user:secret@api.example.com:8443/v1/blob?sig=abc&sv=2024&flag"
                .parse()
                .expect("a URL");
        assert_eq!(
            redacted(&uri),
            "https://REDACTED:REDACTED@api.example.com:8443/v1/blob?sig=REDACTED&sv=REDACTED&flag"
        );
        let plain: http::Uri = "http://example.com/a".parse().expect("a URL");
        assert_eq!(redacted(&plain), "http://example.com/a");
    }

    /// A resolver that answers only when the test says: lookups the
    /// handler gave up on hold their places until it answers, and no more
    /// start meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn abandoned_lookups_hold_their_places_and_no_more_start() {
        let tenant = Arc::new(Semaphore::new(MAX_LOOKUPS_PER_TENANT));
        let host = Arc::new(Semaphore::new(MAX_LOOKUPS));
        let (answer, asked) = std::sync::mpsc::channel::<()>();
        let asked = Arc::new(std::sync::Mutex::new(asked));
        let slow = || {
            let asked = asked.clone();
            move || {
                let _ = asked.lock().expect("resolver").recv();
                Ok(Vec::new())
            }
        };
        for _ in 0..MAX_LOOKUPS_PER_TENANT {
            // Polled once (places taken, thread started), then abandoned.
            let started = bounded_lookup(slow(), &tenant, &host);
            assert!(tokio::time::timeout(Duration::ZERO, started).await.is_err());
        }
        assert_eq!(tenant.available_permits(), 0);
        assert_eq!(
            host.available_permits(),
            MAX_LOOKUPS - MAX_LOOKUPS_PER_TENANT
        );
        let more = bounded_lookup(slow(), &tenant, &host).await;
        assert!(
            matches!(&more, Err(Error::DnsError { rcode: Some(r), .. }) if r.contains("too many")),
            "{more:?}"
        );
        for _ in 0..MAX_LOOKUPS_PER_TENANT {
            answer.send(()).expect("a resolver waits");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tenant.available_permits() < MAX_LOOKUPS_PER_TENANT {
            assert!(
                tokio::time::Instant::now() < deadline,
                "lookups never ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(host.available_permits(), MAX_LOOKUPS);
    }
}
