//! Helpers for wharf's integration tests and benchmarks: a test AMQP
//! client, config builders, and a host running in the test process.
//!
//! The brokers must be running (`scripts/test` starts them): Apache Artemis
//! on `WHARF_ARTEMIS_URL` (default `amqp://admin:admin@127.0.0.1:5672`) and
//! RabbitMQ 3.10 on `WHARF_RABBITMQ_URL` (default
//! `amqp://guest:guest@127.0.0.1:5673`) and RabbitMQ 4 on
//! `WHARF_RABBITMQ4_URL` (default `amqp://guest:guest@127.0.0.1:5674`). Guest components come from
//! `build/guests` (`scripts/build-guests`).

pub mod artemis_users;
pub mod bench;
pub mod client;
pub mod collector;
pub mod hostile_messages;
pub mod neighbour;
pub mod process;
pub mod proxy;
pub mod rabbitmq4;
pub mod registry;
pub mod sandbox;
pub mod scenarios;
pub mod tls_broker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::sync::broadcast;
use wharf::events::{Event, Handled};
use wharf::{Host, RunningHost};
use wharf_core::config::Config;

/// How long any one expected thing may take on a loaded 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The Artemis broker the tests use.
pub fn artemis_url() -> String {
    std::env::var("WHARF_ARTEMIS_URL")
        .unwrap_or_else(|_| "amqp://admin:admin@127.0.0.1:5672".into())
}

/// The RabbitMQ broker the tests use.
pub fn rabbitmq_url() -> String {
    std::env::var("WHARF_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5673".into())
}

/// RabbitMQ 4 is shared by the tests that use it; the one that blocks every
/// publisher on it takes it alone.
static RABBITMQ4: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Held by a test that uses RabbitMQ 4 as it is.
pub async fn rabbitmq4_shared() -> tokio::sync::RwLockReadGuard<'static, ()> {
    RABBITMQ4.read().await
}

/// Held by a test that changes RabbitMQ 4 for every client (its memory
/// alarm).
pub async fn rabbitmq4_exclusive() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    RABBITMQ4.write().await
}

/// The RabbitMQ 4 broker the tests use.
pub fn rabbitmq4_url() -> String {
    std::env::var("WHARF_RABBITMQ4_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5674".into())
}

/// The ActiveMQ Classic broker the tests use (`scripts/activemq`).
pub fn activemq_url() -> String {
    std::env::var("WHARF_ACTIVEMQ_URL")
        .unwrap_or_else(|_| "amqp://admin:admin@127.0.0.1:5675".into())
}

