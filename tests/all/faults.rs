//! Faults a host must live through without losing a message or stopping a
//! tenant: odd and undecodable messages, cut and half-open connections, a
//! broker restart, a crash with copies pending, a broker that blocks
//! producers, several hosts on one queue with one killed. Each test counts
//! what was sent, handled, duplicated and lost, and prints it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::broadcast::error::RecvError;

use wharf::events::Event;
use wharf_core::config::Config;
use wharf_core::settlement::Disposition;

use crate::client::{Client, TestMessage, input_of_output, message_id};
use crate::process::{WharfProcess, signal};
use crate::proxy::Proxy;
use crate::tenants::http_get;
use crate::{
    DEADLINE, MountToml, TenantToml, TestHost, artemis_url, config_text, repo_root, run_tool,
    tenants_text, unique, wait_for_count,
};

/// What a fault test counted.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    sent: usize,
    /// Deliveries handled, by message id.
    handled: BTreeMap<String, usize>,
}

impl Tally {
    fn new(sent: usize) -> Tally {
        Tally {
            sent,
            ..Tally::default()
        }
    }

    fn handled(&mut self, id: &str) {
        *self.handled.entry(id.to_owned()).or_default() += 1;
    }

    fn unique(&self) -> usize {
        self.handled.len()
    }

    fn duplicates(&self) -> usize {
        self.handled.values().map(|n| n - 1).sum()
    }

    fn lost(&self) -> usize {
        self.sent - self.unique()
    }

    /// Prints the counts and checks nothing was lost.
    pub(crate) fn report(&self, test: &str) {
        println!(
            "{test}: sent {}, handled {}, duplicated {}, lost {}",
            self.sent,
            self.unique(),
            self.duplicates(),
            self.lost()
        );
        assert_eq!(self.lost(), 0, "{test}: messages lost");
    }
}

/// Counts deliveries handed to a handler, by message id, on a thread of its
/// own, so neither a test busy elsewhere (restarting a broker) nor a host
/// running on the test's runtime keeps it from reading the event stream.
///
/// It counts what reached a handler rather than what was reported settled:
/// when a connection dies, an `accepted` may reach the broker without its
/// answer reaching the host, and a delivery in flight is abandoned without
/// an event; such a message was handled, not lost. The handlers these tests
/// run ack every delivery, and the tests check the queue is empty in the
/// end, so a message counted here was handled and nothing was left.
struct Counter {
    seen: Arc<Mutex<Seen>>,
}

#[derive(Default)]
struct Seen {
    handled: BTreeMap<String, usize>,
    /// Events the stream dropped before the counter read them: a tally with
    /// any is no proof.
    missed: u64,
}

impl Counter {
    fn start(host: &TestHost) -> Counter {
        let mut events = host.host().subscribe();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let counts = seen.clone();
        // Ends when the host drops the stream.
        std::thread::spawn(move || {
            loop {
                match events.blocking_recv() {
                    Ok(Event::Started { message_id, .. }) => {
                        if let Some(id) = message_id {
                            *counts
                                .lock()
                                .expect("counter")
                                .handled
                                .entry(id)
                                .or_default() += 1;
                        }
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(n)) => counts.lock().expect("counter").missed += n,
                    Err(RecvError::Closed) => break,
                }
            }
        });
        Counter { seen }
    }

    fn count(&self) -> anyhow::Result<usize> {
        let seen = self.seen.lock().expect("counter");
        anyhow::ensure!(
            seen.missed == 0,
            "the counter fell {} events behind the host",
            seen.missed
        );
        Ok(seen.handled.len())
    }

