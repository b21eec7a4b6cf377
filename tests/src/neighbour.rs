//! A tenant's service beside a hostile one on the same `wharf` process:
//! its throughput draining a backlog and its latency at a steady rate,
//! with and without the hostile tenant, for the benchmarks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::client::{Client, TestMessage, message_id};
use crate::process::{WharfProcess, signal};
use crate::{MountToml, TenantToml, artemis_url, tenants_text, unique};

/// What a hostile tenant runs: a fixture script on a mount of its own, its
/// queue kept topped up while the neighbour is measured.
#[derive(Debug, Clone)]
pub struct HostileLoad {
    /// What the report calls it.
    pub name: &'static str,
    /// The fixture's script for every hostile delivery.
    pub script: String,
    /// Extra lines of the hostile mount (`concurrency`, grants...).
    pub mount: Vec<String>,
    /// Extra lines of the hostile tenant.
    pub tenant: Vec<String>,
}

/// The neighbour's figures in one run.
#[derive(Debug, Clone, Copy)]
pub struct NeighbourFigures {
    /// Deliveries a second while draining a backlog.
    pub throughput: f64,
    /// Publish-to-output latency at a steady rate below saturation.
    pub p50: Duration,
    /// The 99th percentile of the same.
    pub p99: Duration,
    /// Hostile deliveries the host took off their queue meanwhile.
    pub hostile_taken: u64,
}

/// Deliveries published one by one at [`STEADY_EVERY`] for the latency.
const STEADY: usize = 1000;
const STEADY_EVERY: Duration = Duration::from_millis(4);
/// Hostile deliveries kept queued (topped up in batches).
const HOSTILE_QUEUED: u64 = 4000;
const HOSTILE_BATCH: usize = 500;

