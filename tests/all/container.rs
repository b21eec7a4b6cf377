//! The OCI image `scripts/image` builds, run with podman against the
//! brokers on the host network: deliveries handled, probes answered from
//! outside, and three containers on one queue, one killed and one stopped
//! (SIGTERM) mid-stream, losing nothing.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::client::{Client, input_of_output, message_id};
use crate::tenants::http_get;
use crate::{artemis_url, guest, unique};

/// The image under test (`scripts/test` builds it with `scripts/image`).
fn image() -> String {
    std::env::var("WHARF_IMAGE").unwrap_or_else(|_| "localhost/wharf:latest".to_owned())
}

/// `podman` with the flags containers need on machines with hybrid
/// cgroups: the `runc` runtime and the cgroupfs manager.
fn podman() -> tokio::process::Command {
    let mut command = tokio::process::Command::new("podman");
    command.args(["--runtime", "runc", "--cgroup-manager=cgroupfs"]);
    command
}

async fn podman_output(args: &[&str]) -> anyhow::Result<String> {
    let output = podman().args(args).output().await?;
    anyhow::ensure!(
        output.status.success(),
        "podman {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A free loopback port for an admin listener.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A config directory as a container mounts it at `/etc/wharf`, laid out
/// as Kubernetes writes a ConfigMap volume: the files in a generation
/// directory, `..data` linking to it, and links to `..data/<file>`.
struct ConfigDir {
    path: PathBuf,
    admin: SocketAddr,
    container_id: String,
    generation: u32,
}

impl ConfigDir {
    fn new(queue: &str, out: &str) -> anyhow::Result<ConfigDir> {
        let path = std::env::temp_dir().join(unique("wharf-container"));
        std::fs::create_dir_all(&path)?;
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut dir = ConfigDir {
            path,
            admin,
            container_id: unique("wharf-container"),
            generation: 0,
        };
        dir.write(queue, out)?;
        std::os::unix::fs::symlink("..data/wharf.toml", dir.path.join("wharf.toml"))?;
        std::os::unix::fs::symlink("..data/handlers", dir.path.join("handlers"))?;
        Ok(dir)
    }

    /// Writes a new generation consuming `queue`, and swaps `..data` to
    /// it in one rename, as the kubelet does.
    fn write(&mut self, queue: &str, out: &str) -> anyhow::Result<()> {
        self.generation += 1;
        let name = format!("..generation_{}", self.generation);
        let files = self.path.join(&name);
        std::fs::create_dir_all(files.join("handlers"))?;
        std::fs::copy(guest("fixture_script"), files.join("handlers/script.wasm"))?;
        let config = format!(
            "[broker]\nurl = \"{}\"\ncontainer_id = \"{}\"\n[host]\nshutdown_grace = \"10s\"\n[admin]\nlisten = \"{}\"\n\
             [[tenant]]\nname = \"t\"\n[[tenant.mount]]\nname = \"m\"\nmodule = \"handlers/script.wasm\"\naddress = \"{queue}\"\ncredit = 20\n\
             [tenant.mount.grants]\nsend = [\"{out}\"]\n",
            artemis_url(),
            self.container_id,
            self.admin,
        );
        std::fs::write(files.join("wharf.toml"), config)?;
        // The container's user reads what root wrote.
        for (file, mode) in [
            ("", 0o755),
            ("handlers", 0o755),
            ("wharf.toml", 0o644),
            ("handlers/script.wasm", 0o644),
        ] {
            let mut permissions = std::fs::metadata(files.join(file))?.permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, mode);
            std::fs::set_permissions(files.join(file), permissions)?;
        }
        let staged = self.path.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &staged)?;
        std::fs::rename(&staged, self.path.join("..data"))?;
        Ok(())
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A running container, removed when dropped.
struct Container {
    name: String,
}

impl Container {
    async fn run(config: &Path) -> anyhow::Result<Container> {
        let name = unique("wharf");
        let volume = format!("{}:/etc/wharf:ro", config.display());
        podman_output(&[
            "run",
            "--detach",
            "--name",
            &name,
            "--network",
            "host",
            "--ulimit",
            "nofile=10000:10000",
            "--ulimit",
            "nproc=4096:4096",
            "--read-only",
            "--volume",
            &volume,
            &image(),
        ])
        .await?;
        let container = Container { name };
        container.wait_for_log("running").await?;
        Ok(container)
    }

    async fn logs(&self) -> anyhow::Result<String> {
        let output = podman().args(["logs", &self.name]).output().await?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }

    async fn wait_for_log(&self, needle: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let logs = self.logs().await?;
            if logs.contains(needle) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "container {} never logged `{needle}`:\n{logs}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn signal(&self, signal: &str) -> anyhow::Result<()> {
        podman_output(&["kill", "--signal", signal, &self.name]).await?;
        Ok(())
    }

    /// Waits until the container's process has exited; its exit code.
    async fn exited(&self) -> anyhow::Result<i64> {
        let code = podman_output(&["wait", &self.name]).await?;
        code.trim()
            .parse()
            .context("podman wait printed no exit code")
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman")
            .args([
                "--runtime",
                "runc",
                "--cgroup-manager=cgroupfs",
                "rm",
                "--force",
            ])
            .arg(&self.name)
            .output();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_image_runs_as_non_root_handles_deliveries_answers_probes_and_reloads_a_swapped_config()
-> anyhow::Result<()> {
    let inspect = podman_output(&[
        "image",
        "inspect",
        &image(),
        "--format",
        "{{.Config.User}} {{.Size}}",
    ])
    .await?;
    let mut fields = inspect.split_whitespace();
    assert_eq!(fields.next(), Some("65532:65532"), "a non-root user");
    let size: u64 = fields.next().context("a size")?.parse()?;
    println!("image {}: {:.1} MB", image(), size as f64 / 1e6);

    let q = unique("container");
    let out = format!("{q}.out");
    let mut config = ConfigDir::new(&q, &out)?;
    let container = Container::run(&config.path).await?;
    let (status, _) = http_get(config.admin, "/healthz").await?;
    assert!(status.contains("200"), "/healthz: {status}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_get(config.admin, "/readyz").await?.0.contains("200") {
        anyhow::ensure!(Instant::now() < deadline, "/readyz never said ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut client = Client::connect(&artemis_url()).await?;
    let mut outputs = client.watch(&out).await?;
    let ids: Vec<String> = (0..20).map(|n| format!("{q}.{n}")).collect();
    client
        .publish_scripted(&q, &ids, &format!("*:send={out},ack"))
        .await?;
    for _ in &ids {
        outputs.next().await?;
    }

    // A new config swapped in as the kubelet does: the mount moves to
    // another queue without a restart.
    let moved = format!("{q}.moved");
    config.write(&moved, &out)?;
    container.wait_for_log("config reloaded").await?;
    let id = format!("{moved}.1");
    client
        .publish_scripted(
            &moved,
            std::slice::from_ref(&id),
            &format!("*:send={out},ack"),
        )
        .await?;
    outputs.next().await?;
    outputs.close().await;
    client.close().await;
    let pid = podman_output(&["inspect", "--format", "{{.State.Pid}}", &container.name]).await?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim()))?;
    let peak = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .context("VmHWM")?;
    println!("peak resident after 20 deliveries: {}", peak.trim());
    container.signal("TERM").await?;
    assert_eq!(container.exited().await?, 0, "{}", container.logs().await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn three_containers_one_killed_one_stopped_mid_stream_lose_nothing() -> anyhow::Result<()> {
    let q = unique("container-scale");
    let out = format!("{q}.out");
    let configs = [
        ConfigDir::new(&q, &out)?,
        ConfigDir::new(&q, &out)?,
        ConfigDir::new(&q, &out)?,
    ];
    let mut containers = Vec::new();
    for config in &configs {
        containers.push(Container::run(&config.path).await?);
    }
    let mut client = Client::connect(&artemis_url()).await?;
    let mut outputs = client.watch(&out).await?;
    let sent = 3000;
    let ids: Vec<String> = (0..sent).map(|n| format!("{q}.{n}")).collect();
    // Half before the containers go, half after: the stream still flows.
    let script = format!("*:send={out},ack");
    client
        .publish_scripted(&q, &ids[..sent / 2], &script)
        .await?;

    let mut seen = HashSet::new();
    let mut outputs_received = 0;
    while seen.len() < sent / 10 {
        let (_, output) = outputs.next().await?;
        outputs_received += 1;
        let id = message_id(&output).context("an output id")?;
        seen.insert(input_of_output(&id, 0).context("an input id")?.to_owned());
    }
    // One killed, one stopped as Kubernetes' scale-in does.
    containers[0].signal("KILL").await?;
    let stopping = Instant::now();
    containers[1].signal("TERM").await?;
    // Not ready any more (503, or the listener gone) as soon as it stops.
    let unready = loop {
        let ready = http_get(configs[1].admin, "/readyz")
            .await
            .is_ok_and(|(status, _)| status.contains("200"));
        if !ready {
            break stopping.elapsed();
        }
        anyhow::ensure!(
            stopping.elapsed() < Duration::from_secs(2),
            "/readyz still ready 2 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    client
        .publish_scripted(&q, &ids[sent / 2..], &script)
        .await?;
    let code = containers[1].exited().await?;
    let time_to_exit = stopping.elapsed();
    assert_eq!(code, 0, "{}", containers[1].logs().await?);
    assert!(
        time_to_exit < Duration::from_secs(15),
        "exited {time_to_exit:?} after SIGTERM, past shutdown_grace + 5 s"
    );

    while seen.len() < sent {
        let (_, output) = outputs.next().await?;
        outputs_received += 1;
        let id = message_id(&output).context("an output id")?;
        seen.insert(input_of_output(&id, 0).context("an input id")?.to_owned());
    }
    let lost = ids.iter().filter(|id| !seen.contains(*id)).count();
    println!(
        "sent {sent}, handled {}, outputs received {outputs_received} (duplicates {}), lost {lost}; \
         the stopped container was unready after {} ms and exited {:.1} s after SIGTERM",
        seen.len(),
        outputs_received - seen.len(),
        unready.as_millis(),
        time_to_exit.as_secs_f64()
    );
    assert_eq!(lost, 0);
    outputs.close().await;
    client.close().await;
    Ok(())
}
