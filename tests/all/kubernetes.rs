//! The manifests under `deploy/kubernetes/` and what the Helm chart under
//! `deploy/helm/wharf` renders agree with what wharf needs: the config
//! they mount loads, the probes and ports are the admin listener's, the
//! grace period outlasts `shutdown_grace`, the secret files the config
//! names are the ones mounted, every selector and scale target finds the
//! Deployment, and the monitoring names only metrics wharf exposes.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use wharf_core::config::Config;

use crate::{repo_root, unique};

/// Every document of a YAML file, as JSON values.
fn documents(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    yaml_documents(&text)
}

/// Every document of a YAML stream, as JSON values (empty ones left out).
fn yaml_documents(text: &str) -> anyhow::Result<Vec<Value>> {
    serde_norway::Deserializer::from_str(text)
        .map(|document| {
            let value: serde_norway::Value = serde::Deserialize::deserialize(document)?;
            Ok(serde_json::to_value(value)?)
        })
        .filter(|d| !matches!(d, Ok(Value::Null)))
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

/// The trigger metadata keys each KEDA scaler reads, from KEDA 2.18.0's
/// `pkg/scalers` (its `keda:"name=..."` tags). KEDA ignores any other key
/// without a word, so a misspelt one silently changes what is measured.
const KEDA_KEYS: &[(&str, &[&str])] = &[
    (
        "artemis-queue",
        &[
            "managementEndpoint",
            "queueName",
            "brokerName",
            "brokerAddress",
            "username",
            "password",
            "restApiTemplate",
            "queueLength",
            "activationQueueLength",
            "corsHeader",
            "unsafeSsl",
        ],
    ),
    (
        "rabbitmq",
        &[
            "queueName",
            "mode",
            "queueLength",
            "value",
            "activationValue",
            "host",
            "protocol",
            "vhostName",
            "useRegex",
            "excludeUnacknowledged",
            "pageSize",
            "operation",
            "timeout",
            "username",
            "password",
            "unsafeSsl",
        ],
    ),
];

/// The documents of a kind among `documents`.
fn of_kind<'a>(documents: &'a [Value], kind: &str) -> Vec<&'a Value> {
    documents.iter().filter(|d| d["kind"] == kind).collect()
}

/// The one document of a kind among `documents`.
fn one<'a>(documents: &'a [Value], kind: &str) -> anyhow::Result<&'a Value> {
    match of_kind(documents, kind)[..] {
        [document] => Ok(document),
        ref found => anyhow::bail!("{} documents of kind {kind}", found.len()),
    }
}

/// What the kustomize base applies: each resource it lists (with the labels
/// it adds to every resource and selector) and the KEDA objects beside it.
fn kustomize_documents() -> anyhow::Result<Vec<Value>> {
    let base = repo_root().join("deploy/kubernetes");
    let kustomization = manifest("kustomization.yaml")?;
    let labels = kustomization["labels"][0]["pairs"].clone();
    let mut all = Vec::new();
    for resource in strings(&kustomization, "resources")? {
        for mut document in documents(&base.join(resource))? {
            let service = document["kind"] == "Service";
            if !document["metadata"]["labels"].is_object() {
                document["metadata"]["labels"] = Value::Object(Default::default());
            }
            for pointer in [
                "/metadata/labels",
                "/spec/selector/matchLabels",
                "/spec/template/metadata/labels",
                if service { "/spec/selector" } else { "/none" },
            ] {
                if let Some(Value::Object(at)) = document.pointer_mut(pointer) {
                    at.extend(labels.as_object().cloned().unwrap_or_default());
                }
            }
            all.push(document);
        }
    }
    // Not listed (they need KEDA's CRDs), applied on their own.
    for keda in ["keda/artemis.yaml", "keda/rabbitmq.yaml"] {
        all.extend(documents(&base.join(keda))?);
    }
    Ok(all)
}

