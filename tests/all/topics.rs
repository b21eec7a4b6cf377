//! Topic mounts on Artemis: durable subscriptions that keep messages while
//! no replica runs, shared by replicas like a queue, ended when the mount
//! is removed; retry-after copies to every subscription or to its own.

use std::collections::HashMap;

use anyhow::Context as _;
use wharf::events::Event;
use wharf_core::config::{Config, SubscriptionKind};
use wharf_core::settlement::Disposition;

use crate::client::{Client, TestMessage, input_of_output, message_id};
use crate::process::{WharfProcess, signal};
use crate::reload::{Workspace, config_reloaded};
use crate::{
    MountToml, TenantToml, TestHost, artemis_url, repo_root, tenants_text, unique, wait_for_count,
};

/// A topic address: `fanout.*` addresses are multicast on the test broker.
fn topic() -> String {
    unique("fanout.topic")
}

fn topic_mount(name: &str, address: &str) -> MountToml {
    MountToml::new(name, "fixture_script", address).with("node = \"topic\"")
}

/// A host running `tenants`, its mounts attached.
async fn start(tenants: &[TenantToml]) -> anyhow::Result<TestHost> {
    let text = tenants_text(&artemis_url(), "", tenants);
    TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await
}

/// Waits until the subscription queue `queue` holds `expected` messages:
/// the broker counts a published message once it has routed it.
async fn counted(client: &mut Client, queue: &str, expected: u64) -> anyhow::Result<()> {
    wait_for_count(queue, expected, async || client.artemis_count(queue).await).await
}

