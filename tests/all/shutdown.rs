//! Stopping: gracefully (finish, settle, publish early) and by being killed.

use crate::artemis::{assert_gone, setup};
use crate::client::{Client, TestMessage, retry_count};
use crate::process::{WharfProcess, signal};
use crate::{DEADLINE, MountToml, artemis_url, unique};

#[tokio::test]
async fn vector_11_a_killed_host_leaves_the_delivery_to_the_broker() -> anyhow::Result<()> {
    let q = unique("v11");
    let mount = MountToml::new("m", "fixture_script", &q).with("timeout = \"10m\"");
    let mut wharf = WharfProcess::start(&[mount]).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    client
        .publish(&q, TestMessage::new(&q, "stuck").header(0).script("*:spin"))
        .await?;
    wharf.wait_for_log("attempt 1: spin").await?;
    wharf.child.kill().await?;
    // No disposition was ever sent: the broker puts the message back when
    // the connection drops, and another consumer gets it.
    let mut watch = client.watch(&q).await?;
    let (_, redelivered) = watch.next_with_id(&q).await?;
    assert_eq!(crate::client::body_text(&redelivered), "stuck");
    watch.close().await;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn sigterm_publishes_held_copies_early_and_exits_cleanly() -> anyhow::Result<()> {
    let q = unique("sigterm");
    let mount = MountToml::new("m", "fixture_script", &q).with("delay = \"held\"");
    let mut wharf = WharfProcess::start(&[mount]).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    client
        .publish(&q, TestMessage::new(&q, "x").script("1:after=600000"))
        .await?;
    wharf.wait_for_log("attempt 1: after=600000").await?;
    signal(&wharf, "-TERM").await?;
    let exit = tokio::time::timeout(DEADLINE, wharf.child.wait()).await??;
    assert!(exit.success(), "wharf exited with {exit}");
    // The ten-minute copy was published at stop, not lost.
    let mut watch = client.watch(&q).await?;
    let (_, copy) = watch.next_with_id(&q).await?;
    assert_eq!(retry_count(&copy), Some(1));
    watch.close().await;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_scheduled_copy_is_on_the_broker_before_the_original_is_settled() -> anyhow::Result<()> {
    let q = unique("scheduled");
    let mut wharf = WharfProcess::start(&[MountToml::new("m", "fixture_script", &q)]).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    client
        .publish(&q, TestMessage::new(&q, "x").script("1:after=600000"))
        .await?;
    wharf.wait_for_log("\"disposition\":\"rejected\"").await?;
    // Even a crash now loses nothing: the copy waits on the broker.
    wharf.child.kill().await?;
    assert_eq!(client.artemis_scheduled_count(&q).await?, 1);
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn sighup_reloads_the_config_and_the_mounts_keep_serving() -> anyhow::Result<()> {
    let q = unique("sighup");
    let mut wharf = WharfProcess::start(&[MountToml::new("m", "fixture_script", &q)]).await?;
    // The file did not change: only the signal can make this reload.
    signal(&wharf, "-HUP").await?;
    wharf.wait_for_log("SIGHUP: reloading the config").await?;
    let reloaded = wharf.wait_for_log("config reloaded").await?;
    assert!(reloaded.contains("\"added\":\"none\""), "{reloaded}");
    let mut client = Client::connect(&artemis_url()).await?;
    client.publish(&q, TestMessage::new(&q, "x")).await?;
    wharf.wait_for_log("\"disposition\":\"accepted\"").await?;
    signal(&wharf, "-TERM").await?;
    let exit = tokio::time::timeout(DEADLINE, wharf.child.wait()).await??;
    assert!(exit.success(), "wharf exited with {exit}");
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_stop_during_a_reload_whose_module_spins_at_start_still_drains() -> anyhow::Result<()> {
    let q = unique("reload-spin");
    let url = artemis_url();
    let good = MountToml::new("m", "fixture_script", &q);
    let grace = |text: String| text.replace("shutdown_grace = \"20s\"", "shutdown_grace = \"2s\"");
    let mut wharf = WharfProcess::start_config(&grace(crate::config_text(
        &url,
        std::slice::from_ref(&good),
    )))
    .await?;
    let mut spins =
        MountToml::new("spins", "fixture_script", &unique("spins")).with("timeout = \"60s\"");
    spins.module =
        crate::limits::wat_handler_with("(start $spin) (func $spin (loop $l (br $l)))", "");
    std::fs::write(
        wharf.config_path(),
        grace(crate::config_text(&url, &[good, spins.clone()])),
    )?;
    signal(&wharf, "-HUP").await?;
    wharf
        .wait_for_log("starting the new and changed mounts' modules")
        .await?;
    // The new module spins in its start-up for up to a minute: the stop
    // must not wait for it.
    signal(&wharf, "-TERM").await?;
    let lines = wharf.lines_until("\"message\":\"stopped\"").await?;
    let exit = tokio::time::timeout(DEADLINE, wharf.child.wait()).await??;
    assert!(exit.success(), "wharf exited with {exit}");
    assert!(
        !lines
            .iter()
            .any(|line| line.contains("stopping took too long")),
        "the stop waited for the spinning module: {lines:#?}"
    );
    let _ = std::fs::remove_file(&spins.module);
    Ok(())
}

#[tokio::test]
async fn graceful_stop_lets_in_flight_handlers_finish_and_settles_them() -> anyhow::Result<()> {
    let q = unique("drain");
    // `busy` reads the clock to know when to stop.
    let (mut host, mut client) = setup(&q, &["[tenant.mount.grants]", "clocks = true"]).await?;
    client
        .publish(
            &q,
            TestMessage::new(&q, "slow").header(0).script("*:busy=1500"),
        )
        .await?;
    host.started(&q).await?;
    host.stop().await?;
    // Had the stop cut the handler short, the message would be back on the
    // queue; it was accepted instead.
    assert_gone(&mut client, &q).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_held_copy_is_published_when_the_host_stops() -> anyhow::Result<()> {
    let q = unique("early");
    let (mut host, mut client) = setup(&q, &["delay = \"held\""]).await?;
    client
        .publish(
            &q,
            TestMessage::new(&q, "x").header(0).script("1:after=600000"),
        )
        .await?;
    host.started(&q).await?;
    host.stop().await?;
    let mut watch = client.watch(&q).await?;
    let (_, copy) = watch.next_with_id(&q).await?;
    assert_eq!(retry_count(&copy), Some(1));
    watch.close().await;
    client.close().await;
    Ok(())
}

/// Stops `host` once it has handled 20 deliveries: how many it had
/// handled as the stop began, and every one it handled.
async fn stopped_after_twenty(
    mut host: crate::TestHost,
) -> anyhow::Result<(usize, std::collections::BTreeSet<String>)> {
    let mut handled = std::collections::BTreeSet::new();
    while handled.len() < 20 {
        let id = host
            .next(|e| match e {
                wharf::events::Event::Handled(h) => h.message_id.clone(),
                _ => None,
            })
            .await?;
        handled.insert(id);
    }
    let before_stop = handled.len();
    host.stop_collecting(&mut handled).await?;
    Ok((before_stop, handled))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_at_most_once_mount_handles_what_the_broker_already_sent_before_it_stops()
-> anyhow::Result<()> {
    const SENT: usize = 300;
    let url = artemis_url();
    let q = unique("amo.stop");
    let ids: Vec<String> = (0..SENT).map(|i| format!("{q}.{i}")).collect();
    let mut client = Client::connect(&url).await?;
    client.publish_scripted(&q, &ids, "*:busy=5").await?;
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("settle = \"at-most-once\"\nconcurrency = 1\ncredit = 64")
        .with("[tenant.mount.grants]\nclocks = true");
    let host = crate::TestHost::start(&url, &[mount]).await?;
    // Stopped with up to `credit` deliveries sent ahead, already settled.
    let (_, handled) = stopped_after_twenty(host).await?;
    let left = client.artemis_count(&q).await?;
    let lost = SENT as u64 - left - handled.len() as u64;
    println!(
        "at most once, stopped mid-stream: sent {SENT}, handled {}, left on the queue {left}, lost {lost}",
        handled.len()
    );
    assert_eq!(lost, 0, "deliveries sent ahead were lost at the stop");
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_at_most_once_mount_takes_nothing_new_once_its_stop_begins() -> anyhow::Result<()> {
    const SENT: usize = 2_000;
    const CREDIT: usize = 64;
    let url = artemis_url();
    let q = unique("amo.backlog");
    let ids: Vec<String> = (0..SENT).map(|i| format!("{q}.{i}")).collect();
    let mut client = Client::connect(&url).await?;
    client.publish_scripted(&q, &ids, "*:busy=10").await?;
    let mount = MountToml::new("m", "fixture_script", &q)
        .with(&format!(
            "settle = \"at-most-once\"\nconcurrency = 1\ncredit = {CREDIT}"
        ))
        .with("[tenant.mount.grants]\nclocks = true");
    let text = crate::config_text(&url, &[mount])
        .replace("shutdown_grace = \"20s\"", "shutdown_grace = \"3s\"");
    let config = wharf_core::config::Config::parse(&text, std::path::Path::new("test.toml"))?;
    let host = crate::TestHost::start_config(config).await?;
    let (before_stop, handled) = stopped_after_twenty(host).await?;
    let after_stop = handled.len() - before_stop;
    let left = client.artemis_count(&q).await?;
    let lost = SENT as u64 - left - handled.len() as u64;
    println!(
        "at most once, stopped under a backlog of {SENT}: handled {before_stop} before the stop and {after_stop} after it (credit {CREDIT}), left on the queue {left}, lost {lost}"
    );
    assert_eq!(lost, 0, "deliveries sent ahead were lost at the stop");
    // What the broker had sent, not what a renewed credit let in. (A few
    // more were running or reported as the stop began.)
    assert!(
        after_stop <= CREDIT + 8,
        "{after_stop} handled after the stop began"
    );
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_at_most_once_mount_takes_more_than_its_credit() -> anyhow::Result<()> {
    let url = artemis_url();
    let q = unique("amo.credit");
    let ids: Vec<String> = (0..50).map(|i| format!("{q}.{i}")).collect();
    let mut client = Client::connect(&url).await?;
    client.publish_scripted(&q, &ids, "*:ack").await?;
    let mount =
        MountToml::new("m", "fixture_script", &q).with("settle = \"at-most-once\"\ncredit = 10");
    let mut host = crate::TestHost::start(&url, &[mount]).await?;
    for id in &ids {
        host.handled(id).await?;
    }
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_log_into_a_pipe_carries_no_escape_codes() -> anyhow::Result<()> {
    let q = unique("plain-log");
    let config = crate::process::TempFile::new(
        "toml",
        &crate::config_text(&artemis_url(), &[MountToml::new("m", "fixture_script", &q)]),
    )?;
    let mut child = tokio::process::Command::new(crate::process::wharf_binary())
        .args(["run", "--config"])
        .arg(&config.0)
        .env_remove("NO_COLOR")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stderr = child.stderr.take().expect("piped");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
    let mut read = Vec::new();
    while !read
        .last()
        .is_some_and(|line: &String| line.contains("running"))
    {
        let line = tokio::time::timeout(DEADLINE, lines.next_line())
            .await??
            .ok_or_else(|| anyhow::anyhow!("wharf exited: {read:#?}"))?;
        read.push(line);
    }
    child.kill().await?;
    assert!(
        read.iter().all(|line| !line.contains('\u{1b}')),
        "escape codes in a piped log: {read:#?}"
    );
    Ok(())
}
