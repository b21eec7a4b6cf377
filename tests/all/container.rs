//! The OCI image `scripts/image` builds, run with podman against the
//! brokers on the host network: deliveries handled, probes answered from
//! outside, and three containers on one queue, one killed and one stopped
//! (SIGTERM) mid-stream, losing nothing.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;

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

/// The pod the Helm chart renders, run by `podman kube play` on the host
/// network: its ConfigMap and Secret volumes, probes and module cache as
/// the chart writes them. The ConfigMap volume is then rewritten as the
/// kubelet swaps one: a config naming a module that arrives a second
/// later (the modules' volume updated apart) reloads once it is there.
///
/// What podman 4.3 needs that Kubernetes does not: a Secret volume is read
/// from a podman secret holding the Secret's YAML (whose `data` it writes
/// out undecoded), its `optional` written out (podman dereferences it); no
/// declared ports on the host network.
#[tokio::test(flavor = "multi_thread")]
async fn the_charts_pod_runs_under_podman_kube_play_and_awaits_a_late_module() -> anyhow::Result<()>
{
    use base64::Engine as _;
    let release = unique("kp").replace('.', "-");
    let (q, late) = (unique("kube-play"), unique("kube-play-late"));
    let out = format!("{q}.out");
    let port = free_port()?;
    let secret = format!("{release}-secrets");
    let modules = format!("{release}-modules");
    let tenants = |late_mount: bool| {
        let mount = |name: &str, module: &str, queue: &str| {
            format!(
                "[[tenant.mount]]\nname = \"{name}\"\nmodule = \"/var/lib/wharf/modules/{module}\"\naddress = \"{queue}\"\n[tenant.mount.grants]\nsend = [\"{out}\"]\n"
            )
        };
        let mut text = format!(
            "[[tenant]]\nname = \"t\"\n{}",
            mount("m", "script.wasm", &q)
        );
        if late_mount {
            text += &mount("late", "late.wasm", &late);
        }
        text
    };
    let values = std::env::temp_dir().join(format!("{release}.yaml"));
    std::fs::write(
        &values,
        serde_json::to_string(&serde_json::json!({
            "image": {"repository": image().rsplit_once(':').map_or(image(), |(r, _)| r.to_owned()), "tag": "latest"},
            "broker": {"url": "amqp://127.0.0.1:5672", "user": "admin"},
            "admin": {"port": port},
            "secretName": secret,
            "modulesConfigMap": modules,
            "tenants": tenants(false),
        }))?,
    )?;
    let mut documents =
        crate::kubernetes::helm_documents(&[&format!("--values={}", values.display())])?;
    std::fs::remove_file(&values)?;
    documents.retain(|d| ["ConfigMap", "Deployment"].contains(&d["kind"].as_str().unwrap_or("")));
    let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    documents.push(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": modules},
        "binaryData": {"script.wasm": encode(&std::fs::read(guest("fixture_script"))?)},
    }));
    // podman names a pod's volumes after them and keeps them: each is
    // made this run's own, so no earlier run's content is served.
    let mut volumes = Vec::new();
    for document in &mut documents {
        if document["kind"] == "ConfigMap" && document["metadata"]["name"] != modules.as_str() {
            let name = format!("{release}-{}", text(document, "/metadata/name"));
            document["metadata"]["name"] = name.into();
        }
        if document["kind"] != "Deployment" {
            continue;
        }
        let pod = &mut document["spec"]["template"]["spec"];
        for volume in pod["volumes"].as_array_mut().context("volumes")? {
            volume["name"] = format!("{release}-{}", text(volume, "/name")).into();
            if volume["secret"].is_object() {
                volume["secret"]["optional"] = false.into();
            }
            if let Some(name) = volume["configMap"]["name"].as_str()
                && name != modules
            {
                volume["configMap"]["name"] = format!("{release}-{name}").into();
            }
            let name = [
                volume["configMap"]["name"].as_str(),
                volume["secret"]["secretName"].as_str(),
            ]
            .into_iter()
            .flatten()
            .next()
            .unwrap_or(text(volume, "/name"));
            volumes.push(name.to_owned());
        }
        // podman publishes declared ports, which the host network
        // refuses: the probes name the port by number instead.
        let container = &mut pod["containers"][0];
        if let Some(ports) = container.as_object_mut().and_then(|c| c.remove("ports")) {
            anyhow::ensure!(ports[0]["name"] == "admin" && ports[0]["containerPort"] == port);
        }
        for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
            if container[probe].is_object() {
                container[probe]["httpGet"]["port"] = port.into();
            }
        }
        for mount in pod["containers"][0]["volumeMounts"]
            .as_array_mut()
            .context("mounts")?
        {
            mount["name"] = format!("{release}-{}", text(mount, "/name")).into();
        }
    }
    let secret_yaml = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": secret},
        // podman 4.3 writes `data` as given, not base64-decoded.
        "data": {
            "amqp-password": "admin",
            "admin-token": "0123456789abcdef0123456789abcdef",
        },
    });
    let files = std::env::temp_dir().join(&release);
    std::fs::create_dir_all(&files)?;
    std::fs::write(files.join("secret.json"), secret_yaml.to_string())?;
    // YAML is a superset of JSON: one document per `---`.
    let play: Vec<String> = documents.iter().map(Value::to_string).collect();
    std::fs::write(files.join("play.yaml"), play.join("\n---\n"))?;
    podman_output(&[
        "secret",
        "create",
        &secret,
        &files.join("secret.json").display().to_string(),
    ])
    .await?;
    let pod = KubePlay {
        file: files.join("play.yaml"),
        secret: secret.clone(),
        volumes,
    };
    let played = podman()
        .env("CONTAINERS_CONF", write_containers_conf(&files)?)
        .args(["kube", "play", "--replace", "--network", "host"])
        .arg(&pod.file)
        .output()
        .await?;
    anyhow::ensure!(
        played.status.success(),
        "podman kube play: {}",
        String::from_utf8_lossy(&played.stderr)
    );
    let admin: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !http_get(admin, "/readyz")
        .await
        .is_ok_and(|(status, _)| status.contains("200"))
    {
        if Instant::now() > deadline {
            let logs = podman()
                .args(["pod", "logs", "wharf-pod-0"])
                .output()
                .await?;
            anyhow::bail!(
                "/readyz never said ready: {}{}",
                String::from_utf8_lossy(&logs.stdout),
                String::from_utf8_lossy(&logs.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut client = Client::connect(&artemis_url()).await?;
    let mut outputs = client.watch(&out).await?;
    let first = format!("{q}.1");
    client
        .publish_scripted(
            &q,
            std::slice::from_ref(&first),
            &format!("*:send={out},ack"),
        )
        .await?;
    outputs.next().await?;

    // The volumes as podman keeps them, rewritten as the kubelet does.
    let volume_path = async |name: &str| -> anyhow::Result<PathBuf> {
        let path =
            podman_output(&["volume", "inspect", name, "--format", "{{.Mountpoint}}"]).await?;
        Ok(PathBuf::from(path.trim()))
    };
    let config_volume = volume_path(&format!("{release}-wharf-config")).await?;
    let modules_volume = volume_path(&modules).await?;
    let config = std::fs::read_to_string(config_volume.join("wharf.toml"))?;
    let swapped = config.replace(&tenants(false), &tenants(true));
    anyhow::ensure!(swapped != config, "the tenants are in the rendered config");
    let staged = config_volume.join(".wharf.toml.new");
    std::fs::write(&staged, swapped)?;
    std::fs::rename(&staged, config_volume.join("wharf.toml"))?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let staged = modules_volume.join(".late.wasm.new");
    std::fs::copy(guest("fixture_script"), &staged)?;
    std::fs::rename(&staged, modules_volume.join("late.wasm"))?;
    let id = format!("{late}.1");
    client
        .publish_scripted(
            &late,
            std::slice::from_ref(&id),
            &format!("*:send={out},ack"),
        )
        .await?;
    let output = outputs.next().await?;
    assert_eq!(
        message_id(&output.1)
            .as_deref()
            .and_then(|o| input_of_output(o, 0)),
        Some(id.as_str())
    );
    outputs.close().await;
    client.close().await;
    Ok(())
}

/// The rlimits podman would raise past what this sandbox allows, lowered
/// for `kube play` (which takes no `--ulimit`).
fn write_containers_conf(folder: &Path) -> anyhow::Result<PathBuf> {
    let path = folder.join("containers.conf");
    std::fs::write(
        &path,
        "[containers]\ndefault_ulimits = [\"nofile=10000:10000\", \"nproc=4096:4096\"]\n",
    )?;
    Ok(path)
}

/// A played pod, torn down with its volumes and secret when dropped.
struct KubePlay {
    file: PathBuf,
    secret: String,
    volumes: Vec<String>,
}

impl Drop for KubePlay {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman")
            .args(["kube", "down"])
            .arg(&self.file)
            .output();
        let _ = std::process::Command::new("podman")
            .args(["secret", "rm", &self.secret])
            .output();
        let _ = std::process::Command::new("podman")
            .args(["volume", "rm", "--force"])
            .args(&self.volumes)
            .output();
        if let Some(folder) = self.file.parent() {
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}