/// Ends the test's durable subscription so none is left on the broker.
async fn end(address: &str, name: &str) -> anyhow::Result<()> {
    let url = artemis_url();
    let endpoint = wharf_core::endpoint::Endpoint::parse(&url).map_err(anyhow::Error::msg)?;
    let connect = wharf::broker::ConnectOptions::of(&wharf_core::config::Broker::at(&url));
    wharf::broker::end_subscription(
        &endpoint,
        &connect,
        address,
        name,
        SubscriptionKind::DurableShared,
        crate::DEADLINE,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn messages_published_while_no_replica_runs_wait_for_the_durable_subscription()
-> anyhow::Result<()> {
    let address = topic();
    let tenants = [TenantToml::new("waits", vec![topic_mount("m", &address)])];
    let mut client = Client::connect(&artemis_url()).await?;
    let mut host = start(&tenants).await?;
    let ids = |from: usize, to: usize| {
        (from..to)
            .map(|n| format!("{address}.{n}"))
            .collect::<Vec<_>>()
    };
    client
        .publish_scripted(&address, &ids(0, 2), "*:ack")
        .await?;
    for id in ids(0, 2) {
        assert_eq!(
            host.handled(&id).await?.disposition,
            Some(Disposition::Accepted)
        );
    }
    host.stop().await?;
    // Published during the deploy: kept by the subscription.
    client
        .publish_scripted(&address, &ids(2, 5), "*:ack")
        .await?;
    counted(&mut client, "wharf.waits.m:global", 3).await?;
    let mut host = start(&tenants).await?;
    for id in ids(2, 5) {
        assert_eq!(
            host.handled(&id).await?.disposition,
            Some(Disposition::Accepted)
        );
    }
    host.stop().await?;
    end(&address, "wharf.waits.m").await?;
    counted(&mut client, "wharf.waits.m:global", 0).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn three_replicas_share_a_topic_subscription_and_a_killed_one_loses_nothing()
-> anyhow::Result<()> {
    const MESSAGES: usize = 300;
    let address = topic();
    let outputs = unique("topic-out");
    let name = unique("shared");
    let mount = topic_mount("m", &address)
        .with(&format!("subscription_name = \"{name}\""))
        .with("concurrency = 4")
        .with("credit = 8")
        .with("[tenant.mount.grants]")
        .with("clocks = true")
        .with(&format!("send = [\"{outputs}\"]"));
    let text = tenants_text(&artemis_url(), "", &[TenantToml::new("t", vec![mount])]);
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let mut replica = WharfProcess::start_config(&text).await?;
        replica.wait_for_log("mount attached").await?;
        replicas.push(replica);
    }
    let mut client = Client::connect(&artemis_url()).await?;
    let mut watcher = client.watch(&outputs).await?;
    let ids: Vec<String> = (0..MESSAGES).map(|n| format!("{address}.{n}")).collect();
    client
        .publish_scripted(&address, &ids, &format!("*:send={outputs},busy=40"))
        .await?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut killed = false;
    while seen.len() < MESSAGES {
        let (_, output) = watcher
            .next()
            .await
            .with_context(|| format!("an output after {} inputs", seen.len()))?;
        let id = message_id(&output).context("an output without an id")?;
        let input = input_of_output(&id, 0).context("an output of no input")?;
        *seen.entry(input.to_owned()).or_default() += 1;
        if !killed && seen.len() >= MESSAGES / 4 {
            signal(&replicas[0], "-KILL").await?;
            killed = true;
        }
    }
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    println!(
        "3 replicas on one shared subscription, one killed after {} messages: {MESSAGES} published, {} handled, {duplicates} duplicated, 0 lost",
        MESSAGES / 4,
        seen.len()
    );
    // Only the killed replica's unsettled deliveries come again: at most
    // its credit.
    assert!(duplicates <= 8, "{duplicates} duplicates");
    for replica in &replicas[1..] {
        signal(replica, "-TERM").await?;
    }
    watcher.close().await;
    client.close().await;
    end(&address, &name).await?;
    Ok(())
}

#[tokio::test]
async fn a_retry_after_copy_reaches_every_subscription_or_only_its_own() -> anyhow::Result<()> {
    for own in [false, true] {
        let address = topic();
        let names = [unique("one"), unique("two")];
        let mounts = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let mut mount = topic_mount(&format!("m{i}"), &address)
                    .with(&format!("subscription_name = \"{name}\""));
                if own {
                    mount = mount.with("retry_copies_to = \"subscription\"");
                }
                mount
            })
            .collect();
        let mut host = start(&[TenantToml::new("t", mounts)]).await?;
        let mut client = Client::connect(&artemis_url()).await?;
        let id = unique("after");
        client
            .publish(
                &address,
                TestMessage::new(&id, "x")
                    .header(0)
                    .script("1:after=200 *:ack"),
            )
            .await?;
        // Each subscription's own copy, and with copies to the address the
        // other's too.
        let per_mount = if own { 2 } else { 3 };
        let mut handled: HashMap<String, usize> = HashMap::new();
        for _ in 0..2 * per_mount {
            let h = host.handled(&id).await?;
            *handled.entry(h.mount.to_string()).or_default() += 1;
        }
        // A marker behind the copies: any copy still to come would come
        // before it.
        let marker = unique("marker");
        client
            .publish(&address, TestMessage::new(&marker, "x"))
            .await?;
        host.handled(&marker).await?;
        host.handled(&marker).await?;
        assert!(
            !host.seen(|e| matches!(e, Event::Handled(h) if h.message_id.as_deref() == Some(&id))),
            "a copy reached a subscription it was not for"
        );
        assert_eq!(handled["m0"], per_mount, "{handled:?}");
        assert_eq!(handled["m1"], per_mount, "{handled:?}");
        host.stop().await?;
        client.close().await;
        for name in &names {
            end(&address, name).await?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_stop_keeps_the_subscription_and_removing_the_mount_ends_it() -> anyhow::Result<()> {
    let url = artemis_url();
    let address = topic();
    let files = Workspace::new()?;
    let with_mount = tenants_text(
        &url,
        "",
        &[TenantToml::new(
            "stops",
            vec![
                topic_mount("m", &address),
                MountToml::new("other", "fixture_script", &unique("other")),
            ],
        )],
    );
    files.replace("wharf.toml", with_mount.as_bytes())?;
    let mut client = Client::connect(&url).await?;
    let host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    host.stop().await?;
    client
        .publish(&address, TestMessage::new(&unique("kept"), "x"))
        .await?;
    counted(&mut client, "wharf.stops.m:global", 1).await?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    let without_mount = tenants_text(
        &url,
        "",
        &[TenantToml::new(
            "stops",
            vec![MountToml::new("other", "fixture_script", &unique("other"))],
        )],
    );
    files.replace("wharf.toml", without_mount.as_bytes())?;
    let change = config_reloaded(&mut host).await?;
    assert!(change.removed.contains(&"stops/m".to_owned()), "{change:?}");
    client
        .publish(&address, TestMessage::new(&unique("after"), "x"))
        .await?;
    counted(&mut client, "wharf.stops.m:global", 0).await?;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_volatile_subscription_keeps_nothing_while_the_mount_is_away() -> anyhow::Result<()> {
    let address = topic();
    let tenants = [TenantToml::new(
        "volatile",
        vec![topic_mount("m", &address).with("subscription = \"volatile\"")],
    )];
    let mut client = Client::connect(&artemis_url()).await?;
    let host = start(&tenants).await?;
    host.stop().await?;
    let lost = unique("lost");
    client
        .publish(&address, TestMessage::new(&lost, "x"))
        .await?;
    let mut host = start(&tenants).await?;
    let marker = unique("marker");
    client
        .publish(&address, TestMessage::new(&marker, "x"))
        .await?;
    host.handled(&marker).await?;
    assert!(
        !host.seen(|e| matches!(e, Event::Handled(h) if h.message_id.as_deref() == Some(&lost)))
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn wharf_unsubscribe_ends_a_stopped_mounts_subscription() -> anyhow::Result<()> {
    let address = topic();
    let tenants = [TenantToml::new(
        "unsubscribes",
        vec![topic_mount("m", &address)],
    )];
    let text = tenants_text(&artemis_url(), "", &tenants);
    let mut client = Client::connect(&artemis_url()).await?;
    start(&tenants).await?.stop().await?;
    client
        .publish(&address, TestMessage::new(&unique("kept"), "x"))
        .await?;
    counted(&mut client, "wharf.unsubscribes.m:global", 1).await?;
    let config = std::env::temp_dir().join(format!("{}.toml", unique("unsubscribe")));
    std::fs::write(&config, text)?;
    let ended = tokio::process::Command::new(crate::process::wharf_binary())
        .args([
            "unsubscribe",
            "--tenant",
            "unsubscribes",
            "--mount",
            "m",
            "--config",
        ])
        .arg(&config)
        .output()
        .await?;
    let _ = std::fs::remove_file(&config);
    let stdout = String::from_utf8_lossy(&ended.stdout);
    assert!(
        ended.status.success(),
        "{}",
        String::from_utf8_lossy(&ended.stderr)
    );
    assert!(
        stdout.contains("ended subscription `wharf.unsubscribes.m`"),
        "{stdout}"
    );
    client
        .publish(&address, TestMessage::new(&unique("gone"), "x"))
        .await?;
    counted(&mut client, "wharf.unsubscribes.m:global", 0).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_topic_mount_on_rabbitmq_is_refused_with_what_to_do_instead() -> anyhow::Result<()> {
    let tenants = [TenantToml::new(
        "t",
        vec![topic_mount("m", "/exchanges/amq.topic")],
    )];
    let text = tenants_text(&crate::rabbitmq_url(), "", &tenants);
    let mut host =
        TestHost::start_unattached(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    let error = host
        .next(|e| match e {
            Event::MountDown { error, .. } => Some(error.clone()),
            _ => None,
        })
        .await?;
    assert!(
        error.contains("RabbitMQ has no topic source") && error.contains("bind a queue"),
        "{error}"
    );
    host.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_shared_topic_mount_replaced_by_a_reload_loses_nothing() -> anyhow::Result<()> {
    const EACH: usize = 100;
    let url = artemis_url();
    let address = topic();
    let files = Workspace::new()?;
    let config = |concurrency: u32| {
        tenants_text(
            &url,
            "",
            &[TenantToml::new(
                "reloads",
                vec![topic_mount("m", &address).with(&format!("concurrency = {concurrency}"))],
            )],
        )
    };
    files.replace("wharf.toml", config(2).as_bytes())?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    let mut client = Client::connect(&url).await?;
    let ids: Vec<String> = (0..2 * EACH).map(|n| format!("{address}.{n}")).collect();
    client
        .publish_scripted(&address, &ids[..EACH], "*:ack")
        .await?;
    // Replaced while the first half is being handled: the new link attaches
    // to the same subscription before the old one drains.
    files.replace("wharf.toml", config(4).as_bytes())?;
    let change = config_reloaded(&mut host).await?;
    assert_eq!(change.replaced, ["reloads/m"], "{change:?}");
    client
        .publish_scripted(&address, &ids[EACH..], "*:ack")
        .await?;
    let mut handled: HashMap<String, usize> = HashMap::new();
    while handled.len() < ids.len() {
        let id = host
            .next(|e| match e {
                Event::Handled(h) if h.disposition == Some(Disposition::Accepted) => {
                    h.message_id.clone()
                }
                _ => None,
            })
            .await?;
        *handled.entry(id).or_default() += 1;
    }
    let duplicates: usize = handled.values().map(|n| n - 1).sum();
    assert_eq!(duplicates, 0, "{handled:?}");
    host.stop().await?;
    client.close().await;
    end(&address, "wharf.reloads.m").await?;
    Ok(())
}

/// A topic mount of `kind` renamed by a reload while its messages wait,
/// the renamed one's module failing to start: the new config names the
/// same subscription, so it is not ended with the old mount, and once the
/// module is mended every message is handled.
async fn renamed_keeps_backlog(kind: SubscriptionKind) -> anyhow::Result<()> {
    const N: usize = 20;
    let url = artemis_url();
    let address = topic();
    let subscription = unique("kept-subscription");
    let files = Workspace::new()?;
    let trapping = crate::limits::wat_handler_with("(start $boom) (func $boom unreachable)", "");
    let config = |name: &str, module: Option<&std::path::Path>| {
        let mut mount = topic_mount(name, &address)
            .with(&format!(
                "subscription = \"{}\"\nsubscription_name = \"{subscription}\"",
                kind.as_str()
            ))
            .with("credit = 1\nconcurrency = 1")
            .with("[tenant.mount.grants]\nclocks = true");
        if let Some(module) = module {
            mount.module = module.to_owned();
        }
        // One container-id throughout: the exclusive subscription is the
        // container's.
        let text = tenants_text(&url, "", &[TenantToml::new("renames", vec![mount])]);
        let (_, rest) = text.split_once("[host]").expect("a [host] section");
        format!("[broker]\nurl = \"{url}\"\ncontainer_id = \"{subscription}\"\n[host]{rest}")
    };
    files.replace("wharf.toml", config("before", None).as_bytes())?;
    let mut host = TestHost::start_config(Config::load(&files.path("wharf.toml"))?).await?;
    let mut client = Client::connect(&url).await?;
    let ids: Vec<String> = (0..N).map(|n| format!("{address}.{n}")).collect();
    client
        .publish_scripted(&address, &ids, "*:busy=200")
        .await?;
    files.replace("wharf.toml", config("after", Some(&trapping)).as_bytes())?;
    let change = crate::reload::config_change(&mut host).await?;
    assert_eq!(change.removed, ["renames/before"], "{change:?}");
    assert!(change.error.is_some(), "{change:?}");
    files.replace("wharf.toml", config("after", None).as_bytes())?;
    config_reloaded(&mut host).await?;
    let mut handled: HashMap<String, usize> = HashMap::new();
    while handled.len() < N {
        let id = host
            .next(|e| match e {
                Event::Handled(h) if h.disposition == Some(Disposition::Accepted) => {
                    h.message_id.clone()
                }
                _ => None,
            })
            .await
            .with_context(|| format!("{kind:?}: {} of {N} handled", handled.len()))?;
        *handled.entry(id).or_default() += 1;
    }
    host.stop().await?;
    client.close().await;
    let _ = std::fs::remove_file(trapping);
    if kind == SubscriptionKind::DurableShared {
        end(&address, &subscription).await?;
    }
    Ok(())
}

#[tokio::test]
async fn renaming_a_topic_mount_that_keeps_its_subscription_name_keeps_its_backlog()
-> anyhow::Result<()> {
    renamed_keeps_backlog(SubscriptionKind::Durable).await?;
    renamed_keeps_backlog(SubscriptionKind::DurableShared).await
}
