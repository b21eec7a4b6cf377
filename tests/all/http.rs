//! Handlers that call HTTP services: only origins the mount grants, never
//! an address handlers must not reach, and a slow server is the handler's
//! time-out. The servers are plain sockets the test answers itself.

use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use rustls::pki_types::PrivatePkcs8KeyDer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use wharf_core::config::Config;
use wharf_core::settlement::Disposition;

use crate::client::{Client, TestMessage};
use crate::process::WharfProcess;
use crate::{
    MountToml, TenantToml, TestHost, artemis_url, assert_failed, repo_root, start_with_client,
    tenants_text, unique,
};

/// An HTTP/1.1 server on loopback: `GET /echo/TEXT` answers `TEXT`,
/// `GET /prices/A-1` answers `9.50`, `GET /slow` is never answered and
/// anything else is not found. It keeps every request line it read.
struct Server {
    origin: String,
    /// Each request's request line, then its header lines.
    requests: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Server {
    async fn start() -> anyhow::Result<Server> {
        Server::serve(None).await
    }

    /// The same over TLS, with a certificate for `127.0.0.1` and
    /// `localhost` signed by a CA it returns (PEM).
    async fn start_tls() -> anyhow::Result<(Server, String)> {
        let (ca, cert, key) = wharf_tests::tls_broker::server_certificate()?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.into()], PrivatePkcs8KeyDer::from(key).into())?;
        let server = Server::serve(Some(TlsAcceptor::from(Arc::new(config)))).await?;
        Ok((server, ca))
    }

    async fn serve(tls: Option<TlsAcceptor>) -> anyhow::Result<Server> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let origin = format!("{scheme}://127.0.0.1:{}", listener.local_addr()?.port());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (seen, tls) = (seen.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(tls) => {
                            if let Ok(socket) = tls.accept(socket).await {
                                answer(socket, &seen).await;
                            }
                        }
                        None => answer(socket, &seen).await,
                    }
                });
            }
        });
        Ok(Server { origin, requests })
    }

    fn origin(&self) -> String {
        self.origin.clone()
    }

    /// The request line of each request.
    fn requests(&self) -> Vec<String> {
        self.heads()
            .into_iter()
            .map(|head| head[0].clone())
            .collect()
    }

    /// Each request's request line and header lines.
    fn heads(&self) -> Vec<Vec<String>> {
        self.requests.lock().expect("not poisoned").clone()
    }
}

