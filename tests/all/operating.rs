//! What an operator does to a running host: pause and resume a mount (or
//! a whole tenant) through the admin listener and `wharf pause|resume`,
//! with the broker's queue as the witness of what was taken and given
//! back.

use std::collections::BTreeMap;

use anyhow::Context as _;
use wharf::events::Event;
use wharf_core::config::Config;

use crate::client::Client;
use crate::process::{TempFile, wharf_binary};
use crate::{DEADLINE, MountToml, TenantToml, TestHost, repo_root, tenants_text, unique};

/// The admin lines of a host whose listener wants `token`, and the file
/// that holds it.
fn admin_with(token: &str) -> anyhow::Result<(String, TempFile)> {
    let file = TempFile::new("token", token)?;
    let lines = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n",
        file.0.display()
    );
    Ok((lines, file))
}

/// `wharf pause` or `wharf resume` against `host`'s admin listener; what it
/// printed.
async fn switch(
    host: &TestHost,
    token: &str,
    action: &str,
    target: &[&str],
) -> anyhow::Result<String> {
    let admin = host.host().admin_address().context("admin listener")?;
    let output = crate::run_tool(
        tokio::process::Command::new(wharf_binary())
            .arg(action)
            .args(["--admin", &format!("http://{admin}")])
            .args(target)
            .env("WHARF_ADMIN_TOKEN", token),
    )
    .await?;
    anyhow::ensure!(
        output.status.success(),
        "wharf {action}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A request to the admin listener with `token`: the status line and body.
async fn admin(
    host: &TestHost,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(String, String)> {
    let address = host.host().admin_address().context("admin listener")?;
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| ("Authorization", b))
        .into_iter()
        .collect();
    let answer = crate::http_request(&address.to_string(), method, path, &headers, b"").await?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    Ok((status, body.to_owned()))
}

/// What the host did with a backlog it was paused and resumed under.
#[derive(Default)]
struct Tally {
    /// Handled deliveries by message id, each with the attempts it was
    /// handled on.
    handled: BTreeMap<String, Vec<u32>>,
    started: usize,
    /// Attempts that ended in an ack, and the others.
    acked: usize,
    failed: usize,
}

impl Tally {
    fn take(&mut self, event: &Event) {
        match event {
            Event::Started { .. } => self.started += 1,
            Event::Handled(h) => {
                let id = h.message_id.clone().unwrap_or_default();
                self.handled.entry(id).or_default().push(h.attempt);
                if h.outcome == wharf_core::settlement::Outcome::Ack {
                    self.acked += 1;
                } else {
                    self.failed += 1;
                }
            }
            _ => {}
        }
    }

    fn count(&self) -> usize {
        self.handled.values().map(Vec::len).sum()
    }
}

/// Reads events into `tally` until `until` picks one; that one's value.
async fn tally_until<T>(
    host: &mut TestHost,
    tally: &mut Tally,
    until: impl Fn(&Event) -> Option<T>,
) -> anyhow::Result<T> {
    loop {
        let event = host.next_event().await?;
        tally.take(&event);
        if let Some(found) = until(&event) {
            return Ok(found);
        }
    }
}

/// A 5,000-message backlog on `address` (on the broker at `url`), a mount
/// with slow handlers paused and resumed under it with `wharf pause` and
/// `wharf resume`: the pause takes effect at once, nothing is handled past
/// what was running, what the broker had sent goes back with its
/// attempt count unchanged (a test receiver reads it from the queue
/// meanwhile), and after the resume every message is handled exactly once,
/// on its first attempt.
async fn pause_and_resume_under_a_backlog(
    url: &str,
    address: &str,
    label: &str,
    acquisitions_counted: bool,
) -> anyhow::Result<()> {
    const SENT: usize = 5_000;
    const CONCURRENCY: usize = 4;
    let token = unique("token");
    let ids: Vec<String> = (0..SENT).map(|i| format!("{address}.{i}")).collect();
    let mut client = Client::connect(url).await?;
    client.publish_scripted(address, &ids, "*:busy=2").await?;
    let mount = MountToml::new("m", "fixture_script", address)
        .with(&format!("concurrency = {CONCURRENCY}\ncredit = 100"))
        .with("[tenant.mount.grants]\nclocks = true");
    let (admin_lines, _token_file) = admin_with(&token)?;
    let text = tenants_text(url, &admin_lines, &[TenantToml::new("t", vec![mount])]);
    let mut host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    let mut tally = Tally::default();
    tally_until(&mut host, &mut tally, |e| {
        matches!(e, Event::Handled(_)).then_some(())
    })
    .await?;
    while tally.count() < 200 {
        tally_until(&mut host, &mut tally, |_| Some(())).await?;
    }

    let asked = std::time::Instant::now();
    let printed = switch(&host, &token, "pause", &["--tenant", "t", "--mount", "m"]).await?;
    assert_eq!(printed.trim(), "paused in tenant `t`: m");
    tally_until(&mut host, &mut tally, |e| {
        matches!(e, Event::MountPaused { paused: true, .. }).then_some(())
    })
    .await?;
    // The command's own start counts too: the host takes a flow frame's
    // time, the bound allows for a loaded machine starting a process.
    let took = asked.elapsed();
    assert!(
        took < std::time::Duration::from_secs(5),
        "paused after {took:?}"
    );
    let (at_pause, started_at_pause) = (tally.count(), tally.started);

    // The queue is free for anyone else: what wharf was sent came back
    // uncounted, and nothing holds it.
    for message in client.peek(address, 50).await? {
        let counted = message.header.as_ref().map_or(0, |h| h.delivery_count);
        assert_eq!(counted, 0, "a released delivery was counted as an attempt");
    }
    let (status, body) = admin(&host, "GET", "/readyz", Some(&token)).await?;
    assert!(
        status.contains("200"),
        "a paused mount is not a broken one: {status}"
    );
    assert!(
        body.contains(r#""mounts_paused":[{"tenant":"t","mount":"m"}]"#),
        "{body}"
    );
    let (_, metrics) = admin(&host, "GET", "/metrics", Some(&token)).await?;
    assert!(
        metrics.contains(r#"wharf_mount_paused{tenant="t",mount="m"} 1"#),
        "{metrics}"
    );
    // Whatever was running has finished by now, and nothing new started:
    // a delivery is taken off the link only with a handler slot, which it
    // holds until its handler has started, so at most one per slot was
    // taken before the pause and started after it. (More may finish after
    // it: a slot is given on once the call returns, before settling.)
    while tally.started > tally.count() {
        tally_until(&mut host, &mut tally, |_| Some(())).await?;
    }
    let after_pause = tally.count() - at_pause;
    let started_after = tally.started - started_at_pause;
    assert!(
        started_after <= CONCURRENCY,
        "{started_after} handlers started after the pause took effect"
    );

    let printed = switch(&host, &token, "resume", &["--tenant", "t"]).await?;
    assert_eq!(printed.trim(), "resumed in tenant `t`: m");
    let released = tally_until(&mut host, &mut tally, |e| match e {
        Event::MountPaused {
            paused: false,
            released,
            ..
        } => Some(*released),
        _ => None,
    })
    .await?;
    let deadline = tokio::time::Instant::now() + 3 * DEADLINE;
    while tally.handled.len() < SENT {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{} of {SENT} handled",
            tally.handled.len()
        );
        tally_until(&mut host, &mut tally, |_| Some(())).await?;
    }
    host.stop().await?;
    let duplicated = tally.count() - tally.handled.len();
    let not_first: Vec<(&String, &Vec<u32>)> = tally
        .handled
        .iter()
        .filter(|(_, attempts)| attempts.iter().any(|a| *a != 1))
        .collect();
    println!(
        "{label}: sent {SENT}; paused in {took:?} after {at_pause} handled, {started_after} started and {after_pause} finished after it, {released} released; resumed: handled {}, duplicated {duplicated}, lost {}",
        tally.handled.len(),
        SENT - tally.handled.len()
    );
    assert_eq!(duplicated, 0);
    if acquisitions_counted {
        // Each release is an acquisition to the broker, which wharf reads
        // as an attempt (a crash is counted so): one for wharf's, one for
        // the test receiver's, and nothing else.
        let released_twice = usize::try_from(released)? + 50;
        assert!(
            not_first.len() <= released_twice
                && not_first
                    .iter()
                    .all(|(_, attempts)| attempts.iter().all(|a| *a <= 3)),
            "{} handled past their first attempt: {not_first:?}",
            not_first.len()
        );
    } else {
        assert!(
            not_first.is_empty(),
            "handled past their first attempt: {not_first:?}"
        );
    }
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_and_resume_under_a_backlog_on_artemis() -> anyhow::Result<()> {
    let q = unique("pause");
    pause_and_resume_under_a_backlog(&crate::artemis_url(), &q, "Artemis", false).await?;
    let mut client = Client::connect(&crate::artemis_url()).await?;
    assert_eq!(client.artemis_count(&q).await?, 0, "left on the queue");
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_and_resume_under_a_backlog_on_rabbitmq4() -> anyhow::Result<()> {
    let _broker = crate::rabbitmq4_shared().await;
    let q = unique("pause");
    // A quorum queue: its delivery count must not move on a release; its
    // count of acquisitions (4.1+) does.
    wharf_tests::rabbitmq4::declare(&q, "quorum", "").await?;
    let address = format!("/queues/{q}");
    pause_and_resume_under_a_backlog(&crate::rabbitmq4_url(), &address, "RabbitMQ 4", true).await?;
    // The management API's counts lag by seconds.
    crate::wait_for_count(&q, 0, async || {
        let queue = wharf_tests::rabbitmq4::get(&format!("/api/queues/%2F/{q}")).await?;
        let queue: serde_json::Value = serde_json::from_str(&queue)?;
        // Not there at all until the first statistics are in.
        Ok(queue["messages"].as_u64().unwrap_or(u64::MAX))
    })
    .await?;
    wharf_tests::rabbitmq4::delete(&q).await
}

/// A mount the config starts paused takes nothing until resumed; an
/// operator's pause holds across a reload that leaves the mount alone;
/// pausing needs the token, and a name the host does not know is said so.
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_holds_across_reloads_and_needs_the_token() -> anyhow::Result<()> {
    let url = crate::artemis_url();
    let token = unique("token");
    let (a, b) = (unique("paused-a"), unique("paused-b"));
    let mount_a = MountToml::new("a", "ack", &a).with("paused = true");
    let (admin_lines, _token_file) = admin_with(&token)?;
    let text = tenants_text(
        &url,
        &admin_lines,
        &[TenantToml::new("t", vec![mount_a.clone()])],
    );
    let file = TempFile::new("toml", &text)?;
    let mut host = TestHost::start_config(Config::load(&file.0)?).await?;
    let mut client = Client::connect(&url).await?;
    client
        .publish(&a, crate::client::TestMessage::new("a-1", "x"))
        .await?;

    // The other tenant's requests and bad ones first: each says why.
    let (status, body) = admin(&host, "POST", "/tenants/t/mounts/a/resume", None).await?;
    assert!(status.contains("401"), "no token: {status} {body}");
    let (status, body) = admin(&host, "POST", "/tenants/t/mounts/x/resume", Some(&token)).await?;
    assert!(
        status.contains("404") && body.contains("tenant `t` has no mount `x`"),
        "{status} {body}"
    );
    let (status, body) = admin(&host, "POST", "/tenants/u/resume", Some(&token)).await?;
    assert!(
        status.contains("404") && body.contains("no tenant `u`"),
        "{status} {body}"
    );
    let (_, body) = admin(&host, "GET", "/tenants", Some(&token)).await?;
    assert!(
        body.contains(r#"{"tenant":"t","mount":"a","paused":true}"#),
        "{body}"
    );
    // Started paused: the message waits on the queue, taken by nobody,
    // and the pause is told as an operator's would be.
    assert_eq!(client.artemis_count(&a).await?, 1);
    host.next(|e| matches!(e, Event::MountPaused { paused: true, .. }).then_some(()))
        .await?;
    let (_, metrics) = admin(&host, "GET", "/metrics", Some(&token)).await?;
    assert!(
        metrics.contains(r#"wharf_mount_paused{tenant="t",mount="a"} 1"#),
        "{metrics}"
    );

    let (status, body) = admin(&host, "POST", "/tenants/t/mounts/a/resume", Some(&token)).await?;
    assert!(
        status.contains("200") && body.contains(r#""paused":false"#),
        "{status} {body}"
    );
    host.handled("a-1").await?;
    let (status, _) = admin(&host, "POST", "/tenants/t/pause", Some(&token)).await?;
    assert!(status.contains("200"), "{status}");
    host.next(|e| matches!(e, Event::MountPaused { paused: true, .. }).then_some(()))
        .await?;

    // A reload that adds a mount and leaves `a` (and its `paused = true`)
    // alone: `a` stays paused by the operator's hand, `b` serves.
    let mount_b = MountToml::new("b", "ack", &b);
    let text = tenants_text(
        &url,
        &admin_lines,
        &[TenantToml::new("t", vec![mount_a, mount_b])],
    );
    std::fs::write(&file.0, text)?;
    let change = host.host().reload().await;
    assert_eq!(change.error, None);
    assert_eq!(change.added, ["t/b"]);
    client
        .publish(&a, crate::client::TestMessage::new("a-2", "x"))
        .await?;
    client
        .publish(&b, crate::client::TestMessage::new("b-1", "x"))
        .await?;
    host.handled("b-1").await?;
    assert_eq!(
        client.artemis_count(&a).await?,
        1,
        "the paused mount took a-2"
    );
    assert!(
        !host.seen(|e| matches!(e, Event::Handled(h) if h.message_id.as_deref() == Some("a-2")))
    );

    // Without a token configured, nobody can pause.
    host.stop().await?;
    let text = tenants_text(
        &url,
        "[admin]\nlisten = \"127.0.0.1:0\"\n",
        &[TenantToml::new("t", vec![MountToml::new("b", "ack", &b)])],
    );
    let host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    let (status, body) = admin(&host, "POST", "/tenants/t/pause", None).await?;
    assert!(
        status.contains("403") && body.contains("need `token`"),
        "{status} {body}"
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// A downstream on loopback that the test stops and starts: up, it
/// answers every request `200` with the body `x`; stopped, its port
/// refuses connections.
struct Downstream {
    port: u16,
    serving: Option<tokio::task::JoinHandle<()>>,
}

impl Downstream {
    async fn start(port: u16) -> anyhow::Result<Downstream> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))?;
        let listener = socket.listen(64)?;
        let port = listener.local_addr()?.port();
        let serving = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if crate::read_request_head(&mut socket).await.is_none() {
                        return;
                    }
                    let answer =
                        "HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: close\r\n\r\nx";
                    let _ = socket.write_all(answer.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Ok(Downstream {
            port,
            serving: Some(serving),
        })
    }

    fn stop(&mut self) {
        if let Some(serving) = self.serving.take() {
            serving.abort();
        }
    }
}

/// A mount whose handlers call a downstream the test stops: the breaker
/// opens after `min_deliveries` failed attempts and the messages wait on
/// the queue instead of burning attempts; each half-open probe costs one
/// attempt; once the downstream is back a probe closes it and the backlog
/// drains. Nothing reaches the dead-letter address.
#[tokio::test(flavor = "multi_thread")]
async fn a_breaker_holds_a_backlog_while_the_downstream_is_down() -> anyhow::Result<()> {
    const SENT: usize = 50;
    const MIN_DELIVERIES: u32 = 5;
    let url = crate::artemis_url();
    let (q, dla) = (unique("breaker"), unique("breaker-dla"));
    let mut downstream = Downstream::start(0).await?;
    let port = downstream.port;
    downstream.stop();
    let origin = format!("http://127.0.0.1:{port}");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with(&format!(
            "concurrency = 1\ncredit = 10\nmax_attempts = 50\ndead_letter = \"{dla}\""
        ))
        .with(&format!(
            "[tenant.mount.breaker]\nfailure_rate = 0.5\nmin_deliveries = {MIN_DELIVERIES}\nwindow = \"30s\"\nopen_for = \"1s\""
        ))
        .with(&format!("[tenant.mount.grants]\nhttp = [\"{origin}\"]"));
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    let ids: Vec<String> = (0..SENT).map(|i| format!("{q}.{i}")).collect();
    client
        .publish_scripted(&q, &ids, &format!("*:fetch={origin}/"))
        .await?;

    let mut tally = Tally::default();
    let breaker = |e: &Event| match e {
        Event::Breaker { state, .. } => Some(*state),
        _ => None,
    };
    assert_eq!(tally_until(&mut host, &mut tally, breaker).await?, "open");
    let failed_to_open = tally.failed;
    // Two probes while the downstream is down: each one attempt, each
    // opening it again.
    for _ in 0..2 {
        assert_eq!(
            tally_until(&mut host, &mut tally, breaker).await?,
            "half-open"
        );
        assert_eq!(tally_until(&mut host, &mut tally, breaker).await?, "open");
    }
    let failed_while_down = tally.failed;
    let downstream = Downstream::start(port).await?;
    let mut probes = 2;
    loop {
        assert_eq!(
            tally_until(&mut host, &mut tally, breaker).await?,
            "half-open"
        );
        probes += 1;
        if tally_until(&mut host, &mut tally, breaker).await? == "closed" {
            break;
        }
    }
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while tally.acked < SENT {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{} of {SENT} acked",
            tally.acked
        );
        tally_until(&mut host, &mut tally, |_| Some(())).await?;
    }
    host.stop().await?;
    drop(downstream);
    // Held back, the messages kept their counts: only a failed attempt
    // spoils a message's first try.
    let first_try = tally
        .handled
        .values()
        .filter(|attempts| attempts.as_slice() == [1])
        .count();
    let dead_letters = client.artemis_count(&dla).await?;
    println!(
        "breaker: {SENT} sent; opened after {failed_to_open} failed attempts, {failed_while_down} failed while the downstream was down, {probes} probes (the last one closing it); {} acked, {} failed attempts in all, {first_try} messages handled on their first attempt, {dead_letters} dead letters",
        tally.acked, tally.failed
    );
    // The attempt that tripped it is told before the breaker opens; one
    // already running may be told in between, on another thread.
    let min = MIN_DELIVERIES as usize;
    assert!(
        (min..=min + 1).contains(&failed_to_open),
        "opened after {failed_to_open} failed attempts"
    );
    // Past the attempts that opened it and the failed probes, only the
    // deliveries already running or taken as it opened: with
    // `concurrency = 1`, one handler and one delivery waiting for it.
    let burnt = tally.failed - (MIN_DELIVERIES as usize + probes - 1);
    assert!(burnt <= 2, "{burnt} attempts burnt past the breaker");
    assert!(
        first_try >= SENT - tally.failed,
        "{first_try} handled on their first attempt"
    );
    assert_eq!(dead_letters, 0, "dead letters");
    assert_eq!(client.artemis_count(&q).await?, 0, "left on the queue");
    client.close().await;
    Ok(())
}