/// What `helm template` renders of the chart with `values` set.
pub(crate) fn helm_documents(values: &[&str]) -> anyhow::Result<Vec<Value>> {
    let helm = std::process::Command::new(repo_root().join("scripts/helm")).output()?;
    anyhow::ensure!(
        helm.status.success(),
        "scripts/helm: {}",
        String::from_utf8_lossy(&helm.stderr)
    );
    let helm = String::from_utf8(helm.stdout)?.trim().to_owned();
    let mut command = std::process::Command::new(helm);
    command
        .arg("template")
        .arg("wharf")
        .arg(repo_root().join("deploy/helm/wharf"));
    for value in values {
        // `--values=FILE` as is; `key=value` is a `--set`.
        if !value.starts_with("--") {
            command.arg("--set");
        }
        command.arg(value);
    }
    let rendered = command.output()?;
    anyhow::ensure!(
        rendered.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    yaml_documents(&String::from_utf8(rendered.stdout)?)
}

#[test]
fn the_kustomize_base_agrees_with_the_config_it_mounts() -> anyhow::Result<()> {
    let kustomization = manifest("kustomization.yaml")?;
    let resources = strings(&kustomization, "resources")?;
    // No secret is deployed: the example says what to create.
    assert!(
        !resources.iter().any(|r| r.contains("secret")),
        "{resources:?}"
    );
    check_pod(&kustomize_documents()?, false)
}

#[test]
fn the_helm_chart_renders_what_the_base_checks_hold_for() -> anyhow::Result<()> {
    let rendered = helm_documents(&[])?;
    assert!(
        of_kind(&rendered, "Secret").is_empty(),
        "no secret rendered"
    );
    check_pod(&rendered, true)?;
    let scaled = helm_documents(&[
        "keda.enabled=true",
        "keda.triggers[0].type=artemis-queue",
        "keda.triggers[0].metadata.queueName=orders",
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
    ])?;
    check_pod(&scaled, false)?;
    // The chart's alerts are the base's.
    let rule = one(&scaled, "PrometheusRule")?;
    let base = documents(&repo_root().join("deploy/kubernetes/monitoring/prometheusrule.yaml"))?;
    assert_eq!(rule["spec"], base[0]["spec"], "the chart's rules");
    let monitor = one(&scaled, "ServiceMonitor")?;
    check_service_monitor(monitor, one(&scaled, "Service")?)?;
    // Registry credentials: the file the config names is the Secret's
    // `kubectl create secret docker-registry` key, where it is mounted.
    let pulling = helm_documents(&["registry.credentialsSecret=pull", "registry.poll=5m"])?;
    check_pod(&pulling, true)?;
    let toml = text(one(&pulling, "ConfigMap")?, "/data/wharf.toml");
    let credentials = toml
        .lines()
        .find_map(|line| line.trim().strip_prefix("credentials = \""))
        .context("[host.registry] credentials")?
        .trim_end_matches('"');
    let pod = &one(&pulling, "Deployment")?["spec"]["template"]["spec"];
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "registry-credentials"))
        .context("the credentials mounted")?;
    assert_eq!(
        Path::new(credentials),
        Path::new(text(mount, "/mountPath")).join(".dockerconfigjson")
    );
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "registry-credentials"))
        .context("the credentials volume")?;
    assert_eq!(volume["secret"]["secretName"], "pull");
    assert!(toml.contains("poll = \"5m\""), "{toml}");
    Ok(())
}

