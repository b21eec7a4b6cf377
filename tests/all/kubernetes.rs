//! The manifests under `deploy/kubernetes/` agree with what wharf needs:
//! the config they mount loads, the probes and ports are the admin
//! listener's, the grace period outlasts `shutdown_grace`, the secret
//! files the config names are the ones mounted, and every selector and
//! scale target finds the Deployment.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use wharf_core::config::Config;

use crate::{repo_root, unique};

/// Every document of a YAML file, as JSON values.
fn documents(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    serde_norway::Deserializer::from_str(&text)
        .map(|document| {
            let value: serde_norway::Value = serde::Deserialize::deserialize(document)?;
            Ok(serde_json::to_value(value)?)
        })
        .collect()
}

fn manifest(name: &str) -> anyhow::Result<Value> {
    let path = repo_root().join("deploy/kubernetes").join(name);
    documents(&path)?
        .into_iter()
        .next()
        .with_context(|| format!("{name} is empty"))
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no text at {pointer}"))
}

/// The list of strings at `key`.
fn strings<'a>(value: &'a Value, key: &str) -> anyhow::Result<Vec<&'a str>> {
    Ok(value[key]
        .as_array()
        .with_context(|| format!("no list `{key}`"))?
        .iter()
        .filter_map(Value::as_str)
        .collect())
}

#[test]
fn the_manifests_agree_with_the_config_they_mount() -> anyhow::Result<()> {
    let kustomization = manifest("kustomization.yaml")?;
    let resources = strings(&kustomization, "resources")?;
    for resource in &resources {
        manifest(resource)?;
    }
    let deployment = manifest("deployment.yaml")?;
    let config_map = manifest("configmap.yaml")?;
    // No secret is deployed: the example says what to create.
    assert!(
        !resources.iter().any(|r| r.contains("secret")),
        "{resources:?}"
    );
    let secret = manifest("secret.example.yaml")?;
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let mounts = container["volumeMounts"].as_array().context("mounts")?;
    let mount_of = |volume: &str| {
        mounts
            .iter()
            .find(|m| m["name"] == volume)
            .map(|m| text(m, "/mountPath").to_owned())
            .unwrap_or_else(|| panic!("no mount of volume {volume}"))
    };
    let volume = |name: &str| {
        pod["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == name))
            .unwrap_or_else(|| panic!("no volume {name}"))
            .clone()
    };

    // The config the container is told to read is the ConfigMap's.
    let args = strings(container, "args")?;
    let config_path = args[args
        .iter()
        .position(|a| *a == "--config")
        .context("--config")?
        + 1];
    assert_eq!(
        text(&volume("config"), "/configMap/name"),
        text(&config_map, "/metadata/name")
    );
    let file = Path::new(config_path)
        .strip_prefix(mount_of("config"))
        .context("the config path is on the config volume")?;
    let toml = text(&config_map, &format!("/data/{}", file.display()));

    // It loads, with its modules and secret files where the pod has them.
    let root = std::env::temp_dir().join(unique("k8s"));
    let modules = mount_of("modules");
    let secrets = mount_of("secrets");
    let mut local = toml
        .replace(&modules, &root.join("modules").display().to_string())
        .replace(&secrets, &root.join("secrets").display().to_string());
    std::fs::create_dir_all(root.join("modules"))?;
    std::fs::create_dir_all(root.join("secrets"))?;
    for key in secret["stringData"]
        .as_object()
        .context("secret data")?
        .keys()
    {
        std::fs::write(root.join("secrets").join(key), "x")?;
    }
    for line in toml.lines() {
        if let Some(module) = line.trim().strip_prefix("module = \"") {
            let module = module.trim_end_matches('"');
            let name = Path::new(module).file_name().context("a module file")?;
            std::fs::write(root.join("modules").join(name), b"")?;
        }
    }
    local.push('\n');
    let config = Config::parse(&local, &root.join("wharf.toml"));
    std::fs::remove_dir_all(&root)?;
    let config = config.context("the ConfigMap's wharf.toml loads")?;
    assert_eq!(
        text(&volume("secrets"), "/secret/secretName"),
        text(&secret, "/metadata/name")
    );

    // Probes and ports are the admin listener's.
    let admin = config
        .admin
        .clone()
        .context("an [admin] listener for the probes")?;
    let port = &container["ports"][0];
    assert_eq!(port["containerPort"], admin.listen.port());
    assert!(
        !admin.listen.ip().is_loopback(),
        "the kubelet must reach it"
    );
    let port_name = text(port, "/name");
    for (probe, path) in [
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ] {
        assert_eq!(text(&container[probe], "/httpGet/path"), path);
        assert_eq!(text(&container[probe], "/httpGet/port"), port_name);
    }

    // SIGTERM, then shutdown_grace and 5 s to close before the SIGKILL.
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .context("terminationGracePeriodSeconds")?;
    assert!(
        Duration::from_secs(grace) > config.host.shutdown_grace + Duration::from_secs(5),
        "terminationGracePeriodSeconds {grace} against shutdown_grace {:?}",
        config.host.shutdown_grace
    );

    // Compiled modules on a volume of the pod's (the root file system is
    // read-only), where the config keeps them.
    assert_eq!(
        config.host.module_cache.as_deref(),
        Some(Path::new(&mount_of("module-cache")))
    );
    assert!(volume("module-cache")["emptyDir"].is_object());

    // Locked down as the image runs.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);

    // Every selector and scale target finds the Deployment.
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let matches = |selector: &Value| {
        selector
            .as_object()
            .is_some_and(|s| s.iter().all(|(k, v)| &labels[k] == v))
    };
    assert!(matches(&deployment["spec"]["selector"]["matchLabels"]));
    assert!(matches(&manifest("service.yaml")?["spec"]["selector"]));
    assert!(matches(
        &manifest("pdb.yaml")?["spec"]["selector"]["matchLabels"]
    ));
    let service = manifest("service.yaml")?;
    assert_eq!(service["spec"]["ports"][0]["targetPort"], port_name);
    // /metrics answers 401 without the token: no scrape that cannot carry it.
    assert!(
        service["metadata"]["annotations"]["prometheus.io/scrape"].is_null(),
        "{service}"
    );
    // The HPA owns the count; an outage never blocks a drain.
    assert!(deployment["spec"]["replicas"].is_null());
    assert_eq!(
        manifest("pdb.yaml")?["spec"]["unhealthyPodEvictionPolicy"],
        "AlwaysAllow"
    );
    for keda in ["keda/artemis.yaml", "keda/rabbitmq.yaml"] {
        let scaled = documents(&repo_root().join("deploy/kubernetes").join(keda))?;
        let object = scaled
            .iter()
            .find(|d| d["kind"] == "ScaledObject")
            .context("a ScaledObject")?;
        assert_eq!(
            object["spec"]["scaleTargetRef"]["name"], deployment["metadata"]["name"],
            "{keda}"
        );
        for trigger in object["spec"]["triggers"].as_array().context("triggers")? {
            let queue = trigger["metadata"]["queueName"]
                .as_str()
                .context("queueName")?;
            assert!(
                config.mounts().any(|(_, m)| m.address == queue),
                "{keda} scales on `{queue}`, which no mount consumes"
            );
        }
    }
    Ok(())
}
