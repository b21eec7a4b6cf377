//! One contract, every language: the `flaky` example in Rust, C, Go,
//! JavaScript and Python gets the same results on the broker; `wharf new`
//! projects build and run in each; instance reuse keeps state within a
//! mount only.

use std::collections::BTreeMap;
use std::process::Command;

use fe2o3_amqp::types::primitives::SimpleValue;
use wharf::events::Handled;
use wharf_core::settlement::Disposition;

use crate::client::TestMessage;
use crate::process::wharf_binary;
use crate::tenants::start_tenants;
use crate::{MountToml, TenantToml, repo_root, start_with_client, unique, wait_for_count};

/// The `flaky` example in each language, with the grants its runtime needs.
pub(crate) const FLAKY: &[(&str, &[&str])] = &[
    ("flaky", &[]),
    ("flaky_c", &[]),
    // The Go runtime reads the clock and random bytes as it starts.
    ("flaky_go", &["clocks = true", "random = true"]),
    ("flaky_js", &[]),
    ("flaky_js_qjs", &[]),
    ("flaky_python", &[]),
];

/// What happened to one delivery, as the broker saw it.
type Step = (u32, String, Option<Disposition>, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flaky_example_settles_alike_in_every_language() -> anyhow::Result<()> {
    let queues: Vec<String> = FLAKY.iter().map(|(name, _)| unique(name)).collect();
    let tenants: Vec<TenantToml> = FLAKY
        .iter()
        .zip(&queues)
        .map(|((name, grants), q)| {
            let mut mount = MountToml::new("flaky", name, q)
                .with("max_attempts = 3")
                .with(&format!("dead_letter = \"{q}.dlq\""))
                .with("timeout = \"60s\"")
                .with("[tenant.mount.grants]");
            for grant in *grants {
                mount = mount.with(grant);
            }
            TenantToml::new(name, vec![mount])
        })
        .collect();
    let (mut host, mut client) = start_tenants("", &tenants).await?;
    // (body, deliveries it takes, delay-ms property)
    let messages = [("ok", 1), ("bad", 1), ("retry", 3), ("later", 3)];
    for q in &queues {
        for (body, _) in messages {
            let message = TestMessage::new(&format!("{q}.{body}"), body)
                .header(0)
                .property("delay-ms", SimpleValue::String("300".into()));
            client.publish(q, message).await?;
        }
    }
    let mut results: BTreeMap<&str, BTreeMap<&str, Vec<Step>>> = BTreeMap::new();
    for ((name, _), q) in FLAKY.iter().zip(&queues) {
        for (body, deliveries) in messages {
            let handled = host.handled_n(&format!("{q}.{body}"), deliveries).await?;
            let steps = handled.iter().map(step).collect();
            results.entry(name).or_default().insert(body, steps);
        }
    }
    let rust = results["flaky"].clone();
    assert_eq!(
        rust["retry"].last().map(|s| s.3.as_str()),
        Some("DeadLetter"),
        "{rust:?}"
    );
    for (name, result) in &results {
        assert_eq!(*result, rust, "{name} differs from Rust");
    }
    host.stop().await?;
    for q in &queues {
        // `retry` and `later` reached the limit: both on the dead-letter
        // address, exactly as they arrived.
        let dla = format!("{q}.dlq");
        wait_for_count(&dla, 2, async || client.artemis_count(&dla).await).await?;
        wait_for_count(q, 0, async || client.artemis_count(q).await).await?;
    }
    client.close().await;
    Ok(())
}

fn step(handled: &Handled) -> Step {
    (
        handled.attempt,
        format!("{:?}", handled.outcome),
        handled.disposition,
        handled
            .plan
            .publish()
            .map_or("none", publish_kind)
            .to_owned(),
    )
}

/// The kind of publish, without the retry count and delay that differ by
/// attempt.
fn publish_kind(publish: wharf_core::settlement::Publish) -> &'static str {
    match publish {
        wharf_core::settlement::Publish::Copy { .. } => "Copy",
        wharf_core::settlement::Publish::DeadLetter => "DeadLetter",
        wharf_core::settlement::Publish::Outputs => "Outputs",
    }
}

