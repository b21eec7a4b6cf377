//! Hot reload under load: module files replaced and mounts added and
//! removed while messages keep arriving; nothing is lost or handled twice.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use wharf::events::{ConfigChange, Event};
use wharf_core::config::Config;
use wharf_core::settlement::Disposition;

use crate::client::{Client, TestMessage};
use crate::{
    MountToml, TenantToml, TestHost, artemis_url, guest, tenants_text, unique, wait_for_count,
};

/// A folder of its own for one test's config and module files.
pub(crate) struct Workspace(PathBuf);

impl Workspace {
    pub(crate) fn new() -> anyhow::Result<Workspace> {
        let dir = std::env::temp_dir().join(unique("wharf-reload"));
        std::fs::create_dir_all(&dir)?;
        Ok(Workspace(dir))
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Replaces `name` whole, as deploy tools do: write aside, then rename.
    pub(crate) fn replace(&self, name: &str, contents: &[u8]) -> anyhow::Result<()> {
        let aside = self.path(&format!(".{name}.{}", unique("new")));
        std::fs::write(&aside, contents)?;
        std::fs::rename(&aside, self.path(name))?;
        Ok(())
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `component` with a custom section appended: the same handler, a
/// different file (and so a different version).
fn tagged(component: &[u8], tag: &str) -> Vec<u8> {
    let name = b"wharf-test-tag";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(tag.as_bytes());
    let mut bytes = component.to_vec();
    bytes.push(0);
    let mut size = payload.len();
    loop {
        let byte = (size & 0x7f) as u8;
        size >>= 7;
        if size == 0 {
            bytes.push(byte);
            break;
        }
        bytes.push(byte | 0x80);
    }
    bytes.extend_from_slice(&payload);
    bytes
}

fn config(url: &str, module: &Path, queue: &str, extra: Option<&str>) -> String {
    let mut main = MountToml::new("main", "fixture_script", queue);
    main.module = module.to_owned();
    let mut mounts = vec![main];
    if let Some(extra) = extra {
        mounts.push(MountToml::new("extra", "fixture_script", extra));
    }
    tenants_text(url, "", &[TenantToml::new("t", mounts)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_and_mounts_reload_under_load_without_losing_a_message() -> anyhow::Result<()> {
    const SWAPS: usize = 10;
    let url = artemis_url();
    let files = Workspace::new()?;
    let original = std::fs::read(guest("fixture_script"))?;
    let versions = [tagged(&original, "one"), tagged(&original, "two")];
    files.replace("handler.wasm", &versions[0])?;
    let queue = unique("reload");
    let extra_queue = unique("reload-extra");
    let module = files.path("handler.wasm");
    files.replace("wharf.toml", config(&url, &module, &queue, None).as_bytes())?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;

    // Messages arrive all along, about 200 a second, from a client of
    // their own, until every swap is done.
    let stop = stop_flag();
    let publisher = {
        let (url, queue, stop) = (url.clone(), queue.clone(), stop.clone());
        tokio::spawn(async move {
            let mut client = Client::connect(&url).await?;
            let mut pace = tokio::time::interval(Duration::from_millis(5));
            let mut sent = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                pace.tick().await;
                client
                    .publish(&queue, TestMessage::new(&format!("{queue}.{sent}"), "x"))
                    .await?;
                sent += 1;
            }
            client.close().await;
            anyhow::Ok(sent)
        })
    };

    let mut switch_times = Vec::new();
    let mut seen_versions = Vec::new();
    for swap in 0..SWAPS {
        let next = &versions[(swap + 1) % 2];
        let asked = Instant::now();
        files.replace("handler.wasm", next)?;
        let (version, error) = host
            .next(|e| match e {
                Event::ModuleReloaded { version, error, .. } => {
                    Some((version.clone(), error.clone()))
                }
                _ => None,
            })
            .await?;
        assert_eq!(error, None);
        switch_times.push(asked.elapsed());
        seen_versions.push(version);
        if swap == SWAPS / 2 {
            // A mount comes and goes while the other one keeps serving.
            files.replace(
                "wharf.toml",
                config(&url, &module, &queue, Some(&extra_queue)).as_bytes(),
            )?;
            let change = config_reloaded(&mut host).await?;
            assert_eq!(change.added, ["t/extra"], "{change:?}");
            assert!(
                change.replaced.is_empty() && change.removed.is_empty(),
                "{change:?}"
            );
            let mut client = Client::connect(&url).await?;
            client
                .publish(&extra_queue, TestMessage::new(&extra_queue, "x"))
                .await?;
            assert_eq!(
                host.handled(&extra_queue).await?.disposition,
                Some(Disposition::Accepted)
            );
            client.close().await;
            files.replace("wharf.toml", config(&url, &module, &queue, None).as_bytes())?;
            let change = config_reloaded(&mut host).await?;
            assert_eq!(change.removed, ["t/extra"], "{change:?}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let messages = publisher.await??;

    let mut handled: HashMap<String, usize> = HashMap::new();
    let mut by_version: HashMap<String, usize> = HashMap::new();
    while handled.len() < messages {
        let h = host
            .next(|e| match e {
                Event::Handled(h) if &*h.mount == "main" => Some(h.clone()),
                _ => None,
            })
            .await?;
        assert_eq!(h.disposition, Some(Disposition::Accepted), "{h:?}");
        *handled.entry(h.message_id.unwrap_or_default()).or_default() += 1;
        *by_version.entry(h.module_version.to_string()).or_default() += 1;
    }
    host.stop().await?;
    let mut client = Client::connect(&url).await?;
    // All accepted and none left: nothing can come back a second time.
    wait_for_count(&queue, 0, async || client.artemis_count(&queue).await).await?;
    client.close().await;
    let twice: Vec<_> = handled.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(handled.len(), messages);
    assert_eq!(by_version.len(), 2, "both versions served: {by_version:?}");
    let slowest = switch_times.iter().max().copied().unwrap_or_default();
    let mean = switch_times.iter().sum::<Duration>() / switch_times.len() as u32;
    eprintln!(
        "reload: {messages} messages, each handled once ({by_version:?} by version), {SWAPS} swaps, switch mean {mean:?}, slowest {slowest:?}"
    );
    assert_eq!(seen_versions.len(), SWAPS);
    Ok(())
}

fn stop_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    std::sync::Arc::default()
}

/// The next config reload, which must have succeeded.
pub(crate) async fn config_reloaded(host: &mut TestHost) -> anyhow::Result<ConfigChange> {
    let change = config_change(host).await?;
    anyhow::ensure!(change.error.is_none(), "{change:?}");
    Ok(change)
}

/// The next config reload, whatever its result.
pub(crate) async fn config_change(host: &mut TestHost) -> anyhow::Result<ConfigChange> {
    host.next(|e| match e {
        Event::ConfigReloaded(change) => Some(change.clone()),
        _ => None,
    })
    .await
}

#[tokio::test]
async fn a_module_that_does_not_load_leaves_the_old_one_serving() -> anyhow::Result<()> {
    let url = artemis_url();
    let files = Workspace::new()?;
    files.replace("handler.wasm", &std::fs::read(guest("fixture_script"))?)?;
    let queue = unique("reload-bad");
    let module = files.path("handler.wasm");
    files.replace("wharf.toml", config(&url, &module, &queue, None).as_bytes())?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    files.replace("handler.wasm", b"not a component")?;
    let error = host
        .next(|e| match e {
            Event::ModuleReloaded { error, .. } => Some(error.clone()),
            _ => None,
        })
        .await?;
    let error = error.expect("the broken file is refused");
    assert!(error.contains("handler.wasm"), "{error}");
    let mut client = Client::connect(&url).await?;
    client
        .publish(&queue, TestMessage::new(&queue, "x"))
        .await?;
    assert_eq!(
        host.handled(&queue).await?.disposition,
        Some(Disposition::Accepted)
    );
    // A config that does not load changes nothing either.
    files.replace("wharf.toml", b"[broker]\nurl = 5\n")?;
    let change = config_change(&mut host).await?;
    assert!(change.error.is_some_and(|e| e.contains("wharf.toml")));
    client
        .publish(&queue, TestMessage::new(&queue, "y"))
        .await?;
    assert_eq!(
        host.handled(&queue).await?.disposition,
        Some(Disposition::Accepted)
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_changed_mount_that_cannot_attach_leaves_the_old_one_serving() -> anyhow::Result<()> {
    let url = artemis_url();
    let files = Workspace::new()?;
    let queue = unique("reload-unreachable");
    let tenant = |broker_url: &str| {
        TenantToml::new("t", vec![MountToml::new("main", "fixture_script", &queue)])
            .with("[tenant.broker]")
            .with(&format!("url = \"{broker_url}\""))
            .with("connect_timeout = \"1s\"")
    };
    files.replace(
        "wharf.toml",
        tenants_text(&url, "", &[tenant(&url)]).as_bytes(),
    )?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    // The tenant moves to a broker nobody listens on.
    let nowhere = "amqp://admin:admin@127.0.0.1:1";
    files.replace(
        "wharf.toml",
        tenants_text(&url, "", &[tenant(nowhere)]).as_bytes(),
    )?;
    let change = config_change(&mut host).await?;
    let error = change.error.expect("the reload failed");
    assert!(
        error.contains("t/main") && error.contains("keeps serving"),
        "{error}"
    );
    let mut client = Client::connect(&url).await?;
    client
        .publish(&queue, TestMessage::new(&queue, "x"))
        .await?;
    assert_eq!(
        host.handled(&queue).await?.disposition,
        Some(Disposition::Accepted)
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_new_module_whose_start_up_traps_is_refused_and_the_old_one_serves() -> anyhow::Result<()>
{
    let url = artemis_url();
    let files = Workspace::new()?;
    files.replace("handler.wasm", &std::fs::read(guest("fixture_script"))?)?;
    let queue = unique("reload-trap");
    let module = files.path("handler.wasm");
    files.replace("wharf.toml", config(&url, &module, &queue, None).as_bytes())?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    let trapping = crate::limits::wat_handler_with("(start $boom) (func $boom unreachable)", "");
    files.replace("handler.wasm", &std::fs::read(trapping)?)?;
    let error = host
        .next(|e| match e {
            Event::ModuleReloaded { error, .. } => Some(error.clone()),
            _ => None,
        })
        .await?
        .expect("the trapping module is refused");
    assert!(error.contains("does not start"), "{error}");
    let mut client = Client::connect(&url).await?;
    client
        .publish(&queue, TestMessage::new(&queue, "x"))
        .await?;
    assert_eq!(
        host.handled(&queue).await?.disposition,
        Some(Disposition::Accepted)
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn files_behind_a_swapped_symlink_reload_as_kubernetes_swaps_them() -> anyhow::Result<()> {
    use std::os::unix::fs::symlink;
    let url = artemis_url();
    let files = Workspace::new()?;
    let queue = unique("reload-symlink");
    let extra = unique("reload-symlink-extra");
    let fixture = std::fs::read(guest("fixture_script"))?;
    // A ConfigMap volume: the files are links into `..data`, itself a link
    // to the current version's folder.
    let version = |name: &str, tag: &str, extra: Option<&str>| -> anyhow::Result<()> {
        let folder = files.path(name);
        std::fs::create_dir_all(&folder)?;
        std::fs::write(folder.join("handler.wasm"), tagged(&fixture, tag))?;
        let text = config(&url, &files.path("handler.wasm"), &queue, extra);
        std::fs::write(folder.join("wharf.toml"), text)?;
        Ok(())
    };
    version("..v1", "v1", None)?;
    symlink("..v1", files.path("..data"))?;
    symlink("..data/handler.wasm", files.path("handler.wasm"))?;
    symlink("..data/wharf.toml", files.path("wharf.toml"))?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    version("..v2", "v2", Some(&extra))?;
    symlink("..v2", files.path("..data_tmp"))?;
    std::fs::rename(files.path("..data_tmp"), files.path("..data"))?;
    let change = config_reloaded(&mut host).await?;
    assert_eq!(change.added, ["t/extra"], "{change:?}");
    let swapped = host
        .next(|e| match e {
            Event::ModuleReloaded { error, version, .. } => Some((error.clone(), version.clone())),
            _ => None,
        })
        .await?;
    assert_eq!(swapped.0, None, "the new module loads");
    let mut client = Client::connect(&url).await?;
    client
        .publish(&queue, TestMessage::new(&queue, "x"))
        .await?;
    let handled = host.handled(&queue).await?;
    assert_eq!(handled.module_version, swapped.1, "the new version serves");
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// A config and its modules come from volumes updated apart: a config
/// naming a module that is not there yet fails to load, then loads once the
/// module arrives, with no signal and no other change.
#[tokio::test]
async fn a_config_naming_a_module_not_there_yet_reloads_when_it_arrives() -> anyhow::Result<()> {
    let url = artemis_url();
    let files = Workspace::new()?;
    let fixture = std::fs::read(guest("fixture_script"))?;
    files.replace("handler.wasm", &fixture)?;
    let (queue, late_queue) = (unique("reload-late"), unique("reload-late-new"));
    let text = |late: bool| {
        let mut main = MountToml::new("main", "fixture_script", &queue);
        main.module = files.path("handler.wasm");
        let mut mounts = vec![main];
        if late {
            let mut late = MountToml::new("late", "fixture_script", &late_queue);
            late.module = files.path("late.wasm");
            mounts.push(late);
        }
        tenants_text(&url, "", &[TenantToml::new("t", mounts)])
    };
    files.replace("wharf.toml", text(false).as_bytes())?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    files.replace("wharf.toml", text(true).as_bytes())?;
    let failed = config_change(&mut host).await?;
    let error = failed.error.expect("the module is missing");
    assert!(error.contains("late.wasm"), "{error}");
    files.replace("late.wasm", &fixture)?;
    let change = config_reloaded(&mut host).await?;
    assert_eq!(change.added, ["t/late"], "{change:?}");
    host.next(|e| matches!(e, Event::MountReady { mount, .. } if &**mount == "late").then_some(()))
        .await?;
    let mut client = Client::connect(&url).await?;
    client
        .publish(&late_queue, TestMessage::new(&late_queue, "x"))
        .await?;
    assert_eq!(
        host.handled(&late_queue).await?.disposition,
        Some(Disposition::Accepted)
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_reload_from_one_mount_to_fifty_tenants_with_more_memory_serves_every_mount()
-> anyhow::Result<()> {
    const TENANTS: usize = 50;
    let url = artemis_url();
    let files = Workspace::new()?;
    // A pool of 8 instances, first filled by one mount of 16 MiB.
    let host_lines = "max_instances = 8";
    let first = unique("grow-first");
    let small = TenantToml::new(
        "first",
        vec![
            MountToml::new("m", "fixture_script", &first)
                .with("memory = \"16MiB\"")
                .with("concurrency = 8")
                .with("instance = \"reuse\"")
                .with("instance_max_idle = \"10m\"")
                .with("[tenant.mount.grants]")
                .with("clocks = true"),
        ],
    );
    files.replace(
        "wharf.toml",
        tenants_text(&url, host_lines, &[small]).as_bytes(),
    )?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    // Eight kept instances of the first mount fill the pool.
    let mut client = Client::connect(&url).await?;
    let ids: Vec<String> = (0..8).map(|n| format!("{first}.{n}")).collect();
    client.publish_scripted(&first, &ids, "*:busy=300").await?;
    for id in &ids {
        assert_eq!(
            host.handled(id).await?.disposition,
            Some(Disposition::Accepted)
        );
    }
    let queues: Vec<String> = (0..TENANTS).map(|_| unique("grow")).collect();
    let tenants: Vec<TenantToml> = queues
        .iter()
        .enumerate()
        .map(|(i, queue)| {
            TenantToml::new(
                &format!("t{i}"),
                vec![MountToml::new("m", "fixture_script", queue).with("memory = \"64MiB\"")],
            )
        })
        .collect();
    files.replace(
        "wharf.toml",
        tenants_text(&url, host_lines, &tenants).as_bytes(),
    )?;
    let change = config_reloaded(&mut host).await?;
    assert_eq!(change.added.len(), TENANTS, "{change:?}");
    assert_eq!(change.removed, ["first/m"]);
    // Each handler grows its memory past the 16 MiB of the first config.
    for queue in &queues {
        client
            .publish(
                queue,
                TestMessage::new(queue, "x").header(0).script("*:grow=40"),
            )
            .await?;
    }
    for queue in &queues {
        assert_eq!(
            host.handled(queue).await?.disposition,
            Some(Disposition::Accepted),
            "{queue}"
        );
    }
    host.stop().await?;
    client.close().await;
    Ok(())
}
