//! What the end-to-end benchmarks share: the brokers, prefilled queues,
//! a native fe2o3 connection for the hand-written baselines, hosts and
//! their rate.

use std::time::{Duration, Instant};

use fe2o3_amqp::Connection;
use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::types::messaging::{Body, Data, Message, Properties};
use fe2o3_amqp::types::primitives::{Binary, Value};
use wharf_core::config::Config;
use wharf_core::endpoint::Endpoint;
use wharf_core::message::AmqpMessage;

use crate::client::Client;
use crate::{MountToml, TenantToml, TestHost, repo_root, tenants_text, unique};

/// Host logs to stderr at `warn` unless `WHARF_LOG` says otherwise:
/// measured is the host, not the terminal.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WHARF_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The number in the environment variable `name`, else `default`.
fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Messages per measurement: `WHARF_BENCH_MESSAGES`, else `default`.
pub fn messages(default: usize) -> usize {
    count_from_env("WHARF_BENCH_MESSAGES", default)
}

/// Rounds per measured case: `WHARF_BENCH_ROUNDS`, else `default`.
pub fn rounds(default: usize) -> usize {
    count_from_env("WHARF_BENCH_ROUNDS", default).max(1)
}

/// The median of `values` (the upper one of an even count).
pub fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The median over rounds of `figure` in `measured` against `figure` in
/// the same round's `baseline`: a round shares its drift with its
/// baseline.
pub fn median_ratio<T>(baseline: &[T], measured: &[T], figure: impl Fn(&T) -> f64) -> f64 {
    median(
        baseline
            .iter()
            .zip(measured)
            .map(|(base, it)| figure(it) / figure(base).max(1e-12)),
    )
}

/// A broker to measure on.
pub struct Broker {
    /// Its name in the report.
    pub name: &'static str,
    /// Its URL.
    pub url: String,
    /// How an address becomes the queue it names on this broker.
    pub queue: fn(&str) -> String,
}

/// Artemis, RabbitMQ 4, ActiveMQ Classic and Qpid Broker-J, or the one
/// whose name contains the first argument that is not a flag.
pub fn brokers() -> Vec<Broker> {
    let only = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.to_lowercase());
    let all = [
        Broker {
            name: "Artemis 2.40",
            url: crate::artemis_url(),
            queue: |name| name.to_owned(),
        },
        Broker {
            name: "RabbitMQ 4.0",
            url: crate::rabbitmq4_url(),
            queue: |name| format!("/queue/{name}"),
        },
        Broker {
            name: "ActiveMQ Classic 6.3",
            url: crate::activemq_url(),
            queue: |name| name.to_owned(),
        },
        Broker {
            name: "Qpid Broker-J 9.2",
            url: crate::qpid_url(),
            queue: |name| name.to_owned(),
        },
    ];
    all.into_iter()
        .filter(|b| {
            only.as_deref()
                .is_none_or(|o| b.name.to_lowercase().contains(o))
        })
        .collect()
}

/// A message with `id` and a `data` body of `size` bytes, and the
/// application properties given.
pub fn message(id: String, size: usize, properties: &[(&str, &str)]) -> AmqpMessage {
    let mut message: AmqpMessage = Message::builder()
        .properties(Properties::builder().message_id(id).build())
        .body(Body::<Value>::Data(
            vec![Data(Binary::from(vec![b'x'; size]))].into(),
        ))
        .build()
        .into();
    if !properties.is_empty() {
        message.application_properties = Some(
            properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
                .collect(),
        );
    }
    message
}

/// Publishes `n` messages from `make` (given their index) to `address`.
pub async fn prefill(
    url: &str,
    address: &str,
    n: usize,
    make: impl Fn(usize) -> AmqpMessage,
) -> anyhow::Result<()> {
    let mut client = Client::connect(url).await?;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        // Now and then a sender stalls mid-chunk on Artemis, the broker
        // idle and the client waiting (twice in ~450 prefills of
        // 200,000): the chunk goes again on a new connection. The queue
        // then holds up to a chunk more than `n`, which nothing measured
        // counts on.
        loop {
            let messages = chunk.iter().map(|i| make(*i));
            let sent = client.publish_many(address, messages);
            if let Ok(sent) = tokio::time::timeout(Duration::from_secs(30), sent).await {
                break sent?;
            }
            eprintln!("prefill: a chunk for {address} stalled; sending it again");
            client = Client::connect(url).await?;
        }
    }
    client.close().await;
    Ok(())
}

/// A plain fe2o3 connection with `TCP_NODELAY`, for a hand-written
/// baseline.
pub async fn native_connection(url: &str) -> anyhow::Result<ConnectionHandle<()>> {
    let endpoint = Endpoint::parse(url).map_err(anyhow::Error::msg)?;
    let stream =
        wharf::broker::socket::connect(&endpoint.host, endpoint.port, Duration::from_secs(10))
            .await?;
    Ok(Connection::builder()
        .container_id(unique("native"))
        .hostname(endpoint.host.as_str())
        .sasl_profile(SaslProfile::Plain {
            username: endpoint.user.clone().unwrap_or_default(),
            password: endpoint.password.clone().unwrap_or_default(),
        })
        .open_with_stream(stream)
        .await?)
}

/// A host with `mounts` on `broker`, started and attached.
pub async fn host(broker: &Broker, mounts: Vec<MountToml>) -> anyhow::Result<TestHost> {
    host_with(broker, mounts, "").await
}

/// [`host`], with `top` (whole sections, e.g. `[telemetry]`) added to the
/// config.
pub async fn host_with(
    broker: &Broker,
    mounts: Vec<MountToml>,
    top: &str,
) -> anyhow::Result<TestHost> {
    let text = tenants_text(&broker.url, top, &[TenantToml::new("bench", mounts)]).replacen(
        "[host]",
        "[admin]\nlisten = \"127.0.0.1:0\"\n[host]",
        1,
    );
    TestHost::start_config(Config::parse(&text, &repo_root().join("bench.toml"))?).await
}

/// Waits for `n` deliveries; their rate from the first seen to the last.
pub async fn rate(host: &TestHost, n: usize) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut first = None;
    loop {
        let count = host.host().handled_total() as usize;
        if count > 0 && first.is_none() {
            first = Some((Instant::now(), count));
        }
        if count >= n {
            let (at, already) = first.expect("one was seen");
            return Ok((count - already) as f64 / at.elapsed().as_secs_f64());
        }
        anyhow::ensure!(Instant::now() < deadline, "only {count} of {n} handled");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