/// The Qpid Broker-J the tests use (`scripts/qpid`).
pub fn qpid_url() -> String {
    std::env::var("WHARF_QPID_URL").unwrap_or_else(|_| "amqp://admin:admin@127.0.0.1:5676".into())
}

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// A compiled guest from `build/guests`.
pub fn guest(name: &str) -> PathBuf {
    let path = repo_root()
        .join("build/guests")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/build-guests",
        path.display()
    );
    path
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!(
        "{prefix}.{}.{nanos}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Polls `count` until the queue it counts holds `expected` messages.
pub async fn wait_for_count(
    queue: &str,
    expected: u64,
    mut count: impl AsyncFnMut() -> anyhow::Result<u64>,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let found = count().await?;
        if found == expected {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "queue {queue} holds {found} messages, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The head of the HTTP request `socket` carries, as text, once it has all
/// arrived; `None` if the client leaves first.
pub async fn read_request_head(socket: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<String> {
    use tokio::io::AsyncReadExt as _;
    let mut head = Vec::new();
    let mut buf = [0; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// One HTTP/1.0 request to `address` (`host:port`) with `headers` and
/// `body` (its `Content-Length` added but to a bodiless `GET`); the whole
/// answer as text, once the server closes.
pub async fn http_request(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let mut head = format!("{method} {path} HTTP/1.0\r\nHost: {address}\r\n");
    for (name, value) in headers {
        head += &format!("{name}: {value}\r\n");
    }
    if method != "GET" || !body.is_empty() {
        head += &format!("Content-Length: {}\r\n", body.len());
    }
    head += "\r\n";
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// How long a broker's command-line tool may take: a node busy with
/// another test can leave `rabbitmqctl` waiting without end.
pub const TOOL_DEADLINE: Duration = Duration::from_secs(20);

/// Runs a broker's command-line tool, its output captured, killed and
/// reported (naming it) if it does not finish within [`TOOL_DEADLINE`].
pub async fn run_tool(
    command: &mut tokio::process::Command,
) -> anyhow::Result<std::process::Output> {
    let name = format!("{:?}", command.as_std());
    let output = command.kill_on_drop(true).output();
    tokio::time::timeout(TOOL_DEADLINE, output)
        .await
        .with_context(|| format!("{name} did not finish within {TOOL_DEADLINE:?}"))?
        .with_context(|| format!("{name} did not start"))
}

/// One `[[tenant.mount]]` table, as TOML lines after `name`/`module`/`address`.
#[derive(Clone)]
pub struct MountToml {
    /// The mount's name.
    pub name: String,
    /// The component file.
    pub module: PathBuf,
    /// The subscription address.
    pub address: String,
    /// More TOML lines of the mount table.
    pub extra: String,
}

impl MountToml {
    /// A mount of the built guest `module` on `address`.
    pub fn new(name: &str, module: &str, address: &str) -> MountToml {
        MountToml {
            name: name.to_owned(),
            module: guest(module),
            address: address.to_owned(),
            extra: String::new(),
        }
    }

    /// Adds a TOML line to the mount table.
    pub fn with(mut self, line: &str) -> MountToml {
        self.extra.push_str(line);
        self.extra.push('\n');
        self
    }
}

/// One `[[tenant]]` table: extra TOML lines after `name`, then its mounts.
#[derive(Clone)]
pub struct TenantToml {
    /// The tenant's name.
    pub name: String,
    /// More TOML lines of the tenant table, before its mounts.
    pub extra: String,
    /// The tenant's mounts.
    pub mounts: Vec<MountToml>,
}

impl TenantToml {
    /// A tenant with `mounts`.
    pub fn new(name: &str, mounts: Vec<MountToml>) -> TenantToml {
        TenantToml {
            name: name.to_owned(),
            extra: String::new(),
            mounts,
        }
    }

    /// Adds a TOML line to the tenant table.
    pub fn with(mut self, line: &str) -> TenantToml {
        self.extra.push_str(line);
        self.extra.push('\n');
        self
    }
}

/// The text of a config file with one tenant `t` holding `mounts`.
pub fn config_text(url: &str, mounts: &[MountToml]) -> String {
    tenants_text(url, "", &[TenantToml::new("t", mounts.to_vec())])
}

/// The text of a config file with `tenants`, and `host_extra` lines at the
/// top level (after `[broker]` and `[host]`).
pub fn tenants_text(url: &str, host_extra: &str, tenants: &[TenantToml]) -> String {
    let mut text = format!(
        "[broker]\nurl = \"{url}\"\ncontainer_id = \"{}\"\n[host]\nshutdown_grace = \"20s\"\n{host_extra}\n",
        unique("wharf-test")
    );
    for tenant in tenants {
        text.push_str(&format!(
            "[[tenant]]\nname = \"{}\"\n{}",
            tenant.name, tenant.extra
        ));
        for m in &tenant.mounts {
            text.push_str(&format!(
                "[[tenant.mount]]\nname = \"{}\"\nmodule = \"{}\"\naddress = \"{}\"\n{}",
                m.name,
                m.module.display(),
                m.address,
                m.extra
            ));
        }
    }
    text
}

/// A host running in this process, and the stream of what it does.
pub struct TestHost {
    host: Option<RunningHost>,
    events: broadcast::Receiver<Event>,
    /// Events read while looking for another one, oldest first.
    backlog: Vec<Event>,
}

impl TestHost {
    /// Starts a host and waits until every mount is attached.
    pub async fn start(url: &str, mounts: &[MountToml]) -> anyhow::Result<TestHost> {
        let text = config_text(url, mounts);
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await
    }

    /// Starts a host with `mounts` in tenant `t` on Artemis, its spans
    /// exported as the lines of a `[telemetry]` section say (within 100 ms
    /// of their end), and waits until every mount is attached.
    pub async fn start_traced(mounts: Vec<MountToml>, telemetry: &str) -> anyhow::Result<TestHost> {
        let text = tenants_text(
            &artemis_url(),
            &format!("[telemetry]\nexport_delay = \"100ms\"\n{telemetry}\n"),
            &[TenantToml::new("t", mounts)],
        );
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await
    }

    /// Starts a host on `config` and waits until every mount is attached.
    pub async fn start_config(config: Config) -> anyhow::Result<TestHost> {
        let mounts = config.mounts().count();
        let mut host = TestHost::start_unattached(config).await?;
        let mut ready = Vec::new();
        for _ in 0..mounts {
            ready.push(
                host.next(|e| matches!(e, Event::MountReady { .. }).then(|| e.clone()))
                    .await?,
            );
        }
        // Kept for tests that look at what the broker offered.
        host.backlog.extend(ready);
        Ok(host)
    }

    /// Starts a host on `config` without waiting for any mount to attach.
    pub async fn start_unattached(config: Config) -> anyhow::Result<TestHost> {
        init_logging();
        let host = Host::load(config).await?;
        let events = host.subscribe();
        Ok(TestHost {
            host: Some(host.start().await?),
            events,
            backlog: Vec::new(),
        })
    }

    /// Why the next delivery the host settled without its handler was
    /// refused.
    pub async fn refused(&mut self) -> anyhow::Result<String> {
        self.next(|e| match e {
            Event::Refused { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .await
    }

    /// The first event (from the backlog, then the stream) that `pick`
    /// takes; the others stay for later calls.
    pub async fn next<T>(&mut self, pick: impl Fn(&Event) -> Option<T>) -> anyhow::Result<T> {
        if let Some(i) = self.backlog.iter().position(|e| pick(e).is_some()) {
            let event = self.backlog.remove(i);
            return Ok(pick(&event).expect("picked above"));
        }
        loop {
            let event = next_event(&mut self.events).await?;
            match pick(&event) {
                Some(found) => return Ok(found),
                None => self.backlog.push(event),
            }
        }
    }

    /// The next event, whatever it is: from the backlog first, then the
    /// stream.
    pub async fn next_event(&mut self) -> anyhow::Result<Event> {
        if !self.backlog.is_empty() {
            return Ok(self.backlog.remove(0));
        }
        next_event(&mut self.events).await
    }

    /// Whether an event `pick` takes has already arrived (without waiting).
    pub fn seen(&mut self, pick: impl Fn(&Event) -> bool) -> bool {
        while let Ok(event) = self.events.try_recv() {
            self.backlog.push(event);
        }
        self.backlog.iter().any(pick)
    }

    /// The most handlers that ran at once until `n` deliveries were
    /// handled, by the host's own account; a delivery refused unread is an
    /// error.
    pub async fn most_at_once(&mut self, n: usize) -> anyhow::Result<usize> {
        let (mut running, mut most, mut handled) = (0usize, 0, 0);
        while handled < n {
            match self.next_event().await? {
                Event::Started { .. } => {
                    running += 1;
                    most = most.max(running);
                }
                Event::Handled(_) => {
                    running -= 1;
                    handled += 1;
                }
                Event::Refused { reason, .. } => bail!("refused: {reason}"),
                _ => {}
            }
        }
        Ok(most)
    }

    /// Every delivery handled so far (without waiting), oldest first.
    pub fn handled_so_far(&mut self) -> Vec<Handled> {
        self.seen(|_| false);
        self.backlog
            .iter()
            .filter_map(|e| match e {
                Event::Handled(h) => Some(h.clone()),
                _ => None,
            })
            .collect()
    }

    /// Waits until a mount of `tenant` is attached.
    pub async fn tenant_up(&mut self, tenant: &str) -> anyhow::Result<()> {
        self.next(|e| {
            matches!(e, Event::MountReady { tenant: t, .. } if &**t == tenant).then_some(())
        })
        .await
    }

    /// Waits until a mount of `tenant` goes down (or fails to attach).
    pub async fn tenant_down(&mut self, tenant: &str) -> anyhow::Result<()> {
        self.next(|e| {
            matches!(e, Event::MountDown { tenant: t, .. } if &**t == tenant).then_some(())
        })
        .await
    }

    /// The next handled delivery of message `id`.
    pub async fn handled(&mut self, id: &str) -> anyhow::Result<Handled> {
        self.next(|e| match e {
            Event::Handled(h) if h.message_id.as_deref() == Some(id) => Some(h.clone()),
            _ => None,
        })
        .await
    }

    /// Waits until a handler has started on message `id`.
    pub async fn started(&mut self, id: &str) -> anyhow::Result<()> {
        self.next(|e| match e {
            Event::Started { message_id, .. } if message_id.as_deref() == Some(id) => Some(()),
            _ => None,
        })
        .await
    }

    /// The next `n` handled deliveries of message `id`, by attempt: a copy
    /// may be handled before the delivery it was copied from has reported.
    pub async fn handled_n(&mut self, id: &str, n: usize) -> anyhow::Result<Vec<Handled>> {
        let mut all = Vec::with_capacity(n);
        while all.len() < n {
            all.push(self.handled(id).await?);
        }
        all.sort_by_key(|h| h.attempt);
        Ok(all)
    }

    /// The running host.
    pub fn host(&self) -> &RunningHost {
        self.host.as_ref().expect("running until stopped")
    }

    /// Shuts the host down gracefully, adding to `handled` the message id
    /// of every delivery handled until it stopped.
    pub async fn stop_collecting(
        mut self,
        handled: &mut std::collections::BTreeSet<String>,
    ) -> anyhow::Result<()> {
        let Some(host) = self.host.take() else {
            return Ok(());
        };
        let mut shutdown = tokio::spawn(host.shutdown());
        let take = |event: Event, handled: &mut std::collections::BTreeSet<String>| {
            if let Event::Handled(h) = event
                && let Some(id) = h.message_id
            {
                handled.insert(id);
            }
        };
        for event in self.backlog.drain(..) {
            take(event, handled);
        }
        let stopped = loop {
            tokio::select! {
                event = self.events.recv() => match event {
                    Ok(event) => take(event, handled),
                    Err(broadcast::error::RecvError::Lagged(n)) => bail!("missed {n} events"),
                    Err(broadcast::error::RecvError::Closed) => break (&mut shutdown).await,
                },
                stopped = &mut shutdown => break stopped,
            }
        };
        while let Ok(event) = self.events.try_recv() {
            take(event, handled);
        }
        stopped?;
        Ok(())
    }
    /// Shuts the host down gracefully.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(host) = self.host.take() {
            tokio::time::timeout(DEADLINE, host.shutdown())
                .await
                .context("host did not stop in time")?;
        }
        Ok(())
    }
}

/// Starts a host with `mounts` on the broker at `url` and connects a test
/// client to the same broker.
pub async fn start_with_client(
    url: &str,
    mounts: &[MountToml],
) -> anyhow::Result<(TestHost, client::Client)> {
    let host = TestHost::start(url, mounts).await?;
    let client = client::Client::connect(url).await?;
    Ok((host, client))
}

/// Asserts that the handler failed, for a reason that mentions `reason`.
pub fn assert_failed(handled: &Handled, reason: &str) {
    assert!(
        handled
            .failure
            .as_deref()
            .is_some_and(|f| f.contains(reason)),
        "expected a failure mentioning {reason:?}: {handled:?}"
    );
}

/// Host logs go to the test's captured output: shown only when it fails.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WHARF_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

async fn next_event(events: &mut broadcast::Receiver<Event>) -> anyhow::Result<Event> {
    match tokio::time::timeout(DEADLINE, events.recv()).await {
        Ok(Ok(event)) => Ok(event),
        Ok(Err(e)) => bail!("event stream: {e}"),
        Err(_) => bail!("no event within {DEADLINE:?}"),
    }
}