/// The pod the documents run agrees with what wharf needs: the config it
/// mounts loads, probes and ports are the admin listener's, the grace
/// period outlasts `shutdown_grace`, the secret files the config names
/// are mounted, compiled modules are kept on a volume, and every selector
/// and scale target finds the Deployment. `replicas`: whether the
/// Deployment may fix its count (not when KEDA's HPA owns it).
fn check_pod(documents: &[Value], replicas: bool) -> anyhow::Result<()> {
    let deployment = one(documents, "Deployment")?;
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
    let config_map_name = text(&volume("config"), "/configMap/name").to_owned();
    let config_map = of_kind(documents, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"] == config_map_name.as_str())
        .context("the config volume's ConfigMap")?;
    let file = Path::new(config_path)
        .strip_prefix(mount_of("config"))
        .context("the config path is on the config volume")?;
    let toml = text(config_map, &format!("/data/{}", file.display()));

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
            .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
    };
    assert!(matches(&deployment["spec"]["selector"]["matchLabels"]));
    let service = one(documents, "Service")?;
    assert!(matches(&service["spec"]["selector"]), "{service}");
    let pdb = one(documents, "PodDisruptionBudget")?;
    assert!(matches(&pdb["spec"]["selector"]["matchLabels"]));
    assert_eq!(service["spec"]["ports"][0]["targetPort"], port_name);
    // /metrics answers 401 without the token: no scrape that cannot carry it.
    assert!(
        service["metadata"]["annotations"]["prometheus.io/scrape"].is_null(),
        "{service}"
    );
    // An outage never blocks a drain.
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(
        !deployment["spec"]["replicas"].is_null(),
        replicas,
        "replicas: {}",
        deployment["spec"]["replicas"]
    );
    for object in of_kind(documents, "ScaledObject") {
        assert_eq!(
            object["spec"]["scaleTargetRef"]["name"],
            deployment["metadata"]["name"]
        );
        for trigger in object["spec"]["triggers"].as_array().context("triggers")? {
            let kind = text(trigger, "/type");
            let (_, read) = KEDA_KEYS
                .iter()
                .find(|(scaler, _)| *scaler == kind)
                .with_context(|| format!("a trigger of type {kind}, whose keys are not known"))?;
            for key in trigger["metadata"].as_object().context("metadata")?.keys() {
                assert!(
                    read.contains(&key.as_str()),
                    "KEDA's {kind} scaler ignores `{key}` (it reads {read:?})"
                );
            }
            let queue = trigger_queue(&trigger["metadata"])?;
            assert!(
                config.mounts().any(|(_, m)| m.address == queue),
                "a ScaledObject scales on `{queue}`, which no mount consumes"
            );
        }
    }
    Ok(())
}

/// The queue a trigger reads: `queueName`, or the `queue` its
/// `restApiTemplate` names.
fn trigger_queue(metadata: &Value) -> anyhow::Result<String> {
    if let Some(queue) = metadata["queueName"].as_str() {
        return Ok(queue.to_owned());
    }
    let template = metadata["restApiTemplate"].as_str().context("queueName")?;
    template
        .split(',')
        .find_map(|pair| pair.strip_prefix("queue=\""))
        .and_then(|rest| rest.split('"').next())
        .map(str::to_owned)
        .with_context(|| format!("no queue in {template}"))
}

/// The ServiceMonitor finds the admin Service and carries the token from
/// the Secret wharf reads.
fn check_service_monitor(monitor: &Value, service: &Value) -> anyhow::Result<()> {
    let secret = manifest("secret.example.yaml")?;
    let labels = &service["metadata"]["labels"];
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("a selector")?
    {
        assert_eq!(&labels[key], value, "the Service is labelled {key}");
    }
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service["spec"]["ports"][0]["name"]);
    let credentials = &endpoint["authorization"]["credentials"];
    assert_eq!(credentials["name"], secret["metadata"]["name"]);
    let key = text(credentials, "/key");
    assert!(
        secret["stringData"][key].is_string(),
        "no `{key}` in the Secret"
    );
    Ok(())
}

