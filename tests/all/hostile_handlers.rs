//! Hostile handlers: what a module can reach on the host is bounded, the
//! hostile delivery ends as the contract says (a failure is a `retry`), and
//! a second tenant on the same host is served throughout. Each runs the
//! `wharf` binary, so its memory and file descriptors are the host's alone,
//! and nobody reads its log while it works: a stalled log pipe must not
//! stall the host either.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context as _;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpListener;

use crate::client::{Client, message_id};
use crate::process::{WharfProcess, open_fds, peak_resident};
use crate::{MountToml, TenantToml, artemis_url, tenants_text, unique};

/// What a host serving the fixtures below may hold resident at its peak.
const RSS_BOUND: u64 = 256 << 20;

/// Deliveries of the neighbour tenant.
const NEIGHBOUR: usize = 100;

/// A hostile mount: `concurrency` handlers at once, one attempt each, its
/// failures dead-lettered to `<queue>.dlq`.
fn hostile(name: &str, queue: &str, concurrency: u32) -> MountToml {
    MountToml::new(name, "fixture_script", queue)
        .with(&format!("concurrency = {concurrency}"))
        .with("max_attempts = 1")
        .with(&format!("dead_letter = \"{queue}.dlq\""))
}

/// What became of a run beside a neighbour.
struct Report {
    /// Hostile deliveries dead-lettered.
    dead: usize,
    peak_rss: u64,
    fds_before: usize,
    fds_after: usize,
}

