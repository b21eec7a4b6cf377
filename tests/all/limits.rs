//! Failing and hostile handlers: each failure is a retry, and the host keeps
//! serving everyone else. Bad modules and configs are refused at load.

use wharf::events::Event;
use wharf::{Host, HostError};
use wharf_core::config::Config;
use wharf_core::settlement::Disposition;

use crate::client::TestMessage;
use crate::process::wharf_binary;
use crate::{
    MountToml, artemis_url, assert_failed, config_text, repo_root, start_with_client, unique,
    wait_for_count,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_loops_forever_times_out_while_other_mounts_keep_serving()
-> anyhow::Result<()> {
    let stuck = unique("spin");
    let healthy = unique("healthy");
    let url = artemis_url();
    let mounts = [
        MountToml::new("stuck", "fixture_script", &stuck)
            .with("timeout = \"8s\"")
            .with("concurrency = 1")
            .with("max_attempts = 2"),
        MountToml::new("healthy", "fixture_script", &healthy),
    ];
    let (mut host, mut client) = start_with_client(&url, &mounts).await?;
    client
        .publish(
            &stuck,
            TestMessage::new(&stuck, "loop").header(0).script("*:spin"),
        )
        .await?;
    host.started(&stuck).await?;
    let ids: Vec<String> = (0..20).map(|n| format!("{healthy}.{n}")).collect();
    for id in &ids {
        client.publish(&healthy, TestMessage::new(id, "ok")).await?;
    }
    for id in &ids {
        assert_eq!(
            host.handled(id).await?.disposition,
            Some(Disposition::Accepted)
        );
    }
    // All of that happened while the stuck handler was still spinning.
    assert!(!host.seen(|e| matches!(e, Event::Handled(h) if &*h.mount == "stuck")));
    let first = host.handled(&stuck).await?;
    assert_failed(&first, "timeout");
    assert_eq!(first.disposition, Some(Disposition::Modified));
    let last = host.handled(&stuck).await?;
    assert_eq!(last.attempt, 2);
    assert_eq!(last.disposition, Some(Disposition::Rejected));
    host.stop().await?;
    let broker_dlq = format!("DLQ.{stuck}");
    wait_for_count(&broker_dlq, 1, async || {
        client.artemis_count(&broker_dlq).await
    })
    .await?;
    client.close().await;
    Ok(())
}

/// `tests/guests/wat/handler.wat` with `body` as its core `handle`, written
/// to a temporary file.
pub(crate) fn wat_handler(body: &str) -> std::path::PathBuf {
    wat_handler_with("", body)
}

/// `tests/guests/wat/handler.wat` with `fields` added to its core module and
/// `body` as its core `handle`, written to a temporary file.
pub(crate) fn wat_handler_with(fields: &str, body: &str) -> std::path::PathBuf {
    let template = std::fs::read_to_string(repo_root().join("tests/guests/wat/handler.wat"))
        .expect("handler.wat");
    let path = std::env::temp_dir().join(format!("{}.wat", unique("wat-handler")));
    let text = template
        .replace(";; MODULE", fields)
        .replace(";; BODY", body);
    std::fs::write(&path, text).expect("temp module");
    path
}

/// Runs one delivery through a hand-written handler whose every attempt
/// fails the same way; returns the first failure's reason.
async fn fails_as_retry(body: &str) -> anyhow::Result<String> {
    let q = unique("wat");
    let url = artemis_url();
    let mut mount = MountToml::new("m", "fixture_script", &q).with("max_attempts = 2");
    mount.module = wat_handler(body);
    let module = mount.module.clone();
    let (mut host, mut client) = start_with_client(&url, &[mount]).await?;
    client
        .publish(&q, TestMessage::new(&q, "x").header(0))
        .await?;
    let first = host.handled(&q).await?;
    assert_eq!(first.disposition, Some(Disposition::Modified), "{first:?}");
    let last = host.handled(&q).await?;
    assert_eq!(last.disposition, Some(Disposition::Rejected), "{last:?}");
    host.stop().await?;
    client.close().await;
    let _ = std::fs::remove_file(module);
    Ok(first.failure.unwrap_or_default())
}

#[tokio::test]
async fn a_handler_returning_an_invalid_outcome_is_retried() -> anyhow::Result<()> {
    // Discriminant 7: `outcome` has four cases.
    let failure = fails_as_retry("(i32.store8 (i32.const 16) (i32.const 7))").await?;
    assert!(failure.contains("invalid outcome"), "{failure}");
    Ok(())
}

#[tokio::test]
async fn a_handler_that_overflows_its_stack_is_retried() -> anyhow::Result<()> {
    let failure = fails_as_retry("(drop (call $handle (local.get 0)))").await?;
    assert!(failure.contains("overflowed its stack"), "{failure}");
    Ok(())
}

#[tokio::test]
async fn a_handler_that_allocates_past_its_limit_is_retried() -> anyhow::Result<()> {
    let q = unique("hog");
    let url = artemis_url();
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("memory = \"16MiB\"")
        .with("max_attempts = 2");
    let (mut host, mut client) = start_with_client(&url, &[mount]).await?;
    client
        .publish(&q, TestMessage::new(&q, "hog").header(0).script("*:hog"))
        .await?;
    let first = host.handled(&q).await?;
    assert_failed(&first, "memory limit of 16777216 bytes");
    assert_eq!(first.disposition, Some(Disposition::Modified));
    assert_eq!(
        host.handled(&q).await?.disposition,
        Some(Disposition::Rejected)
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// Loading `module_bytes` from a file named `*.{extension}` (WebAssembly
/// text is read as such from a `.wat` file only).
async fn load_error(module_bytes: &[u8], extension: &str) -> String {
    let module = std::env::temp_dir().join(format!("{}.{extension}", unique("bad-module")));
    std::fs::write(&module, module_bytes).expect("temp module");
    let mut mount = MountToml::new("orders", "fixture_script", "q");
    mount.module = module.clone();
    let text = config_text(&artemis_url(), &[mount]);
    let config = Config::parse(&text, &repo_root().join("test.toml")).expect("valid config");
    let error = match Host::load(config).await {
        Err(HostError::Modules(errors)) => errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a bad module was accepted"),
    };
    let _ = std::fs::remove_file(&module);
    assert!(error.contains(&module.display().to_string()), "{error}");
    assert!(error.contains("tenant `t`, mount `orders`"), "{error}");
    error
}

#[tokio::test]
async fn a_file_that_is_not_a_component_is_refused_at_load() {
    let error = load_error(b"not wasm at all", "wasm").await;
    assert!(
        error.contains("is not WebAssembly (it does not start with the `\\0asm` header)"),
        "{error}"
    );
}

#[tokio::test]
async fn a_component_without_the_handler_export_is_refused_at_load() {
    let error = load_error(b"(component)", "wat").await;
    assert!(error.contains("does not export `handle"), "{error}");
}

#[tokio::test]
async fn a_component_with_more_memories_than_the_pool_allows_is_refused_at_load() {
    let memories = "(memory 1) ".repeat(9);
    let module = std::fs::read(wat_handler_with(&memories, "")).expect("module");
    let error = load_error(&module, "wat").await;
    assert!(
        error.contains("memories") && error.contains("10"),
        "{error}"
    );
}

#[tokio::test]
async fn a_module_whose_start_up_traps_is_refused_at_load() {
    let module = std::fs::read(wat_handler_with(
        "(start $boom) (func $boom unreachable)",
        "",
    ))
    .expect("module");
    let error = load_error(&module, "wat").await;
    assert!(error.contains("does not start"), "{error}");
}

#[tokio::test]
async fn a_component_importing_what_the_host_lacks_is_refused_naming_the_import() {
    let error = load_error(
        br#"(component (import "acme:secret/vault" (instance (export "open" (func)))))"#,
        "wat",
    )
    .await;
    assert!(error.contains("acme:secret/vault"), "{error}");
}

#[test]
fn wharf_check_accepts_the_examples_and_refuses_a_bad_config() {
    let examples = repo_root().join("examples/wharf.toml");
    let ok = std::process::Command::new(wharf_binary())
        .args(["check", "--config"])
        .arg(&examples)
        .output()
        .expect("wharf runs");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let bad = std::env::temp_dir().join(format!("{}.toml", unique("bad-config")));
    std::fs::write(&bad, "[broker]\nurl = \"amqp://x\"\nretries = 3\n").expect("temp config");
    let refused = std::process::Command::new(wharf_binary())
        .args(["check", "--config"])
        .arg(&bad)
        .output()
        .expect("wharf runs");
    let _ = std::fs::remove_file(&bad);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains(&bad.display().to_string()), "{stderr}");
    assert!(stderr.contains("line 3"), "{stderr}");
    assert!(stderr.contains("unknown field `retries`"), "{stderr}");
}