/// The monitoring manifests fit wharf: the ServiceMonitor finds the admin
/// Service and carries the token from the Secret wharf reads, and every
/// metric the alerts and the dashboard name is one wharf exposes (those a
/// running host shows, and the labelled ones it shows once used).
#[tokio::test]
async fn the_alerts_and_the_dashboard_name_only_metrics_wharf_exposes() -> anyhow::Result<()> {
    let monitoring = repo_root().join("deploy/kubernetes/monitoring");
    let monitor = documents(&monitoring.join("servicemonitor.yaml"))?.remove(0);
    let base = kustomize_documents()?;
    check_service_monitor(&monitor, one(&base, "Service")?)?;

    // What a running host exposes: each family's series names.
    let text_of = |config: &str| {
        let mount = crate::MountToml::new("m", "ack", &unique("metrics"));
        let mut text = crate::config_text(&crate::artemis_url(), &[mount]);
        text.push_str(config);
        text
    };
    let config = Config::parse(
        &text_of("[admin]\nlisten = \"127.0.0.1:0\"\n"),
        &repo_root().join("test.toml"),
    )?;
    let host = crate::TestHost::start_config(config).await?;
    let admin = host.host().admin_address().context("admin listener")?;
    let (status, page) = crate::tenants::http_get(admin, "/metrics").await?;
    host.stop().await?;
    assert!(status.contains("200"), "{status}");
    // Every series wharf may expose (a labelled one appears once used),
    // which the running host's page agrees with.
    let exposed: std::collections::BTreeSet<String> = wharf::admin::Metrics::new()
        .series_names()
        .iter()
        .cloned()
        .collect();
    let mut on_the_page = 0;
    for line in page.lines().filter(|line| !line.starts_with('#')) {
        let name: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(exposed.contains(&name), "`{name}` is not among {exposed:?}");
        on_the_page += 1;
    }
    assert!(on_the_page > 5, "{page}");
    let rules = std::fs::read_to_string(monitoring.join("prometheusrule.yaml"))?;
    let dashboard = std::fs::read_to_string(monitoring.join("dashboard.json"))?;
    serde_json::from_str::<Value>(&dashboard).context("the dashboard is JSON")?;
    let mut named = 0;
    for (file, text) in [
        ("prometheusrule.yaml", &rules),
        ("dashboard.json", &dashboard),
    ] {
        for (at, _) in text.match_indices("wharf_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                exposed.contains(&name),
                "{file} names `{name}`, which wharf does not expose: {exposed:?}"
            );
            named += 1;
        }
    }
    assert!(named > 10, "{named} metric names read");
    Ok(())
}

/// `keda/rabbitmq.yaml`'s trigger, its request formed as KEDA 2.18 forms
/// it (`getQueueInfoViaHTTP`: the host's path names the vhost, `/` being
/// `%2F`; `excludeUnacknowledged` reads `messages_ready`), answered by
/// RabbitMQ 4: the backlog is counted, and originals wharf holds through
/// their `retry_after` delay are not.
#[tokio::test]
async fn the_rabbitmq_trigger_counts_the_backlog_and_not_what_wharf_holds() -> anyhow::Result<()> {
    let _shared = crate::rabbitmq4_shared().await;
    let queue = unique("keda");
    let address = format!("/queues/{queue}");
    let mount = crate::MountToml::new("m", "fixture_script", &address);
    let host_config = crate::config_text(&crate::rabbitmq4_url(), &[mount]);
    // The file's trigger, and the one `wharf kube scaledobject` makes.
    let keda = documents(&repo_root().join("deploy/kubernetes/keda/rabbitmq.yaml"))?;
    let file = &keda
        .iter()
        .find(|d| d["kind"] == "ScaledObject")
        .context("a ScaledObject")?["spec"]["triggers"][0]["metadata"];
    let made = scaled_object(&host_config, &["--broker", "rabbitmq"])?;
    let trigger = &made["spec"]["triggers"][0]["metadata"];
    for key in ["protocol", "mode", "excludeUnacknowledged"] {
        assert_eq!(trigger[key], file[key], "{key}");
    }
    assert_eq!(trigger["queueName"], queue.as_str());
    assert_eq!(trigger["protocol"], "http");
    assert_eq!(trigger["mode"], "QueueLength");
    let field = if trigger["excludeUnacknowledged"] == "true" {
        "messages_ready"
    } else {
        "messages"
    };
    wharf_tests::rabbitmq4::declare(&queue, "classic", "").await?;
    // The path of the TriggerAuthentication's host,
    // `http://guest:guest@127.0.0.1:15674/` here: its last segment names
    // the vhost.
    let host_path = "/";
    let vhost = match host_path.rsplit('/').next() {
        Some("") | None => "%2F".to_owned(),
        Some(vhost) => vhost.to_owned(),
    };
    let path = format!("/api/queues/{vhost}/{queue}");
    let backlog = async |expected: u64| {
        crate::wait_for_count(&format!("{queue}: {field}"), expected, async || {
            let body = wharf_tests::rabbitmq4::get(&path).await?;
            let info: Value = serde_json::from_str(&body)?;
            // Absent until the broker's first statistics: KEDA's decoder
            // reads that as 0 too.
            Ok(info[field].as_u64().unwrap_or(0))
        })
        .await
    };
    let mut client = crate::client::Client::connect(&crate::rabbitmq4_url()).await?;
    let ids: Vec<String> = (0..7).map(|n| format!("{queue}.{n}")).collect();
    client
        .publish_scripted(&address, &ids, "1:after=600000")
        .await?;
    backlog(7).await?;
    // wharf takes them all and holds each through its ten-minute delay.
    let mut host =
        crate::TestHost::start_config(Config::parse(&host_config, &repo_root().join("test.toml"))?)
            .await?;
    for id in &ids {
        host.started(id).await?;
    }
    backlog(0).await?;
    host.stop().await?;
    client.close().await;
    wharf_tests::rabbitmq4::delete(&queue).await?;
    Ok(())
}