/// Runs the neighbour (a handler that sends one output and acks) on a
/// `wharf` process, beside `hostile` when given, and measures it: its
/// throughput over a `backlog` of deliveries (the first tenth warm up; a
/// longer one is a steadier figure), then its latency.
pub async fn neighbour_beside(
    hostile: Option<&HostileLoad>,
    backlog: usize,
) -> anyhow::Result<NeighbourFigures> {
    let url = artemis_url();
    let neighbour = unique("calm");
    let outputs_address = format!("{neighbour}.out");
    let hostile_queue = unique("hostile");
    let mut tenants = vec![TenantToml::new(
        "neighbour",
        vec![
            MountToml::new("m", "fixture_script", &neighbour)
                .with("concurrency = 8")
                .with("[tenant.mount.grants]")
                .with(&format!("send = [\"{outputs_address}\"]")),
        ],
    )];
    if let Some(load) = hostile {
        let mut mount = MountToml::new("m", "fixture_script", &hostile_queue)
            .with("max_attempts = 1")
            .with(&format!("dead_letter = \"{hostile_queue}.dlq\""));
        for line in &load.mount {
            mount = mount.with(line);
        }
        let mut tenant = TenantToml::new("hostile", vec![mount]);
        for line in &load.tenant {
            tenant = tenant.with(line);
        }
        tenants.push(tenant);
    }
    let script = format!("*:send={outputs_address},ack");
    let mut client = Client::connect(&url).await?;
    let mut outputs = client.watch(&outputs_address).await?;
    let ids: Vec<String> = (0..backlog).map(|i| format!("{neighbour}.b{i}")).collect();
    client.publish_scripted(&neighbour, &ids, &script).await?;
    let stop_topping = Arc::new(AtomicBool::new(false));
    let topper = hostile.map(|load| {
        tokio::spawn(top_up(
            url.clone(),
            hostile_queue.clone(),
            load.script.clone(),
            stop_topping.clone(),
        ))
    });
    if hostile.is_some() {
        // The hostile queue is full before the host starts.
        let mut depth = 0;
        let deadline = Instant::now() + crate::DEADLINE;
        while depth < HOSTILE_QUEUED / 2 {
            anyhow::ensure!(Instant::now() < deadline, "the hostile queue stays empty");
            depth = client.artemis_count(&hostile_queue).await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut wharf = WharfProcess::start_config(&tenants_text(&url, "", &tenants)).await?;
    let mut window_start = None;
    for i in 0..backlog {
        outputs
            .next()
            .await
            .with_context(|| format!("backlog output {i}"))?;
        if i + 1 == backlog / 10 {
            window_start = Some(Instant::now());
        }
    }
    let window = window_start.expect("the backlog has a warm-up").elapsed();
    let throughput = (backlog - backlog / 10) as f64 / window.as_secs_f64();
    let (mut publisher, mut sent) = (Client::connect(&url).await?, Vec::with_capacity(STEADY));
    let steady = tokio::spawn(async move {
        let mut every = tokio::time::interval(STEADY_EVERY);
        for i in 0..STEADY {
            every.tick().await;
            let id = format!("{neighbour}.s{i}");
            let at = Instant::now();
            publisher
                .publish(
                    &neighbour,
                    TestMessage::new(&id, "x").header(0).script(&script),
                )
                .await?;
            sent.push(at);
        }
        publisher.close().await;
        anyhow::Ok(sent)
    });
    let mut arrived = vec![None; STEADY];
    for _ in 0..STEADY {
        let (at, message) = outputs.next().await.context("steady output")?;
        let id = message_id(&message).context("an output without an id")?;
        let index = id
            .split_once(".s")
            .and_then(|(_, rest)| rest.split(['#', '/']).next()?.parse::<usize>().ok())
            .with_context(|| format!("output {id}"))?;
        arrived[index] = Some(at);
    }
    let sent = steady.await??;
    let mut latencies: Vec<Duration> = sent
        .iter()
        .zip(&arrived)
        .map(|(sent, arrived)| arrived.expect("every output arrived").duration_since(*sent))
        .collect();
    latencies.sort();
    let percentile = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    stop_topping.store(true, Ordering::Relaxed);
    let topped = match topper {
        Some(task) => task.await??,
        None => 0,
    };
    anyhow::ensure!(wharf.child.try_wait()?.is_none(), "the host exited");
    signal(&wharf, "-TERM").await?;
    tokio::time::timeout(crate::DEADLINE, wharf.child.wait())
        .await
        .context("the host did not stop")??;
    outputs.close().await;
    let mut hostile_taken = 0;
    if hostile.is_some() {
        let left = drain(&mut client, &hostile_queue).await?;
        drain(&mut client, &format!("{hostile_queue}.dlq")).await?;
        hostile_taken = topped.saturating_sub(left);
    }
    client.close().await;
    Ok(NeighbourFigures {
        throughput,
        p50: percentile(50),
        p99: percentile(99),
        hostile_taken,
    })
}

/// Keeps about [`HOSTILE_QUEUED`] deliveries of `script` on `queue` until
/// stopped; returns how many it published.
async fn top_up(
    url: String,
    queue: String,
    script: String,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<u64> {
    let mut client = Client::connect(&url).await?;
    let mut published = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if client.artemis_count(&queue).await? < HOSTILE_QUEUED {
            // Built before publishing: a spawned task cannot hold the
            // iterator `publish_scripted` builds across its awaits.
            let batch: Vec<_> = (0..HOSTILE_BATCH)
                .map(|i| {
                    let id = format!("{queue}.{}", published + i as u64);
                    TestMessage::new(&id, "x").header(0).script(&script).build()
                })
                .collect();
            client.publish_many(&queue, batch).await?;
            published += HOSTILE_BATCH as u64;
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    client.close().await;
    Ok(published)
}

/// Takes every message off `queue`; returns how many there were.
async fn drain(client: &mut Client, queue: &str) -> anyhow::Result<u64> {
    let count = client.artemis_count(queue).await?;
    if count > 0 {
        let mut watcher = client.watch(queue).await?;
        for _ in 0..count {
            watcher.next().await?;
        }
        watcher.close().await;
    }
    Ok(count)
}