    /// Waits until `n` distinct messages reached a handler.
    async fn wait_for(&self, n: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while self.count()? < n {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "only {} of {n} messages handled in time",
                self.count()?
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn tally(self, sent: usize) -> Tally {
        let handled = self.seen.lock().expect("counter").handled.clone();
        Tally { sent, handled }
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}.{i}")).collect()
}

/// Publishes with the second client library (rhea): messages fe2o3 cannot
/// build.
pub(crate) async fn rhea_publish(
    url: &str,
    address: &str,
    kind: &str,
    id: &str,
    script: &str,
) -> anyhow::Result<String> {
    let peer = repo_root().join("tests/peers/rhea");
    let installed = tokio::process::Command::new(peer.join("install"))
        .status()
        .await?;
    anyhow::ensure!(installed.success(), "tests/peers/rhea/install failed");
    let output = tokio::process::Command::new("node")
        .arg(peer.join("publish.mjs"))
        .args([
            "--url",
            url,
            "--address",
            address,
            "--kind",
            kind,
            "--id",
            id,
        ])
        .args(["--script", script])
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "rhea publish {kind}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

/// At most once an unreadable delivery came settled: the planner's dead
/// letter is all that keeps it, and the host goes on.
#[tokio::test]
async fn an_unreadable_delivery_at_most_once_is_dead_lettered() -> anyhow::Result<()> {
    let url = artemis_url();
    let q = unique("odd-amo");
    let dla = format!("{q}.dla");
    let mount = MountToml::new("m", "fixture_script", &q).with(&format!(
        "settle = \"at-most-once\"\ndead_letter = \"{dla}\""
    ));
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    client
        .publish_raw(&q, vec![0x00, 0x53, 0x75, 0xa0, 0x10, 0x01])
        .await?;
    let reason = host.refused().await?;
    assert!(reason.contains("not a readable AMQP message"), "{reason}");
    wait_for_count(&dla, 1, async || client.artemis_count(&dla).await).await?;
    let after = format!("{q}.after");
    client.publish(&q, TestMessage::new(&after, "x")).await?;
    assert_eq!(host.handled(&after).await?.failure, None);
    println!("at most once: 1 unreadable sent, 1 dead-lettered, 1 readable handled after it");
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn odd_messages_from_another_client_are_handled_and_the_unreadable_rejected()
-> anyhow::Result<()> {
    let url = artemis_url();
    let q = unique("odd");
    let mount = MountToml::new("m", "fixture_script", &q).with("max_message_size = \"1MiB\"");
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    // Each kind, and what the handler must see of it to ack.
    let kinds = [
        ("list-property", "*:expect=k=[1,2]"),
        ("map-property", r#"*:expect=k={"a":1}"#),
        ("array-property", "*:expect=k=[1,2,3]"),
        (
            "described-property",
            r#"*:expect=k={"descriptor":"x:d","value":"v"}"#,
        ),
        (
            "uuid-property",
            "*:expect=k=00112233-4455-6677-8899-aabbccddeeff",
        ),
        ("sequence-body", r#"*:body=[1,"two",true]"#),
        ("value-map-body", r#"*:body={"order":7,"item":"book"}"#),
        ("value-list-body", "*:body=[1,2]"),
        ("data-sections", "*:body=abcd"),
    ];
    let mut tally = Tally::new(kinds.len());
    for (kind, script) in kinds {
        let id = format!("{q}.{kind}");
        rhea_publish(&url, &q, kind, &id, script).await?;
        let handled = host.handled(&id).await?;
        assert_eq!(handled.failure, None, "{kind}");
        assert_eq!(
            handled.disposition,
            Some(Disposition::Accepted),
            "{kind}: the handler saw something else"
        );
        tally.handled(&id);
    }
    // Too large: rejected unread, the link stays.
    rhea_publish(&url, &q, "big", &format!("{q}.big"), "*:ack").await?;
    let reason = host.refused().await?;
    assert!(reason.contains("max_message_size"), "{reason}");
    // Not AMQP sections at all: rejected with amqp:decode-error.
    client
        .publish_raw(&q, vec![0x00, 0x53, 0x75, 0xa0, 0x10, 0x01])
        .await?;
    let reason = host.refused().await?;
    assert!(reason.contains("not a readable AMQP message"), "{reason}");
    // Both rejected ones went to the broker's dead-letter queue; the host
    // goes on serving.
    let dlq = format!("DLQ.{q}");
    wait_for_count(&dlq, 2, async || client.artemis_count(&dlq).await).await?;
    client
        .publish(&q, TestMessage::new(&format!("{q}.after"), "x"))
        .await?;
    assert_eq!(
        host.handled(&format!("{q}.after")).await?.disposition,
        Some(Disposition::Accepted)
    );
    wait_for_count(&q, 0, async || client.artemis_count(&q).await).await?;
    tally.report("odd messages");
    println!("odd messages: refused 2 (oversized, undecodable), both in {dlq}");
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// A host on Artemis through `proxy`, with short reconnect waits.
async fn host_behind(
    proxy: &Proxy,
    url: &str,
    mounts: &[MountToml],
    broker_extra: &str,
) -> anyhow::Result<TestHost> {
    let mut text = config_text(&proxy.url(url), mounts);
    text = text.replacen(
        "[host]",
        &format!("reconnect_initial = \"50ms\"\nreconnect_max = \"1s\"\n{broker_extra}\n[host]"),
        1,
    );
    TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await
}

/// Two thousand deliveries of a millisecond's work each, published to `q`
/// on the broker at `url` and consumed through a proxy cut twice
/// mid-stream. Returns once every one reached a handler: the host, still
/// running behind the proxy (which must outlive it), the publishing client
/// and what was counted.
pub(crate) async fn through_two_cuts(
    url: &str,
    q: &str,
) -> anyhow::Result<(TestHost, Proxy, Client, Tally)> {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
    let upstream = authority.rsplit_once('@').map_or(authority, |(_, at)| at);
    let proxy = Proxy::start(upstream).await?;
    // A millisecond of work each, so the cuts fall mid-stream.
    let mount = MountToml::new("m", "fixture_script", q)
        .with("[tenant.mount.grants]")
        .with("clocks = true");
    let host = host_behind(&proxy, url, &[mount], "").await?;
    let counter = Counter::start(&host);
    let mut client = Client::connect(url).await?;
    let all = ids(q, 2000);
    client.publish_scripted(q, &all, "*:busy=1").await?;
    for at in [500, 1200] {
        counter.wait_for(at).await?;
        proxy.cut();
    }
    counter.wait_for(all.len()).await?;
    assert!(proxy.accepted() >= 3, "two cuts, three connections");
    Ok((host, proxy, client, counter.tally(all.len())))
}

#[tokio::test]
async fn a_reset_connection_is_attached_again_and_nothing_is_lost() -> anyhow::Result<()> {
    let q = unique("reset");
    let (host, _proxy, mut client, tally) = through_two_cuts(&artemis_url(), &q).await?;
    wait_for_count(&q, 0, async || client.artemis_count(&q).await).await?;
    tally.report("connection reset");
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_half_open_connection_is_found_by_the_idle_timeout_and_readyz_tells() -> anyhow::Result<()>
{
    let q = unique("half-open");
    let proxy = Proxy::start("127.0.0.1:5672").await?;
    let mut text = config_text(
        &proxy.url(&artemis_url()),
        &[MountToml::new("m", "fixture_script", &q)],
    );
    text = text.replacen(
        "[host]",
        "idle_timeout = \"2s\"\nreconnect_initial = \"50ms\"\nreconnect_max = \"500ms\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[host]",
        1,
    );
    let mut host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    let admin = host.host().admin_address().expect("admin listener");
    let (status, _) = http_get(admin, "/readyz").await?;
    assert!(status.contains("200"), "{status}");
    // Nothing gets through, nothing is closed: only the idle time-out can
    // tell the connection is gone.
    proxy.freeze();
    let error = host
        .next(|e| match e {
            Event::MountDown { error, .. } => Some(error.clone()),
            _ => None,
        })
        .await?;
    println!("half-open connection found: {error}");
    // Unready once the pool has counted the connection gone.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let body = loop {
        let (status, body) = http_get(admin, "/readyz").await?;
        if status.contains("503") {
            break body;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "still ready: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        body.contains("\"mount\":\"m\"") && body.contains("last_error"),
        "{body}"
    );
    let mut client = Client::connect(&artemis_url()).await?;
    let id = format!("{q}.during");
    client.publish(&q, TestMessage::new(&id, "x")).await?;
    proxy.thaw();
    assert_eq!(
        host.handled(&id).await?.disposition,
        Some(Disposition::Accepted)
    );
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (status, body) = http_get(admin, "/readyz").await?;
        if status.contains("200") {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "still not ready: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// The Artemis the restart test stops and starts: an instance of its own,
/// so other tests keep their broker.
const RESTARTABLE_PORT: &str = "5682";

async fn restartable_artemis(command: &str) -> anyhow::Result<()> {
    let status = tokio::process::Command::new(repo_root().join("scripts/artemis"))
        .arg(command)
        .env("WHARF_ARTEMIS_PORT", RESTARTABLE_PORT)
        .env("WHARF_ARTEMIS_INSTANCE", "restartable")
        .status()
        .await?;
    anyhow::ensure!(status.success(), "scripts/artemis {command}: {status}");
    Ok(())
}

#[tokio::test]
async fn a_broker_restart_mid_stream_loses_nothing() -> anyhow::Result<()> {
    let url = format!("amqp://admin:admin@127.0.0.1:{RESTARTABLE_PORT}");
    restartable_artemis("start").await?;
    let q = unique("restart");
    let all = ids(&q, 5000);
    // A millisecond of work each, two at a time, so the stop falls
    // mid-stream.
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("concurrency = 2")
        .with("[tenant.mount.grants]")
        .with("clocks = true");
    let mut text = config_text(&url, &[mount]);
    text = text.replacen(
        "[host]",
        "reconnect_initial = \"100ms\"\nreconnect_max = \"1s\"\n[host]",
        1,
    );
    let host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    // Counting before anything is published, so no delivery goes unseen.
    let counter = Counter::start(&host);
    let mut client = Client::connect(&url).await?;
    client.publish_scripted(&q, &all, "*:busy=1").await?;
    client.close().await;
    counter.wait_for(1000).await?;
    // A clean stop and start mid-stream: the journal keeps every durable
    // message not yet accepted.
    restartable_artemis("stop").await?;
    let at_stop = counter.count()?;
    restartable_artemis("start").await?;
    counter.wait_for(all.len()).await?;
    let mut client = Client::connect(&url).await?;
    wait_for_count(&q, 0, async || client.artemis_count(&q).await).await?;
    let tally = counter.tally(all.len());
    println!("broker restart: stopped after {at_stop} handled");
    tally.report("broker restart");
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// Kills a host while 200 `retry-after` copies are pending, then takes every
/// message off the queue with a plain consumer.
pub(crate) async fn killed_with_pending_copies(
    url: &str,
    address: &str,
    extra: &[&str],
    test: &str,
) -> anyhow::Result<()> {
    let mut mount = MountToml::new("m", "fixture_script", address).with("credit = 256");
    for line in extra {
        mount = mount.with(line);
    }
    let mut wharf = WharfProcess::start_config(&config_text(url, &[mount])).await?;
    let all = ids(address, 200);
    let mut client = Client::connect(url).await?;
    client
        .publish_scripted(address, &all, "1:after=3000 *:ack")
        .await?;
    // Every handler has returned `retry-after`: 200 copies are pending.
    wharf.count_log("attempt 1: after=3000", all.len()).await?;
    wharf.child.kill().await?;
    let mut tally = Tally::new(all.len());
    let mut watch = client.watch(address).await?;
    while tally.unique() < all.len() {
        let (_, message) = watch.next().await?;
        if let Some(id) = message.message_id() {
            tally.handled(&id);
        }
    }
    tally.report(test);
    watch.close().await;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_crash_with_copies_scheduled_on_artemis_loses_nothing() -> anyhow::Result<()> {
    let q = unique("kill-scheduled");
    killed_with_pending_copies(
        &artemis_url(),
        &q,
        &[],
        "SIGKILL, copies scheduled on Artemis",
    )
    .await
}

#[tokio::test]
async fn a_crash_with_copies_held_for_rabbitmq_loses_nothing() -> anyhow::Result<()> {
    let q = format!("/queue/{}", unique("kill-held"));
    killed_with_pending_copies(
        &crate::rabbitmq_url(),
        &q,
        &[],
        "SIGKILL, copies held for RabbitMQ 3.10",
    )
    .await
}

/// `rabbitmqctl` against the RabbitMQ 4 node.
pub(crate) async fn rabbitmq4_ctl(args: &[&str]) -> anyhow::Result<()> {
    let mut ctl = tokio::process::Command::new(repo_root().join("scripts/rabbitmq4"));
    let status = run_tool(ctl.arg("ctl").args(args)).await?.status;
    anyhow::ensure!(status.success(), "rabbitmqctl {args:?}: {status}");
    Ok(())
}

/// Takes messages off `addresses` until every id of `ids` was seen once.
async fn drain(
    url: &str,
    addresses: &[String],
    ids: &[String],
    tally: &mut Tally,
) -> anyhow::Result<Vec<usize>> {
    let mut client = Client::connect(url).await?;
    let mut per_address = Vec::new();
    for address in addresses {
        let mut watch = client.watch(address).await?;
        let mut taken = 0;
        while let Ok(Ok((_, message))) =
            tokio::time::timeout(Duration::from_secs(3), watch.next()).await
        {
            if let Some(id) = message.message_id() {
                tally.handled(&id);
            }
            taken += 1;
            if ids.iter().all(|id| tally.handled.contains_key(id)) {
                break;
            }
        }
        per_address.push(taken);
        watch.close().await;
    }
    client.close().await;
    Ok(per_address)
}

#[tokio::test]
async fn a_broker_that_blocks_publishers_cannot_hang_the_host_or_its_stop() -> anyhow::Result<()> {
    let _broker = crate::rabbitmq4_exclusive().await;
    let name = unique("blocked");
    let q = format!("/queue/{name}");
    let dla = format!("/queue/{name}.dlq");
    let url = crate::rabbitmq4_url();
    let all = ids(&name, 20);
    let mut client = Client::connect(&url).await?;
    client.publish_scripted(&q, &all, "*:retry").await?;
    client.close().await;
    // At the limit on the first attempt: every delivery owes a dead letter
    // the blocked broker will not take.
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("max_attempts = 1")
        .with(&format!("dead_letter = \"{dla}\""));
    let mut text = config_text(&url, &[mount]);
    text = text.replacen("[host]", "publish_timeout = \"1s\"\n[host]", 1);
    text = text.replacen("shutdown_grace = \"20s\"", "shutdown_grace = \"3s\"", 1);
    // The memory alarm: the broker stops taking messages from publishers.
    rabbitmq4_ctl(&["set_vm_memory_high_watermark", "0"]).await?;
    let stopped = async {
        let mut wharf = WharfProcess::start_config(&text).await?;
        wharf.wait_for_log("publish failed").await?;
        // Each failure hands the delivery back and the broker redelivers
        // it: the loop must run at the publish time-out's pace, not a hot one.
        let failing = tokio::time::Instant::now();
        wharf.count_log("publish failed", 2 * all.len()).await?;
        let per_second = (2 * all.len()) as f64 / failing.elapsed().as_secs_f64();
        println!(
            "blocked broker: {} failed dead-letter publishes in {:?}, {per_second:.1}/s for {} messages (publish_timeout 1s)",
            2 * all.len(),
            failing.elapsed(),
            all.len()
        );
        anyhow::ensure!(
            per_second <= 2.0 * all.len() as f64,
            "a redelivery loop faster than one failed publish per message per publish time-out"
        );
        let stopping = tokio::time::Instant::now();
        signal(&wharf, "-TERM").await?;
        let exit = tokio::time::timeout(DEADLINE, wharf.child.wait()).await??;
        anyhow::ensure!(exit.success(), "wharf exited with {exit}");
        Ok(stopping.elapsed())
    }
    .await;
    rabbitmq4_ctl(&["set_vm_memory_high_watermark", "0.4"]).await?;
    let took = stopped?;
    println!("blocked broker: SIGTERM to exit in {took:?} (shutdown_grace 3s)");
    assert!(took < Duration::from_secs(3 + 5 + 2), "stop took {took:?}");
    // Whatever could not be dead-lettered is still on the queue.
    let mut tally = Tally::new(all.len());
    let taken = drain(&url, &[q, dla], &all, &mut tally).await?;
    println!(
        "blocked broker: left on the queue {}, dead-lettered {}",
        taken[0], taken[1]
    );
    tally.report("blocked broker");
    Ok(())
}

#[tokio::test]
async fn three_hosts_on_one_queue_one_killed_lose_nothing() -> anyhow::Result<()> {
    let url = artemis_url();
    let q = unique("three");
    let out = format!("{q}.out");
    let all = ids(&q, 3000);
    let mut client = Client::connect(&url).await?;
    // Each delivery's output is committed with its ack: an output is the
    // proof a message was handled, whatever became of the host's log.
    client
        .publish_scripted(&q, &all, &format!("*:send={out},busy=3"))
        .await?;
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("concurrency = 1")
        .with("[tenant.mount.grants]")
        .with("clocks = true")
        .with(&format!("send = [\"{out}\"]"));
    let mut hosts = Vec::new();
    for _ in 0..3 {
        let mut wharf =
            WharfProcess::start_config(&config_text(&url, std::slice::from_ref(&mount))).await?;
        let handled = wharf.collect_handled();
        hosts.push((wharf, handled));
    }
    // Kill one once it is well into the queue.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while hosts[0].1.lock().expect("log").len() < 200 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the first host handled too little"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    hosts[0].0.child.kill().await?;
    wait_for_count(&q, 0, async || client.artemis_count(&q).await).await?;
    let mut per_host = Vec::new();
    for (mut wharf, handled) in hosts {
        let _ = signal(&wharf, "-TERM").await;
        let _ = tokio::time::timeout(DEADLINE, wharf.child.wait()).await;
        per_host.push(handled.lock().expect("log").len());
    }
    println!("three hosts: handled per host, by their logs, {per_host:?} (the first killed)");
    // Every host has stopped: every output is on its queue.
    let outputs = client.artemis_count(&out).await?;
    let mut tally = Tally::new(all.len());
    let mut watcher = client.watch(&out).await?;
    for _ in 0..outputs {
        let (_, output) = watcher.next().await?;
        let id = message_id(&output).context("an output without an id")?;
        tally.handled(input_of_output(&id, 0).context("an output of no input")?);
    }
    watcher.close().await;
    tally.report("three hosts, one killed");
    // Only what the killed host had in hand can come twice.
    assert!(
        tally.duplicates() <= 64,
        "{} duplicates",
        tally.duplicates()
    );
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_full_instance_pool_is_back_pressure_not_a_failed_attempt() -> anyhow::Result<()> {
    let url = artemis_url();
    let hog = unique("hog");
    let good = unique("good");
    let busy = |name, address: &str| {
        MountToml::new(name, "fixture_script", address)
            .with("concurrency = 2")
            .with("[tenant.mount.grants]")
            .with("clocks = true")
    };
    let tenants = [
        TenantToml::new("hog", vec![busy("m", &hog)]),
        TenantToml::new("good", vec![MountToml::new("m", "fixture_script", &good)]),
    ];
    // Two instances for the whole host, both taken by the hog.
    let text = tenants_text(&url, "max_instances = 2", &tenants);
    let mut host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    let mut client = Client::connect(&url).await?;
    for n in 0..2 {
        client
            .publish(
                &hog,
                TestMessage::new(&format!("{hog}.{n}"), "x").script("*:busy=1500"),
            )
            .await?;
    }
    host.started(&format!("{hog}.0")).await?;
    host.started(&format!("{hog}.1")).await?;
    client.publish(&good, TestMessage::new(&good, "x")).await?;
    let handled = host.handled(&good).await?;
    assert_eq!(handled.attempt, 1);
    assert_eq!(
        handled.failure, None,
        "waiting for an instance is not a failure"
    );
    assert_eq!(handled.disposition, Some(Disposition::Accepted));
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// Readiness is the pod's, not every mount's: one tenant's mistyped queue
/// (refused by the broker for good) leaves the pod ready and the other
/// tenant served; `/readyz` lists the mount with its error.
#[tokio::test]
async fn one_tenants_bad_address_leaves_the_pod_ready_and_the_others_served() -> anyhow::Result<()>
{
    let _shared = crate::rabbitmq4_shared().await;
    let url = crate::rabbitmq4_url();
    let good = unique("ready-good");
    wharf_tests::rabbitmq4::declare(&good, "classic", "").await?;
    let tenants = [
        TenantToml::new(
            "good",
            vec![MountToml::new(
                "m",
                "fixture_script",
                &format!("/queues/{good}"),
            )],
        ),
        TenantToml::new(
            "typo",
            vec![MountToml::new(
                "m",
                "fixture_script",
                &format!("/queues/{}", unique("no-such-queue")),
            )],
        ),
    ];
    let text = tenants_text(&url, "", &tenants).replacen(
        "[host]",
        "[admin]\nlisten = \"127.0.0.1:0\"\n[host]",
        1,
    );
    let mut host =
        TestHost::start_unattached(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    host.tenant_up("good").await?;
    host.tenant_down("typo").await?;
    let admin = host.host().admin_address().expect("admin listener");
    let (status, body) = http_get(admin, "/readyz").await?;
    assert!(status.contains("200"), "{status} {body}");
    assert!(
        body.contains("\"tenant\":\"typo\"") && body.contains("\"needs_a_fix\":true"),
        "{body}"
    );
    assert!(!body.contains("\"tenant\":\"good\""), "{body}");
    let mut client = Client::connect(&url).await?;
    client
        .publish(&format!("/queues/{good}"), TestMessage::new(&good, "x"))
        .await?;
    assert_eq!(
        host.handled(&good).await?.disposition,
        Some(Disposition::Accepted)
    );
    host.stop().await?;
    client.close().await;
    wharf_tests::rabbitmq4::delete(&good).await?;
    Ok(())
}

#[tokio::test]
async fn a_tenant_whose_broker_is_away_at_start_keeps_trying_while_the_others_serve()
-> anyhow::Result<()> {
    let url = artemis_url();
    let here = unique("here");
    let tenants = [
        TenantToml::new("here", vec![MountToml::new("m", "fixture_script", &here)]),
        TenantToml::new(
            "away",
            vec![MountToml::new("m", "fixture_script", &unique("away"))],
        )
        .with("[tenant.broker]")
        .with("url = \"amqp://admin:admin@127.0.0.1:1\"")
        .with("reconnect_initial = \"50ms\"")
        .with("reconnect_max = \"200ms\""),
    ];
    let text = tenants_text(&url, "", &tenants).replacen(
        "[host]",
        "[admin]\nlisten = \"127.0.0.1:0\"\n[host]",
        1,
    );
    let mut host =
        TestHost::start_unattached(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    host.tenant_up("here").await?;
    let mut client = Client::connect(&url).await?;
    client.publish(&here, TestMessage::new(&here, "x")).await?;
    assert_eq!(
        host.handled(&here).await?.disposition,
        Some(Disposition::Accepted)
    );
    // It keeps trying, and readiness says who is not up and why.
    for _ in 0..3 {
        host.tenant_down("away").await?;
    }
    let admin = host.host().admin_address().expect("admin listener");
    let (status, body) = http_get(admin, "/readyz").await?;
    assert!(status.contains("503"), "{status}");
    assert!(
        body.contains("\"tenant\":\"away\"") && body.contains("refused"),
        "{body}"
    );
    assert!(!body.contains("\"tenant\":\"here\""), "{body}");
    let (_, metrics) = http_get(admin, "/metrics").await?;
    assert!(
        crate::tenants::series(&metrics, "wharf_link_up", "tenant=\"here\"") == 1.0,
        "{metrics}"
    );
    assert!(
        crate::tenants::series(&metrics, "wharf_link_failures_total", "tenant=\"away\"") >= 3.0
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}
