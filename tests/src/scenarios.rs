//! Scenarios shared by the integration tests (which assert a floor) and the
//! benchmarks (which report the figures).

use std::time::{Duration, Instant};

use wharf::events::Event;
use wharf_core::config::Config;
use wharf_core::settlement::Disposition;

use crate::client::{Client, TestMessage};
use crate::{MountToml, TenantToml, TestHost, artemis_url, repo_root, tenants_text, unique};

/// Tenant A's throughput alone and beside tenant B's spinning handlers.
#[derive(Debug, Clone, Copy)]
pub struct NoisyNeighbour {
    /// Messages A handled in the measured window.
    pub messages: usize,
    /// How long A took with B idle.
    pub alone: Duration,
    /// How long A took while B's handlers spun at their concurrency limit.
    pub beside_spinners: Duration,
}

impl NoisyNeighbour {
    /// A's throughput beside the spinners as a fraction of its throughput
    /// alone.
    pub fn ratio(&self) -> f64 {
        self.alone.as_secs_f64() / self.beside_spinners.as_secs_f64()
    }
}

/// Runs tenant A (an acking handler) through `messages` deliveries, alone
/// and while tenant B runs `spinners` handlers that loop forever, `rounds`
/// times each, alternating so drift in the machine's load hits both alike.
pub async fn noisy_neighbour(
    messages: usize,
    spinners: u32,
    rounds: u32,
) -> anyhow::Result<NoisyNeighbour> {
    let mut figures = NoisyNeighbour {
        messages: messages * rounds as usize,
        alone: Duration::ZERO,
        beside_spinners: Duration::ZERO,
    };
    for _ in 0..rounds {
        figures.alone += a_throughput(messages, 0).await?;
        figures.beside_spinners += a_throughput(messages, spinners).await?;
    }
    Ok(figures)
}

/// How long tenant A takes for `messages` deliveries, its queue filled
/// beforehand; the first tenth are a warm-up outside the window.
async fn a_throughput(messages: usize, spinners: u32) -> anyhow::Result<Duration> {
    let url = artemis_url();
    let fast = unique("noisy-a");
    let spin = unique("noisy-b");
    let mut tenants = vec![TenantToml::new(
        "a",
        vec![MountToml::new("m", "fixture_script", &fast).with("concurrency = 8")],
    )];
    if spinners > 0 {
        // Each spin times out and comes back, so B keeps spinning at its
        // concurrency limit for as long as A is measured.
        tenants.push(TenantToml::new(
            "b",
            vec![
                MountToml::new("spin", "fixture_script", &spin)
                    .with(&format!("concurrency = {spinners}"))
                    .with("timeout = \"3s\""),
            ],
        ));
    }
    let mut client = Client::connect(&url).await?;
    for n in 0..spinners {
        let id = format!("{spin}.{n}");
        client
            .publish(&spin, TestMessage::new(&id, "x").header(0).script("*:spin"))
            .await?;
    }
    client
        .publish_many(
            &fast,
            (0..messages).map(|n| TestMessage::new(&format!("{fast}.{n}"), "x").build()),
        )
        .await?;
    let text = tenants_text(&url, "", &tenants);
    let mut host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    for _ in 0..spinners {
        host.next(|e| matches!(e, Event::Started { tenant, .. } if &**tenant == "b").then_some(()))
            .await?;
    }
    let warm_up = messages / 10;
    let mut window_start = Instant::now();
    for n in 0..messages {
        let disposition = host
            .next(|e| match e {
                Event::Handled(h) if &*h.tenant == "a" => Some(h.disposition),
                _ => None,
            })
            .await?;
        anyhow::ensure!(
            disposition == Some(Disposition::Accepted),
            "{disposition:?}"
        );
        if n + 1 == warm_up {
            window_start = Instant::now();
        }
    }
    let took = window_start.elapsed();
    host.stop().await?;
    // The spin messages go back to the queue when B stops: take them away.
    if spinners > 0 {
        let mut leftovers = client.watch(&spin).await?;
        for _ in 0..spinners {
            leftovers.next().await?;
        }
        leftovers.close().await;
    }
    client.close().await;
    Ok(took)
}

/// What one host with many tenants cost.
#[derive(Debug, Clone, Copy)]
pub struct ManyTenants {
    /// Tenants, one mount each.
    pub tenants: usize,
    /// From loading the config to every mount attached.
    pub start: Duration,
    /// Until one message on every mount was handled, after the start.
    pub first_messages: Duration,
    /// The process's resident memory once every mount has served.
    pub resident_bytes: u64,
}

/// Starts one host with `tenants` tenants of one mount each on Artemis and
/// has every mount handle one message.
pub async fn many_tenants(tenants: usize) -> anyhow::Result<ManyTenants> {
    let url = artemis_url();
    let prefix = unique("scale");
    let queues: Vec<String> = (0..tenants).map(|n| format!("{prefix}.{n}")).collect();
    let configs: Vec<TenantToml> = queues
        .iter()
        .enumerate()
        .map(|(n, q)| {
            TenantToml::new(
                &format!("tenant-{n}"),
                vec![MountToml::new("m", "fixture_script", q).with("concurrency = 2")],
            )
        })
        .collect();
    let text = tenants_text(&url, "", &configs);
    let started = Instant::now();
    let mut host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    let start = started.elapsed();
    let mut client = Client::connect(&url).await?;
    let served = Instant::now();
    for q in &queues {
        client.publish(q, TestMessage::new(q, "x")).await?;
    }
    for q in &queues {
        let handled = host.handled(q).await?;
        anyhow::ensure!(
            handled.disposition == Some(Disposition::Accepted),
            "{handled:?}"
        );
    }
    let first_messages = served.elapsed();
    let resident_bytes = resident_bytes()?;
    host.stop().await?;
    client.close().await;
    Ok(ManyTenants {
        tenants,
        start,
        first_messages,
        resident_bytes,
    })
}

/// This process's resident set size.
fn resident_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/self/status"))?;
    Ok(kib * 1024)
}
