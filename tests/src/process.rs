//! The real `wharf` binary as a child process: started on a config file,
//! its JSON log read line by line, signalled and killed like in production.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};

use crate::{DEADLINE, MountToml, artemis_url, config_text, unique};

/// The `wharf` binary built beside this test binary, or the one
/// `WHARF_BIN` names (to measure another build).
pub fn wharf_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("WHARF_BIN") {
        return PathBuf::from(bin);
    }
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
pub struct WharfProcess {
    /// The process.
    pub child: Child,
    /// `None` once handed to a background reader.
    log: Option<tokio::io::Lines<BufReader<ChildStderr>>>,
    /// Lines read while waiting for `running` (a mount may attach before
    /// the process says it runs), read again before the pipe's next ones.
    early: std::collections::VecDeque<String>,
    _config: TempFile,
}

impl WharfProcess {
    /// `wharf run` with `mounts` on Artemis, once it logs that it runs.
    pub async fn start(mounts: &[MountToml]) -> anyhow::Result<WharfProcess> {
        WharfProcess::start_config(&config_text(&artemis_url(), mounts)).await
    }

    /// `wharf run` on the config `text`, once it logs that it runs.
    pub async fn start_config(text: &str) -> anyhow::Result<WharfProcess> {
        WharfProcess::start_config_with_env(text, &[]).await
    }

    /// `wharf run` on the config `text` with the environment variables
    /// `env` added, once it logs that it runs.
    pub async fn start_config_with_env(
        text: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<WharfProcess> {
        let config = TempFile::new("toml", text)?;
        let mut child = Command::new(wharf_binary())
            .args(["--log-format", "json", "run", "--config"])
            .arg(&config.0)
            .envs(env.iter().copied())
            .env("WHARF_LOG", "info,wharf=debug")
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let log = BufReader::new(child.stderr.take().expect("piped")).lines();
        let mut process = WharfProcess {
            child,
            log: Some(log),
            early: std::collections::VecDeque::new(),
            _config: config,
        };
        let mut early = Vec::new();
        loop {
            // Compiling a module (tens of MB for Python or JavaScript) is
            // one line and can take minutes on a loaded 2-core machine.
            let line = process
                .next_line(tokio::time::Instant::now() + 3 * DEADLINE)
                .await?;
            let line = line.context("wharf exited before it said it runs")?;
            if line.contains("running") {
                break;
            }
            early.push(line);
        }
        process.early = early.into();
        Ok(process)
    }

    /// The config file it runs: rewrite it, then send SIGHUP to reload.
    pub fn config_path(&self) -> &std::path::Path {
        &self._config.0
    }

    /// The next log line: one read early, else the pipe's next, by
    /// `deadline`; `None` once wharf exited.
    async fn next_line(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> anyhow::Result<Option<String>> {
        if let Some(line) = self.early.pop_front() {
            return Ok(Some(line));
        }
        let log = self
            .log
            .as_mut()
            .context("the log is read in the background")?;
        tokio::time::timeout_at(deadline, log.next_line())
            .await
            .context("no log line in time")?
            .map_err(Into::into)
    }

    /// Reads the log until each of `needles` has been in a line, in any
    /// order.
    pub async fn wait_for_each(&mut self, needles: &[&str]) -> anyhow::Result<()> {
        let mut unseen: Vec<&str> = needles.to_vec();
        while let Some(first) = unseen.first().copied() {
            let line = self
                .wait_for_log_any(&unseen)
                .await
                .with_context(|| format!("waiting for {first:?} and {} more", unseen.len() - 1))?;
            unseen.retain(|needle| !line.contains(needle));
        }
        Ok(())
    }

    /// Reads the log until a line contains any of `needles`.
    async fn wait_for_log_any(&mut self, needles: &[&str]) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let line = self
                .next_line(deadline)
                .await
                .context("no such log line")?
                .context("wharf exited")?;
            if needles.iter().any(|needle| line.contains(needle)) {
                return Ok(line);
            }
        }
    }

    /// Reads the log until `n` lines contained `needle`.
    pub async fn count_log(&mut self, needle: &str, n: usize) -> anyhow::Result<()> {
        for _ in 0..n {
            self.wait_for_log(needle).await?;
        }
        Ok(())
    }