/// The Artemis instance with its web console (`scripts/brokers`).
const CONSOLE_AMQP: &str = "amqp://admin:admin@127.0.0.1:5700";
const CONSOLE_WEB: &str = "127.0.0.1:8171";

/// The request KEDA 2.18's `artemis-queue` scaler makes for a trigger:
/// its URL as Go sends it, and its Origin. With a `restApiTemplate`, the
/// template is checked as `getAPIParameters` does (the names taken from
/// the raw path between its first two colons, `,` read as `&`) and asked
/// as written; without, the default template is filled in.
fn artemis_request(metadata: &Value) -> anyhow::Result<(String, String)> {
    const DEFAULT: &str = "http://<<managementEndpoint>>/console/jolokia/read/org.apache.activemq.artemis:broker=\"<<brokerName>>\",component=addresses,address=\"<<brokerAddress>>\",subcomponent=queues,routing-type=\"anycast\",queue=\"<<queueName>>\"/MessageCount";
    let (url, endpoint) = match metadata["restApiTemplate"].as_str() {
        Some(template) => {
            let rest = template
                .strip_prefix("http://")
                .context("an http:// template")?;
            let (host, path) = rest.split_once('/').context("a path")?;
            // Go keeps a raw path only when it differs from the path's
            // own escaping; KEDA indexes into it unchecked.
            anyhow::ensure!(
                go_escaped(path) != path,
                "KEDA sees no raw path in {template}"
            );
            let names = path.split(':').nth(1).context("KEDA's split on `:`")?;
            let names = names.split('/').next().unwrap_or_default();
            for key in ["broker", "address", "queue"] {
                let value = names
                    .split(',')
                    .find_map(|pair| pair.strip_prefix(&format!("{key}=")))
                    .with_context(|| format!("KEDA finds no `{key}` in {template}"))?;
                anyhow::ensure!(!value.is_empty(), "`{key}` is empty in {template}");
            }
            (template.to_owned(), host.to_owned())
        }
        None => {
            let endpoint = text(metadata, "/managementEndpoint");
            let url = DEFAULT
                .replace("<<managementEndpoint>>", endpoint)
                .replace("<<queueName>>", text(metadata, "/queueName"))
                .replace("<<brokerName>>", text(metadata, "/brokerName"))
                .replace("<<brokerAddress>>", text(metadata, "/brokerAddress"));
            (url, endpoint.to_owned())
        }
    };
    let origin = metadata["corsHeader"]
        .as_str()
        .map_or_else(|| format!("http://{endpoint}"), str::to_owned);
    Ok((url, origin))
}