/// Runs the `hostile` tenant beside a neighbour tenant on one host, sends
/// `count` deliveries with `script` to each of `queues` (mounts of
/// `hostile`) and [`NEIGHBOUR`] ordinary ones to the neighbour, and waits
/// until every hostile delivery is dead-lettered and every ordinary one
/// handled.
async fn beside_a_neighbour(
    hostile: TenantToml,
    queues: &[&str],
    script: &str,
    count: usize,
    wharf_started: impl AsyncFnOnce(&mut WharfProcess) -> anyhow::Result<()>,
) -> anyhow::Result<Report> {
    let neighbour = unique("neighbour");
    let handled = format!("{neighbour}.out");
    let tenants = [
        hostile,
        TenantToml::new(
            "neighbour",
            vec![
                MountToml::new("m", "fixture_script", &neighbour)
                    .with("[tenant.mount.grants]")
                    .with(&format!("send = [\"{handled}\"]")),
            ],
        ),
    ];
    let url = artemis_url();
    let mut wharf = WharfProcess::start_config(&tenants_text(&url, "", &tenants)).await?;
    let fds_before = open_fds(&wharf)?;
    let mut client = Client::connect(&url).await?;
    let mut dead_letters = Vec::new();
    for queue in queues {
        dead_letters.push(client.watch(&format!("{queue}.dlq")).await?);
    }
    let mut outputs = client.watch(&handled).await?;
    let ids = |queue: &str, n: usize| (0..n).map(|i| format!("{queue}.{i}")).collect::<Vec<_>>();
    for queue in queues {
        client
            .publish_scripted(queue, &ids(queue, count), script)
            .await?;
    }
    client
        .publish_scripted(
            &neighbour,
            &ids(&neighbour, NEIGHBOUR),
            &format!("*:send={handled},ack"),
        )
        .await?;
    wharf_started(&mut wharf).await?;
    let mut dead = 0;
    for (queue, watcher) in queues.iter().zip(&mut dead_letters) {
        for i in 0..count {
            let (_, message) = watcher
                .next()
                .await
                .with_context(|| format!("dead letter {i} of {queue}"))?;
            anyhow::ensure!(message_id(&message).is_some_and(|id| id.starts_with(queue)));
            dead += 1;
        }
    }
    for i in 0..NEIGHBOUR {
        outputs
            .next()
            .await
            .with_context(|| format!("neighbour delivery {i}"))?;
    }
    let report = Report {
        dead,
        peak_rss: peak_resident(&wharf)?,
        fds_before,
        fds_after: open_fds(&wharf)?,
    };
    anyhow::ensure!(wharf.child.try_wait()?.is_none(), "the host exited");
    for watcher in dead_letters.into_iter().chain([outputs]) {
        watcher.close().await;
    }
    client.close().await;
    Ok(report)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_creating_header_maps_in_a_loop_is_stopped_within_its_resources()
-> anyhow::Result<()> {
    const HOSTILE: usize = 8;
    let (granted, ungranted) = (unique("fields"), unique("fields-ungranted"));
    let tenant = TenantToml::new(
        "hostile",
        vec![
            hostile("granted", &granted, 4)
                .with("[tenant.mount.grants]")
                .with("http = [\"http://127.0.0.1:9\"]"),
            hostile("ungranted", &ungranted, 4),
        ],
    );
    let report = beside_a_neighbour(
        tenant,
        &[&granted, &ungranted],
        "*:fields",
        HOSTILE,
        async |wharf| {
            wharf
                .wait_for_each(&[
                    "resource table has no free keys",
                    "which this mount does not grant; add `http = [",
                ])
                .await
        },
    )
    .await?;
    println!(
        "hostile header maps: {} deliveries of `fields` ({HOSTILE} with grants.http, stopped at {} resources; {HOSTILE} without, denied), {} dead-lettered; {NEIGHBOUR} neighbour deliveries handled; peak RSS {} MiB; open fds {} before, {} after",
        2 * HOSTILE,
        wharf::sandbox::MAX_RESOURCES,
        report.dead,
        report.peak_rss >> 20,
        report.fds_before,
        report.fds_after,
    );
    assert_eq!(report.dead, 2 * HOSTILE);
    assert!(report.peak_rss < RSS_BOUND, "{}", report.peak_rss);
    assert!(report.fds_after <= report.fds_before + 8);
    Ok(())
}

/// A TCP server that accepts connections and never answers, counting how
/// many are open at once.
struct Silent {
    port: u16,
    open: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Silent {
    async fn start() -> anyhow::Result<Silent> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (open, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (counting, peak) = (open.clone(), most.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let now = counting.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                let counting = counting.clone();
                tokio::spawn(async move {
                    // Until the client closes it.
                    while socket.read(&mut [0u8; 1024]).await.is_ok_and(|n| n > 0) {}
                    counting.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Ok(Silent { port, open, most })
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_opening_connections_without_waiting_holds_at_most_its_share()
-> anyhow::Result<()> {
    const TENANT_CAP: usize = 20;
    const REQUESTS: usize = 40;
    let server = Silent::start().await?;
    let queue = unique("connections");
    let tenant = TenantToml::new(
        "hostile",
        vec![
            hostile("open", &queue, 2)
                .with("timeout = \"3s\"")
                .with("[tenant.mount.grants]")
                .with(&format!("http = [\"http://127.0.0.1:{}\"]", server.port)),
        ],
    )
    .with(&format!("max_http_connections = {TENANT_CAP}"));
    let script = format!("*:open={REQUESTS}=127.0.0.1:{}", server.port);
    let report = beside_a_neighbour(tenant, &[&queue], &script, 2, async |_| Ok(())).await?;
    let most = server.most.load(Ordering::SeqCst);
    // Once the handlers have timed out, their connections are closed.
    let deadline = tokio::time::Instant::now() + crate::DEADLINE;
    while server.open.load(Ordering::SeqCst) > 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{} connections still open",
            server.open.load(Ordering::SeqCst)
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    println!(
        "hostile connections: 2 handlers each starting {REQUESTS} requests at once, at most {most} connections open (cap {} per instance, {TENANT_CAP} per tenant), all closed after the time-out; 2 dead-lettered; {NEIGHBOUR} neighbour deliveries handled; peak RSS {} MiB; open fds {} before, {} after",
        wharf::sandbox::MAX_CONNECTIONS_PER_INSTANCE,
        report.peak_rss >> 20,
        report.fds_before,
        report.fds_after,
    );
    assert_eq!(report.dead, 2);
    assert!(
        (wharf::sandbox::MAX_CONNECTIONS_PER_INSTANCE..=TENANT_CAP).contains(&most),
        "{most} connections open at once"
    );
    assert!(report.peak_rss < RSS_BOUND, "{}", report.peak_rss);
    assert!(report.fds_after <= report.fds_before + 8);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_logging_at_full_speed_at_error_is_held_to_its_tenants_rate_and_level()
-> anyhow::Result<()> {
    const RATE: usize = 8 << 10;
    const DELIVERIES: usize = 4;
    let queue = unique("shout");
    let tenant = TenantToml::new("hostile", vec![hostile("shout", &queue, 2)])
        .with(&format!("log_rate = {RATE}"));
    let (mut logged, mut took) = (Vec::new(), std::time::Duration::ZERO);
    let started = tokio::time::Instant::now();
    let report = beside_a_neighbour(
        tenant,
        &[&queue],
        "*:shout=262144",
        DELIVERIES,
        async |wharf| {
            // Every line up to the last shouting delivery's failure.
            logged = wharf
                .log_lines_until(
                    "shout !!!",
                    "handler failed, treating it as retry",
                    DELIVERIES,
                )
                .await?;
            took = started.elapsed();
            Ok(())
        },
    )
    .await?;
    // What the rate lets through from the host's start to the last
    // failure, and a second's burst. Without it, the per-delivery cap
    // alone would let 4 × 64 KiB through: 2,621 lines.
    let allowed = RATE * (2 + took.as_secs() as usize) / 100;
    println!(
        "hostile logging: {DELIVERIES} handlers each logging 256 KiB at error, {} lines of 100 bytes logged in {took:?} at a rate of {RATE} bytes/s (at most {allowed}), at warn; {NEIGHBOUR} neighbour deliveries handled; peak RSS {} MiB; open fds {} before, {} after",
        logged.len(),
        report.peak_rss >> 20,
        report.fds_before,
        report.fds_after,
    );
    assert!(report.peak_rss < RSS_BOUND, "{}", report.peak_rss);
    assert!(report.fds_after <= report.fds_before + 8);
    assert!(
        !logged.is_empty() && logged.len() <= allowed,
        "{} lines",
        logged.len()
    );
    for line in &logged {
        assert!(
            line.contains("\"level\":\"WARN\""),
            "not capped at warn: {line}"
        );
    }
    assert_eq!(report.dead, DELIVERIES);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_running_short_busy_handlers_at_full_rate_leaves_the_host_its_resources()
-> anyhow::Result<()> {
    const DELIVERIES: usize = 2000;
    let queue = unique("toil");
    let tenant = TenantToml::new(
        "hostile",
        vec![
            hostile("toil", &queue, 16)
                .with("[tenant.mount.grants]")
                .with("clocks = true"),
        ],
    );
    let report =
        beside_a_neighbour(tenant, &[&queue], "*:toil=1", DELIVERIES, async |_| Ok(())).await?;
    println!(
        "hostile busy handlers: {DELIVERIES} deliveries of 1 ms each, 16 at once, {} dead-lettered; {NEIGHBOUR} neighbour deliveries handled; peak RSS {} MiB; open fds {} before, {} after",
        report.dead,
        report.peak_rss >> 20,
        report.fds_before,
        report.fds_after,
    );
    assert_eq!(report.dead, DELIVERIES);
    assert!(report.peak_rss < RSS_BOUND, "{}", report.peak_rss);
    assert!(report.fds_after <= report.fds_before + 8);
    Ok(())
}