#[tokio::test]
async fn instance_reuse_keeps_state_within_a_mount_and_never_across_mounts() -> anyhow::Result<()> {
    let fresh = unique("per-delivery");
    let reused = [unique("reuse-1"), unique("reuse-2")];
    let mounts = [
        MountToml::new("fresh", "fixture_script", &fresh).with("concurrency = 1"),
        MountToml::new("reuse1", "fixture_script", &reused[0])
            .with("concurrency = 1")
            .with("instance = \"reuse\""),
        MountToml::new("reuse2", "fixture_script", &reused[1])
            .with("concurrency = 1")
            .with("instance = \"reuse\""),
    ];
    let (mut host, mut client) = start_with_client(&crate::artemis_url(), &mounts).await?;
    // `fresh` acks in an instance that never served before, drops otherwise.
    let mut outcome = async |q: &str, n: u32| -> anyhow::Result<Option<Disposition>> {
        let id = format!("{q}.{n}");
        client
            .publish(q, TestMessage::new(&id, "x").script("*:fresh"))
            .await?;
        Ok(host.handled(&id).await?.disposition)
    };
    for n in 0..2 {
        assert_eq!(outcome(&fresh, n).await?, Some(Disposition::Accepted));
    }
    for q in &reused {
        // Each mount's first delivery gets a new instance, however busy the
        // other mount's instance has been.
        assert_eq!(outcome(q, 0).await?, Some(Disposition::Accepted));
        assert_eq!(outcome(q, 1).await?, Some(Disposition::Rejected));
    }
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// What a language's starter project needs to run under `wharf invoke`.
const NEW_PROJECTS: &[(&str, &[&str])] = &[
    ("rust", &[]),
    ("c", &[]),
    ("go", &["--grant", "clocks", "--grant", "random"]),
    ("js", &[]),
    ("python", &[]),
];

#[test]
fn wharf_new_projects_build_and_run_in_every_language() -> anyhow::Result<()> {
    let wharf = wharf_binary();
    let root = std::env::temp_dir().join(unique("wharf-new"));
    std::fs::create_dir_all(&root)?;
    for (lang, grants) in NEW_PROJECTS {
        let dir = root.join(format!("hello-{lang}"));
        run(Command::new(&wharf).args(["new", "--lang", lang]).arg(&dir))?;
        let component = root.join(format!("hello-{lang}.wasm"));
        // The same build a new project's README gives, through the
        // language's build script.
        run(Command::new(repo_root().join("scripts/lang").join(lang))
            .arg("build")
            .arg(&dir)
            .arg(&component)
            .env("WHARF", &wharf))?;
        let output = run(Command::new(&wharf)
            .args(["invoke", "--body", "hello"])
            .args(*grants)
            .arg("--module")
            .arg(&component))?;
        assert_eq!(output.stdout.trim(), "ack", "{lang}: {output:?}");
        assert!(
            output.stderr.contains("attempt 1"),
            "{lang}: the starter logs the attempt through the host: {output:?}"
        );
    }
    std::fs::remove_dir_all(&root)?;
    Ok(())
}

#[derive(Debug)]
struct Output {
    stdout: String,
    stderr: String,
}

fn run(command: &mut Command) -> anyhow::Result<Output> {
    let output = command.output()?;
    let result = Output {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    anyhow::ensure!(output.status.success(), "{command:?} failed: {result:?}");
    Ok(result)
}

/// Go's collector may run inside `cabi_realloc` and read the clock there,
/// which a component may not do: a kept Go instance then fails as its
/// delivery is handed in. The host tries such a delivery once more on a
/// fresh instance, so no attempt is spent on it.
#[tokio::test]
async fn a_kept_go_instance_never_fails_a_delivery_for_its_collector() -> anyhow::Result<()> {
    use wharf::sandbox::Outcome;
    use wharf_tests::sandbox::{KEEP, instances, ok_delivery, sandbox};

    let sandbox = sandbox(4)?;
    let module = sandbox.load(&crate::guest("flaky_go"))?;
    let instances = instances(&sandbox, &module, "go", KEEP);
    let delivery = ok_delivery();
    // One kept instance fails within about 14,000 deliveries without the
    // second try.
    let deliveries = 40_000;
    for n in 0..deliveries {
        let result = instances
            .reserve()
            .await
            .call(&delivery, wharf_core::brokers::BrokerKind::Other)
            .await
            .result;
        anyhow::ensure!(
            matches!(result, Ok(Outcome::Ack)),
            "delivery {n}: {result:?}"
        );
    }
    println!("Go, one kept instance: {deliveries} deliveries, every one acked");
    Ok(())
}

/// A restart loads compiled JavaScript and Python modules from the module
/// cache instead of compiling them again; a cached file the engine refuses
/// is removed and the module compiled again.
#[test]
fn compiled_modules_are_kept_on_disk_and_loaded_by_the_next_start() -> anyhow::Result<()> {
    let cache = std::env::temp_dir().join(unique("module-cache"));
    let names = ["flaky_js", "flaky_js_qjs", "flaky_python"];
    let start = |from_cache: bool| -> anyhow::Result<std::time::Duration> {
        let sandbox = wharf::sandbox::Sandbox::with_module_cache(4, Some(&cache))?;
        let started = std::time::Instant::now();
        for name in names {
            let module = sandbox.load(&crate::guest(name))?;
            assert_eq!(module.from_disk_cache(), from_cache, "{name}");
        }
        Ok(started.elapsed())
    };
    let compiled = start(false)?;
    let loaded = start(true)?;
    eprintln!(
        "module cache: {} modules compiled in {compiled:?}, loaded from the cache in {loaded:?}",
        names.len()
    );
    let kept: Vec<_> = std::fs::read_dir(&cache)?.collect::<Result<_, _>>()?;
    assert_eq!(kept.len(), names.len(), "{kept:?}");
    for entry in &kept {
        std::fs::write(entry.path(), b"not machine code")?;
    }
    start(false)?;
    start(true)?;
    std::fs::remove_dir_all(&cache)?;
    Ok(())
}

/// `wharf run` with five JavaScript and Python mounts, stopped and started
/// again on the same module cache: the second start compiles nothing, and
/// both starts' times (process start to running) are printed for the
/// README's figures.
#[tokio::test]
async fn a_restart_with_five_javascript_and_python_mounts_compiles_nothing() -> anyhow::Result<()> {
    let folder = std::env::temp_dir().join(unique("restart-cache"));
    std::fs::create_dir_all(&folder)?;
    // A fifth module: the Python one with a custom section appended, so
    // its digest (and compiled file) is its own.
    let mut fifth = std::fs::read(crate::guest("flaky_python"))?;
    fifth.extend_from_slice(&[0, 6, 5, b'w', b'h', b'a', b'r', b'f']);
    std::fs::write(folder.join("fifth.wasm"), &fifth)?;
    let mut mounts: Vec<MountToml> = [
        "flaky_js",
        "flaky_js_qjs",
        "fixture_fetch_js",
        "flaky_python",
    ]
    .iter()
    .map(|name| MountToml::new(&name.replace('_', "-"), name, &unique(name)))
    .collect();
    let mut fifth_mount = MountToml::new("fifth", "flaky_python", &unique("fifth"));
    fifth_mount.module = folder.join("fifth.wasm");
    mounts.push(fifth_mount);
    let text = crate::tenants_text(
        &crate::artemis_url(),
        &format!("module_cache = \"{}\"", folder.join("cache").display()),
        &[TenantToml::new("t", mounts)],
    );
    let mut starts = Vec::new();
    for _ in 0..2 {
        let started = std::time::Instant::now();
        let mut wharf = crate::process::WharfProcess::start_config(&text).await?;
        let running = started.elapsed();
        let ready = wharf.wait_for_log("modules ready").await?;
        let line: serde_json::Value = serde_json::from_str(&ready)?;
        let fields = &line["fields"];
        starts.push((
            fields["compiled"].as_u64(),
            fields["from_cache"].as_u64(),
            fields["elapsed_ms"].as_u64(),
            running,
        ));
        crate::process::signal(&wharf, "-TERM").await?;
        wharf.wait_for_log("stopped").await?;
    }
    eprintln!(
        "restart with 5 JavaScript/Python modules (compiled, from cache, ms loading, start to running): {starts:?}"
    );
    assert_eq!((starts[0].0, starts[0].1), (Some(5), Some(0)), "{starts:?}");
    assert_eq!((starts[1].0, starts[1].1), (Some(0), Some(5)), "{starts:?}");
    std::fs::remove_dir_all(&folder)?;
    Ok(())
}