/// Reads one request from `socket` into `seen` and answers it.
async fn answer(mut socket: impl AsyncRead + AsyncWrite + Unpin, seen: &Mutex<Vec<Vec<String>>>) {
    let Some(head) = crate::read_request_head(&mut socket).await else {
        return;
    };
    let lines: Vec<String> = head
        .lines()
        .take_while(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let line = lines.first().cloned().unwrap_or_default();
    seen.lock().expect("not poisoned").push(lines);
    let path = line.split(' ').nth(1).unwrap_or_default();
    let (status, text) = match path {
        "/slow" => {
            // Holds the connection open, answering nothing.
            let _ = socket.read(&mut [0; 1]).await;
            return;
        }
        "/prices/A-1" => ("200 OK", "9.50"),
        _ => match path.strip_prefix("/echo/") {
            Some(text) => ("200 OK", text),
            None => ("404 Not Found", ""),
        },
    };
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = socket.write_all(answer.as_bytes()).await;
    let _ = socket.shutdown().await;
}

fn mount(name: &str, address: &str, http: &[&str], extra: &[&str]) -> MountToml {
    let mut mount = MountToml::new(name, "fixture_script", address);
    for line in extra {
        mount = mount.with(line);
    }
    if http.is_empty() {
        return mount;
    }
    let http: Vec<String> = http.iter().map(|o| format!("\"{o}\"")).collect();
    mount
        .with("[tenant.mount.grants]")
        .with(&format!("http = [{}]", http.join(", ")))
}

/// Publishes one message to `queue` that fetches `url` expecting `body`
/// back, and returns its first handling.
async fn fetch(
    host: &mut TestHost,
    client: &mut Client,
    queue: &str,
    url: &str,
    body: &str,
) -> anyhow::Result<wharf::events::Handled> {
    let id = unique("fetch");
    let message = TestMessage::new(&id, body).script(&format!("*:fetch={url}"));
    client.publish(queue, message).await?;
    host.handled(&id).await
}

#[tokio::test]
async fn a_handler_reaches_the_origins_it_is_granted_and_nothing_else() -> anyhow::Result<()> {
    let (granted, other) = (Server::start().await?, Server::start().await?);
    let (listed, wildcard, none) = (unique("http"), unique("http-any"), unique("http-none"));
    let mounts = [
        mount("listed", &listed, &[&granted.origin()], &[]),
        mount("wildcard", &wildcard, &["*://*:*"], &[]),
        mount("none", &none, &[], &[]),
    ];
    let (mut host, mut client) = start_with_client(&artemis_url(), &mounts).await?;
    let at = |server: &Server, text: &str| format!("{}/echo/{text}", server.origin());

    // The granted origin answers, and the handler acks on its answer.
    let handled = fetch(
        &mut host,
        &mut client,
        &listed,
        &at(&granted, "pong"),
        "pong",
    )
    .await?;
    assert_eq!(
        handled.disposition,
        Some(Disposition::Accepted),
        "{handled:?}"
    );
    assert_eq!(granted.requests(), ["GET /echo/pong HTTP/1.1"]);

    // Another port of the same host is another origin: denied, and the
    // request never leaves (the fixture drops on a denial).
    let handled = fetch(&mut host, &mut client, &listed, &at(&other, "x"), "x").await?;
    assert_eq!(
        handled.disposition,
        Some(Disposition::Rejected),
        "{handled:?}"
    );
    // Without `grants.http` there is no `wasi:http`: the first call fails
    // the handler, naming the grant.
    let handled = fetch(&mut host, &mut client, &none, &at(&granted, "y"), "y").await?;
    assert_failed(&handled, "which this mount does not grant; add `http = [");

    // A wildcard reaches neither a metadata nor a link-local address: those
    // only a grant naming their IP reaches.
    for guarded in ["http://169.254.169.254/latest", "http://169.254.1.1:8080/"] {
        let handled = fetch(&mut host, &mut client, &wildcard, guarded, "z").await?;
        assert_eq!(
            handled.disposition,
            Some(Disposition::Rejected),
            "{guarded}: {handled:?}"
        );
    }
    assert_eq!(granted.requests().len(), 1, "{:?}", granted.requests());
    assert!(other.requests().is_empty(), "{:?}", other.requests());
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// Fetches each of `urls` through the mount on `queue` and returns the
/// dispositions.
async fn fetch_all(
    host: &mut TestHost,
    client: &mut Client,
    queue: &str,
    urls: &[String],
) -> anyhow::Result<Vec<Option<Disposition>>> {
    let mut dispositions = Vec::new();
    for url in urls {
        dispositions.push(fetch(host, client, queue, url, "p").await?.disposition);
    }
    Ok(dispositions)
}

#[tokio::test]
async fn a_wildcard_reaches_no_private_address_unless_the_host_allows_it() -> anyhow::Result<()> {
    let server = Server::start().await?;
    let port = server
        .origin()
        .rsplit_once(':')
        .map(|(_, p)| p.to_owned())
        .context("port")?;
    let (wildcard, named) = (unique("http-any"), unique("http-named"));
    let mounts = [
        mount("wildcard", &wildcard, &["*://*:*"], &["max_attempts = 1"]),
        mount(
            "named",
            &named,
            &[&format!("http://localhost:{port}")],
            &["max_attempts = 1"],
        ),
    ];
    let text = |host_extra: &str| {
        tenants_text(
            &artemis_url(),
            host_extra,
            &[TenantToml::new("t", mounts.to_vec())],
        )
    };
    let (mut host, mut client) = (
        TestHost::start_config(Config::parse(&text(""), &repo_root().join("t.toml"))?).await?,
        Client::connect(&artemis_url()).await?,
    );
    // Loopback by IP, by name, IPv4-mapped; 10.0.0.1 through NAT64; an
    // RFC 1918 address: each refused before any connection is tried (the
    // fixture drops on a refusal and retries on any other failure).
    let private: Vec<String> = [
        format!("http://127.0.0.1:{port}/echo/p"),
        format!("http://localhost:{port}/echo/p"),
        format!("http://[::ffff:127.0.0.1]:{port}/echo/p"),
        format!("http://[64:ff9b::a00:1]:{port}/echo/p"),
        format!("http://10.255.255.1:{port}/echo/p"),
    ]
    .into();
    let refused = fetch_all(&mut host, &mut client, &wildcard, &private).await?;
    assert_eq!(
        refused,
        vec![Some(Disposition::Rejected); private.len()],
        "{private:?}"
    );
    // A grant naming the host reaches it.
    let by_name = [format!("http://localhost:{port}/echo/p")];
    let reached = fetch_all(&mut host, &mut client, &named, &by_name).await?;
    assert_eq!(reached, [Some(Disposition::Accepted)]);
    assert_eq!(server.requests().len(), 1, "{:?}", server.requests());
    host.stop().await?;

    // With `allow_private_networks` the wildcard reaches loopback too.
    let config = Config::parse(
        &text("allow_private_networks = true"),
        &repo_root().join("t.toml"),
    )?;
    let mut host = TestHost::start_config(config).await?;
    let reached = fetch_all(&mut host, &mut client, &wildcard, &private[..2]).await?;
    assert_eq!(reached, [Some(Disposition::Accepted); 2]);
    assert_eq!(server.requests().len(), 3, "{:?}", server.requests());
    println!(
        "http: a wildcard grant refused {} private addresses, a named host reached, {} reached with allow_private_networks",
        private.len(),
        reached.len()
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_server_that_never_answers_is_the_handlers_time_out() -> anyhow::Result<()> {
    let server = Server::start().await?;
    let q = unique("http-slow");
    let mounts = [mount(
        "m",
        &q,
        &[&server.origin()],
        &["timeout = \"1s\"", "max_attempts = 1"],
    )];
    let (mut host, mut client) = start_with_client(&artemis_url(), &mounts).await?;
    let url = format!("{}/slow", server.origin());
    let handled = fetch(&mut host, &mut client, &q, &url, "x").await?;
    assert_failed(&handled, "timeout");
    assert_eq!(server.requests(), ["GET /slow HTTP/1.1"]);
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn the_enrich_example_prices_an_order_and_publishes_it() -> anyhow::Result<()> {
    let prices = Server::start().await?;
    let (orders, enriched) = (unique("orders"), unique("orders-enriched"));
    let service = format!("{}/prices", prices.origin());
    let mounts = [MountToml::new("enrich", "enrich", &orders)
        .with("[tenant.mount.grants]")
        .with(&format!("http = [\"{}\"]", prices.origin()))
        .with(&format!("send = [\"{enriched}\"]"))
        .with(&format!(
            "env = {{ PRICES_URL = \"{service}\", ENRICHED_ADDRESS = \"{enriched}\" }}"
        ))];
    let (mut host, mut client) = start_with_client(&artemis_url(), &mounts).await?;
    let (known, unknown) = (unique("known"), unique("unknown"));
    let mut watch = client.watch(&enriched).await?;
    client
        .publish(
            &orders,
            TestMessage::new(&known, r#"{"sku": "A-1", "qty": 2}"#),
        )
        .await?;
    client
        .publish(
            &orders,
            TestMessage::new(&unknown, r#"{"sku": "Z-9", "qty": 1}"#),
        )
        .await?;
    assert_eq!(
        host.handled(&known).await?.disposition,
        Some(Disposition::Accepted)
    );
    assert_eq!(
        host.handled(&unknown).await?.disposition,
        Some(Disposition::Rejected)
    );
    let (_, message) = watch.next().await?;
    let order: serde_json::Value = serde_json::from_slice(&crate::client::body_bytes(&message))?;
    assert_eq!(
        order,
        serde_json::json!({"sku": "A-1", "qty": 2, "unit_price": 9.5, "total": 19.0})
    );
    let output_id = message.message_id().unwrap_or_default();
    assert_eq!(
        crate::client::input_of_output(&output_id, 0),
        Some(known.as_str())
    );
    let mut asked = prices.requests();
    asked.sort();
    assert_eq!(
        asked,
        ["GET /prices/A-1 HTTP/1.1", "GET /prices/Z-9 HTTP/1.1"]
    );
    watch.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn https_reaches_a_server_whose_ca_the_platform_trusts() -> anyhow::Result<()> {
    let (server, ca) = Server::start_tls().await?;
    let ca_file = crate::process::TempFile::new("pem", &ca)?;
    let q = unique("https");
    let text = crate::config_text(&artemis_url(), &[mount("m", &q, &[&server.origin()], &[])]);
    // The platform's CA store is the one `SSL_CERT_FILE` names.
    let ca_path = ca_file.0.display().to_string();
    let mut wharf =
        WharfProcess::start_config_with_env(&text, &[("SSL_CERT_FILE", &ca_path)]).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    let id = unique("fetch");
    let url = format!("{}/echo/hi", server.origin());
    client
        .publish(
            &q,
            TestMessage::new(&id, "hi").script(&format!("*:fetch={url}")),
        )
        .await?;
    wharf.wait_for_log("\"disposition\":\"accepted\"").await?;
    assert_eq!(server.requests(), ["GET /echo/hi HTTP/1.1"]);
    drop(wharf);
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn javascript_fetch_goes_through_the_same_grants() -> anyhow::Result<()> {
    let (granted, other) = (Server::start().await?, Server::start().await?);
    let q = unique("http-js");
    let mounts = [MountToml::new("m", "fixture_fetch_js", &q)
        .with("[tenant.mount.grants]")
        .with(&format!("http = [\"{}\"]", granted.origin()))];
    let (mut host, mut client) = start_with_client(&artemis_url(), &mounts).await?;
    for (server, expected) in [
        (&granted, Disposition::Accepted),
        (&other, Disposition::Rejected),
    ] {
        let id = unique("fetch-js");
        let url = format!("{}/echo/hi", server.origin());
        let message = TestMessage::new(&id, "hi").property("url", url.as_str().into());
        client.publish(&q, message).await?;
        let handled = host.handled(&id).await?;
        assert_eq!(handled.disposition, Some(expected), "{url}: {handled:?}");
    }
    assert_eq!(granted.requests(), ["GET /echo/hi HTTP/1.1"]);
    assert!(other.requests().is_empty(), "{:?}", other.requests());
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn the_admin_listener_is_reached_only_through_a_grant_naming_it() -> anyhow::Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let admin = format!("127.0.0.1:{port}");
    let (wildcard, listed) = (unique("http-admin-any"), unique("http-admin-listed"));
    let tenant = TenantToml::new(
        "t",
        vec![
            mount("wildcard", &wildcard, &["*://*:*"], &[]),
            mount("listed", &listed, &[&format!("http://{admin}")], &[]),
        ],
    );
    let text = tenants_text(
        &artemis_url(),
        &format!("[admin]\nlisten = \"{admin}\""),
        &[tenant],
    );
    let config = Config::parse(&text, std::path::Path::new("wharf.toml"))?;
    let mut host = TestHost::start_config(config).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    // `/healthz` answers "ok\n", the body the fixture wants back.
    let healthz = format!("http://{admin}/healthz");
    let handled = fetch(&mut host, &mut client, &wildcard, &healthz, "ok\n").await?;
    assert_eq!(
        handled.disposition,
        Some(Disposition::Rejected),
        "{handled:?}"
    );
    let handled = fetch(&mut host, &mut client, &listed, &healthz, "ok\n").await?;
    assert_eq!(
        handled.disposition,
        Some(Disposition::Accepted),
        "{handled:?}"
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_request_carries_the_trace_of_the_delivery_that_made_it() -> anyhow::Result<()> {
    use fe2o3_amqp::types::primitives::SimpleValue;
    use wharf_core::trace::{TRACEPARENT, TraceContext};
    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let server = Server::start().await?;
    let queue = unique("http-trace");
    let (mut host, mut client) = start_with_client(
        &artemis_url(),
        &[mount("traced", &queue, &[&server.origin()], &[])],
    )
    .await?;
    let url = format!("{}/echo/traced", server.origin());
    for parent in [Some(PARENT), None] {
        let id = unique("fetch");
        let mut message = TestMessage::new(&id, "traced").script(&format!("*:fetch={url}"));
        if let Some(parent) = parent {
            message = message.property(TRACEPARENT, SimpleValue::String(parent.to_owned()));
        }
        client.publish(&queue, message).await?;
        let handled = host.handled(&id).await?;
        assert_eq!(
            handled.disposition,
            Some(Disposition::Accepted),
            "{handled:?}"
        );
    }
    let heads = server.heads();
    let traceparent = |head: &[String]| {
        head.iter()
            .find_map(|line| line.strip_prefix("traceparent: ").map(str::to_owned))
    };
    let sent = traceparent(&heads[0]).expect("the traced delivery's request has a traceparent");
    let context = TraceContext::parse(&sent).expect("a valid traceparent");
    assert_eq!(context.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
    assert_ne!(
        context.span_id_hex(),
        "b7ad6b7169203331",
        "a span of its own"
    );
    assert_eq!(traceparent(&heads[1]), None, "no context, none sent");
    println!("the request carried traceparent: {sent}");
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_is_a_client_span_below_its_delivery() -> anyhow::Result<()> {
    use fe2o3_amqp::types::primitives::SimpleValue;
    use wharf_core::trace::{TRACEPARENT, TraceContext};
    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let collector = crate::collector::Collector::start().await?;
    let server = Server::start().await?;
    let queue = unique("http-span");
    let mut host = TestHost::start_traced(
        vec![mount("traced", &queue, &[&server.origin()], &[])],
        &format!("endpoint = \"{}\"", collector.http),
    )
    .await?;
    let mut client = Client::connect(&artemis_url()).await?;
    let url = format!("{}/echo/traced", server.origin());
    let id = unique("fetch");
    let message = TestMessage::new(&id, "traced")
        .script(&format!("*:fetch={url}"))
        .property(TRACEPARENT, SimpleValue::String(PARENT.to_owned()));
    client.publish(&queue, message).await?;
    host.handled(&id).await?;
    let sent = server.heads()[0]
        .iter()
        .find_map(|line| line.strip_prefix("traceparent: ").map(str::to_owned))
        .expect("the request carries a traceparent");
    let sent = TraceContext::parse(&sent).expect("a valid traceparent");
    let spans = collector
        .wait_until(std::time::Duration::from_secs(30), |spans| {
            spans.iter().any(|s| s.span_id == sent.span_id_hex())
                && spans.iter().any(|s| s.name == format!("process {queue}"))
        })
        .await?;
    let request = spans
        .iter()
        .find(|s| s.span_id == sent.span_id_hex())
        .expect("the request's span");
    let process = spans
        .iter()
        .find(|s| s.name == format!("process {queue}"))
        .expect("the delivery's span");
    assert_eq!(request.name, "GET");
    assert_eq!(request.kind, "client");
    assert_eq!(request.parent_span_id, process.span_id);
    assert_eq!(request.attribute("http.request.method"), "GET");
    assert_eq!(request.attribute("http.response.status_code"), "200");
    assert_eq!(request.attribute("url.full"), url);
    client.close().await;
    host.stop().await
}