/// A URL path as Go's `net/url` escapes it for a request.
fn go_escaped(path: &str) -> String {
    path.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// What Jolokia answers KEDA's request: the `value` when `status` is 200.
async fn jolokia_value(url: &str, origin: &str) -> anyhow::Result<i64> {
    let rest = url.strip_prefix("http://").context("http")?;
    let (host, path) = rest.split_once('/').context("a path")?;
    // admin:admin, as the TriggerAuthentication gives them.
    let headers = [
        ("Authorization", "Basic YWRtaW46YWRtaW4="),
        ("Origin", origin),
    ];
    let answer = crate::http_request(
        host,
        "GET",
        &format!("/{}", go_escaped(path)),
        &headers,
        b"",
    )
    .await?;
    let (_, body) = answer.split_once("\r\n\r\n").context("an HTTP answer")?;
    let body: Value = serde_json::from_str(body).with_context(|| format!("{url}: {answer}"))?;
    anyhow::ensure!(body["status"] == 200, "{url}: {body}");
    body["value"]
        .as_i64()
        .with_context(|| format!("{url}: {body}"))
}

/// The formula's value: a sum of trigger names or `(a - b)` terms.
fn formula_value(formula: &str, values: &std::collections::HashMap<String, i64>) -> i64 {
    formula
        .split(" + ")
        .map(|term| {
            let term = term.trim_matches(|c| c == '(' || c == ')');
            match term.split_once(" - ") {
                Some((a, b)) => values[a] - values[b],
                None => values[term],
            }
        })
        .sum()
}

/// The object `wharf kube scaledobject --broker artemis` makes, each
/// trigger's request formed as KEDA 2.18 forms it and asked of a real
/// Jolokia (Artemis 2.40's web console, its access rules allowing the
/// management endpoint's origin): the formula counts the backlog, and not
/// the scheduled copies wharf leaves for its `retry_after` delays. An
/// origin the rules do not allow is refused, as Artemis's default rules
/// refuse `http://artemis:8161`.
#[tokio::test]
async fn the_artemis_triggers_count_the_backlog_and_not_the_scheduled_copies() -> anyhow::Result<()>
{
    let queue = unique("keda");
    let mount = crate::MountToml::new("m", "fixture_script", &queue).with("concurrency = 16");
    let host_config = crate::config_text(CONSOLE_AMQP, &[mount]);
    let made = scaled_object(
        &host_config,
        &[
            "--broker",
            "artemis",
            "--management-endpoint",
            CONSOLE_WEB,
            "--broker-name",
            "127.0.0.1",
        ],
    )?;
    let formula = text(&made, "/spec/advanced/scalingModifiers/formula").to_owned();
    let triggers = made["spec"]["triggers"]
        .as_array()
        .context("triggers")?
        .clone();
    assert_eq!(triggers.len(), 2, "{made}");
    let backlog = async || -> anyhow::Result<i64> {
        let mut values = std::collections::HashMap::new();
        for trigger in &triggers {
            let (url, origin) = artemis_request(&trigger["metadata"])?;
            values.insert(
                text(trigger, "/name").to_owned(),
                jolokia_value(&url, &origin).await?,
            );
        }
        Ok(formula_value(&formula, &values))
    };
    let wait_for = async |expected: i64| -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + crate::DEADLINE;
        loop {
            match backlog().await {
                Ok(found) if found == expected => return Ok(()),
                found => anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "backlog of {queue}: {found:?}, expected {expected}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let mut client = crate::client::Client::connect(CONSOLE_AMQP).await?;
    let ids: Vec<String> = (0..10).map(|n| format!("{queue}.{n}")).collect();
    client
        .publish_scripted(&queue, &ids, "1:after=600000")
        .await?;
    wait_for(10).await?;
    // wharf takes them all and leaves a copy of each, scheduled ten
    // minutes on, on the same queue.
    let mut host =
        crate::TestHost::start_config(Config::parse(&host_config, &repo_root().join("test.toml"))?)
            .await?;
    for id in &ids {
        host.handled(id).await?;
    }
    wait_for(0).await?;
    let (url, _) = artemis_request(&triggers[0]["metadata"])?;
    assert_eq!(
        jolokia_value(&url, &format!("http://{CONSOLE_WEB}")).await?,
        10,
        "the copies are there"
    );
    let refused = jolokia_value(&url, "http://artemis:8161")
        .await
        .expect_err("refused");
    assert!(refused.to_string().contains("403"), "{refused}");
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// What `wharf kube scaledobject` prints for `config` with `args`, and
/// what it says it left out.
fn scaled_object_with_notes(config: &str, args: &[&str]) -> anyhow::Result<(Value, String)> {
    let file = std::env::temp_dir().join(format!("{}.toml", unique("kube")));
    std::fs::write(&file, config)?;
    let output = std::process::Command::new(crate::process::wharf_binary())
        .args(["kube", "scaledobject", "--config"])
        .arg(&file)
        .args(args)
        .output()?;
    std::fs::remove_file(&file)?;
    let notes = String::from_utf8_lossy(&output.stderr).into_owned();
    anyhow::ensure!(output.status.success(), "wharf kube scaledobject: {notes}");
    Ok((serde_json::from_slice(&output.stdout)?, notes))
}

fn scaled_object(config: &str, args: &[&str]) -> anyhow::Result<Value> {
    Ok(scaled_object_with_notes(config, args)?.0)
}

/// `wharf kube scaledobject` makes one trigger per queue a mount consumes
/// on the host's broker, every key one KEDA reads, summed by the formula;
/// it names each mount it leaves out; its object passes the checks the
/// manifests' do.
#[test]
fn the_generated_scaled_object_has_a_trigger_per_queue_and_only_keys_keda_reads()
-> anyhow::Result<()> {
    let module = |name: &str, address: &str| crate::MountToml::new(name, "ack", address);
    let tenants = [
        crate::TenantToml::new(
            "shop",
            vec![
                module("orders", "/queues/orders"),
                module("refunds", "/amq/queue/refunds"),
            ],
        ),
        crate::TenantToml::new(
            "search",
            vec![
                module("index", "/queues/index%2Ev2"),
                module("events", "/exchanges/events/all"),
            ],
        ),
        crate::TenantToml::new("away", vec![module("m", "/queues/elsewhere")])
            .with("[tenant.broker]")
            .with("url = \"amqp://other:5672\""),
    ];
    let config = crate::tenants_text("amqp://rabbitmq:5672", "", &tenants);
    let (object, notes) = scaled_object_with_notes(&config, &["--broker", "rabbitmq"])?;
    let triggers = object["spec"]["triggers"].as_array().context("triggers")?;
    let queues: Vec<&str> = triggers
        .iter()
        .map(|t| text(t, "/metadata/queueName"))
        .collect();
    assert_eq!(queues, ["orders", "refunds", "index.v2"]);
    assert_eq!(
        object["spec"]["advanced"]["scalingModifiers"]["formula"],
        "q0 + q1 + q2"
    );
    assert!(
        notes.contains("mount `events`") && notes.contains("not a queue"),
        "{notes}"
    );
    assert!(
        notes.contains("tenant `away`") && notes.contains("own broker"),
        "{notes}"
    );
    let artemis = scaled_object(
        &crate::config_text("amqp://artemis:5672", &[module("m", "orders::orders.v1")]),
        &[
            "--broker",
            "artemis",
            "--management-endpoint",
            "artemis:8161",
            "--broker-name",
            "0.0.0.0",
        ],
    )?;
    let trigger = &artemis["spec"]["triggers"][0]["metadata"];
    assert_eq!(trigger["brokerAddress"], "orders");
    assert_eq!(trigger["queueName"], "orders.v1");
    // The checks every ScaledObject of the manifests passes, on these.
    let mut base = kustomize_documents()?;
    base.retain(|d| d["kind"] != "ScaledObject");
    for made in [object, artemis] {
        let mut documents = base.clone();
        // The base's config consumes `orders`: the made object scales on it.
        let mut made = made;
        for trigger in made["spec"]["triggers"]
            .as_array_mut()
            .context("triggers")?
        {
            trigger["metadata"]["queueName"] = Value::from("orders");
        }
        documents.push(made);
        check_pod(&documents, false)?;
    }
    Ok(())
}