    /// Reads the log until `times` lines contained `until`, and returns
    /// the lines that contained `wanted` meanwhile.
    pub async fn log_lines_until(
        &mut self,
        wanted: &str,
        until: &str,
        times: usize,
    ) -> anyhow::Result<Vec<String>> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let (mut seen, mut ends) = (Vec::new(), 0);
        while ends < times {
            let line = self
                .next_line(deadline)
                .await
                .with_context(|| format!("{ends} of {times} lines with {until:?} in time"))?
                .context("wharf exited")?;
            if line.contains(until) {
                ends += 1;
            } else if line.contains(wanted) {
                seen.push(line);
            }
        }
        Ok(seen)
    }

    /// From now on reads the log in the background, collecting the message
    /// id of every delivery handled and accepted (from the `handled` debug
    /// line).
    pub fn collect_handled(&mut self) -> Arc<Mutex<Vec<String>>> {
        let handled = Arc::new(Mutex::new(Vec::new()));
        let collected = handled.clone();
        let mut log = self
            .log
            .take()
            .expect("the log is read only once in the background");
        let mut early = std::mem::take(&mut self.early);
        tokio::spawn(async move {
            loop {
                let line = match early.pop_front() {
                    Some(line) => line,
                    None => match log.next_line().await {
                        Ok(Some(line)) => line,
                        _ => break,
                    },
                };
                if line.contains("\"message\":\"handled\"")
                    && line.contains("\"disposition\":\"accepted\"")
                    && let Some(id) = json_field(&line, "messaging.message.id")
                {
                    collected.lock().expect("log lock").push(id.to_owned());
                }
            }
        });
        handled
    }

    /// Every log line until one contains `needle`, that one included.
    pub async fn lines_until(&mut self, needle: &str) -> anyhow::Result<Vec<String>> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut lines = Vec::new();
        loop {
            match self.next_line(deadline).await {
                Ok(Some(line)) => {
                    let found = line.contains(needle);
                    lines.push(line);
                    if found {
                        return Ok(lines);
                    }
                }
                Ok(None) => anyhow::bail!("wharf exited before logging {needle:?}"),
                Err(e) => anyhow::bail!("no log line with {needle:?} ({e})"),
            }
        }
    }

    /// Reads the log until a line contains `needle`.
    pub async fn wait_for_log(&mut self, needle: &str) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut last = std::collections::VecDeque::new();
        let tail = |last: &std::collections::VecDeque<String>| {
            last.iter().cloned().collect::<Vec<_>>().join("\n")
        };
        loop {
            let line = match self.next_line(deadline).await {
                Ok(Some(line)) => line,
                Ok(None) => anyhow::bail!(
                    "wharf exited before logging {needle:?}; last lines:\n{}",
                    tail(&last)
                ),
                Err(e) => anyhow::bail!(
                    "no log line with {needle:?} ({e}); last lines:\n{}",
                    tail(&last)
                ),
            };
            if line.contains(needle) {
                return Ok(line);
            }
            if last.len() == 20 {
                last.pop_front();
            }
            last.push_back(line);
        }
    }
}

/// The string value of `"key":"..."` in a JSON log line.
fn json_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let end = line[start..].find('"')?;
    Some(&line[start..start + end])
}

/// A file removed when dropped.
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// A new temporary file holding `text`.
    pub fn new(extension: &str, text: &str) -> anyhow::Result<TempFile> {
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

/// The most memory the process has held resident so far (`VmHWM`), in
/// bytes.
pub fn peak_resident(wharf: &WharfProcess) -> anyhow::Result<u64> {
    let pid = wharf.child.id().context("running")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .context("no VmHWM in /proc/PID/status")?;
    Ok(kib * 1024)
}

/// The file descriptors the process holds open.
pub fn open_fds(wharf: &WharfProcess) -> anyhow::Result<usize> {
    let pid = wharf.child.id().context("running")?;
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// Sends `signal` (`-TERM`, `-HUP`) to the wharf process.
pub async fn signal(wharf: &WharfProcess, signal: &str) -> anyhow::Result<()> {
    let pid = wharf.child.id().context("running")?;
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .await?;
    anyhow::ensure!(status.success(), "kill {signal} {pid}: {status}");
    Ok(())
}
