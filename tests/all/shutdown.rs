//! Stopping: gracefully (finish, settle, publish early) and by being killed.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use wharf::settlement::Disposition;

use crate::artemis::{assert_gone, setup};
use crate::client::{Client, TestMessage, retry_count};
use crate::{DEADLINE, MountToml, artemis_url, config_text, unique};

/// The `wharf` binary built beside this test binary.
pub(crate) fn wharf_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("wharf");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build -p wharf-host; scripts/test does)",
        bin.display()
    );
    bin
}

/// `wharf run` on a config written to a temporary file, its log on a pipe.
struct WharfProcess {
    child: Child,
    log: tokio::io::Lines<BufReader<ChildStderr>>,
    _config: TempFile,
}

impl WharfProcess {
    async fn start(mounts: &[MountToml]) -> anyhow::Result<WharfProcess> {
        let config = TempFile::new("toml", &config_text(&artemis_url(), mounts))?;
        let mut child = Command::new(wharf_binary())
            .args(["--log-format", "json", "run", "--config"])
            .arg(&config.0)
            .env("WHARF_LOG", "info,wharf=debug")
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let log = BufReader::new(child.stderr.take().expect("piped")).lines();
        let mut process = WharfProcess {
            child,
            log,
            _config: config,
        };
        process.wait_for_log("running").await?;
        Ok(process)
    }

    /// Reads the log until a line contains `needle`.
    async fn wait_for_log(&mut self, needle: &str) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let line = tokio::time::timeout_at(deadline, self.log.next_line())
                .await
                .with_context(|| format!("no log line with {needle:?} in time"))??
                .with_context(|| format!("wharf exited before logging {needle:?}"))?;
            if line.contains(needle) {
                return Ok(line);
            }
        }
    }
}

struct TempFile(PathBuf);

impl TempFile {
    fn new(extension: &str, text: &str) -> anyhow::Result<TempFile> {
        let path = std::env::temp_dir().join(format!("{}.{extension}", unique("wharf-test")));
        std::fs::write(&path, text)?;
        Ok(TempFile(path))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

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
async fn sigterm_publishes_pending_delayed_copies_and_exits_cleanly() -> anyhow::Result<()> {
    let q = unique("sigterm");
    let mut wharf = WharfProcess::start(&[MountToml::new("m", "fixture_script", &q)]).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    client
        .publish(&q, TestMessage::new(&q, "x").script("1:after=600000"))
        .await?;
    wharf
        .wait_for_log("\"disposition\":\"Some(Rejected)\"")
        .await?;
    signal(&wharf, "-TERM").await?;
    let exit = tokio::time::timeout(DEADLINE, wharf.child.wait()).await??;
    assert!(exit.success(), "wharf exited with {exit}");
    // The ten-minute copy was published at stop, not lost.
    let mut watch = client.watch(&q).await?;
    let (_, copy) = watch.next_with_id(&q).await?;
    assert!(copy.header.is_none());
    assert_eq!(retry_count(&copy), Some(1));
    watch.close().await;
    client.close().await;
    Ok(())
}

/// Sends `signal` (`-TERM`, `-HUP`) to the wharf process.
async fn signal(wharf: &WharfProcess, signal: &str) -> anyhow::Result<()> {
    let pid = wharf.child.id().context("running")?;
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .await?;
    anyhow::ensure!(status.success(), "kill {signal} {pid}: {status}");
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
    assert!(reloaded.contains("\"added\":\"[]\""), "{reloaded}");
    let mut client = Client::connect(&artemis_url()).await?;
    client.publish(&q, TestMessage::new(&q, "x")).await?;
    wharf
        .wait_for_log("\"disposition\":\"Some(Accepted)\"")
        .await?;
    signal(&wharf, "-TERM").await?;
    let exit = tokio::time::timeout(DEADLINE, wharf.child.wait()).await??;
    assert!(exit.success(), "wharf exited with {exit}");
    client.close().await;
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
async fn delayed_copy_is_published_when_the_host_stops() -> anyhow::Result<()> {
    let q = unique("early");
    let (mut host, mut client) = setup(&q, &[]).await?;
    client
        .publish(
            &q,
            TestMessage::new(&q, "x").header(0).script("1:after=600000"),
        )
        .await?;
    assert_eq!(
        host.handled(&q).await?.disposition,
        Some(Disposition::Rejected)
    );
    host.stop().await?;
    let mut watch = client.watch(&q).await?;
    let (_, copy) = watch.next_with_id(&q).await?;
    assert_eq!(retry_count(&copy), Some(1));
    watch.close().await;
    client.close().await;
    Ok(())
}
