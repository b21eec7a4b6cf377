//! Hostile handlers: what a module can reach on the host is bounded, the
//! hostile delivery ends as the contract says (a failure is a `retry`), and
//! a second tenant on the same host is served throughout. Each runs the
//! `wharf` binary, so its memory and file descriptors are the host's alone.

use anyhow::Context as _;

use crate::client::{Client, message_id};
use crate::process::{WharfProcess, open_fds, peak_resident};
use crate::{MountToml, TenantToml, artemis_url, tenants_text, unique};

/// What a host serving the fixtures below may hold resident at its peak.
const RSS_BOUND: u64 = 256 << 20;

/// Deliveries of each hostile action.
const HOSTILE: usize = 8;
/// Deliveries of the neighbour tenant.
const NEIGHBOUR: usize = 100;

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_creating_header_maps_in_a_loop_is_stopped_within_its_resources()
-> anyhow::Result<()> {
    let (granted, ungranted, neighbour) = (
        unique("fields"),
        unique("fields-ungranted"),
        unique("neighbour"),
    );
    let (granted_dla, ungranted_dla, handled) = (
        format!("{granted}.dlq"),
        format!("{ungranted}.dlq"),
        format!("{neighbour}.out"),
    );
    let hostile = |name: &str, queue: &str, dla: &str| {
        MountToml::new(name, "fixture_script", queue)
            .with("concurrency = 4")
            .with("max_attempts = 1")
            .with(&format!("dead_letter = \"{dla}\""))
    };
    let tenants = [
        TenantToml::new(
            "hostile",
            vec![
                hostile("granted", &granted, &granted_dla)
                    .with("[tenant.mount.grants]")
                    .with("http = [\"http://127.0.0.1:9\"]"),
                hostile("ungranted", &ungranted, &ungranted_dla),
            ],
        ),
        TenantToml::new(
            "neighbour",
            vec![
                MountToml::new("m", "fixture_script", &neighbour)
                    .with("[tenant.mount.grants]")
                    .with(&format!("send = [\"{handled}\"]")),
            ],
        ),
    ];
    let url = artemis_url();
    let mut wharf = WharfProcess::start_config(&tenants_text(&url, "", &tenants)).await?;
    let fds_before = open_fds(&wharf)?;
    let mut client = Client::connect(&url).await?;
    let mut granted_dead = client.watch(&granted_dla).await?;
    let mut ungranted_dead = client.watch(&ungranted_dla).await?;
    let mut outputs = client.watch(&handled).await?;
    let ids = |queue: &str, n: usize| (0..n).map(|i| format!("{queue}.{i}")).collect::<Vec<_>>();
    client
        .publish_scripted(&granted, &ids(&granted, HOSTILE), "*:fields")
        .await?;
    client
        .publish_scripted(&ungranted, &ids(&ungranted, HOSTILE), "*:fields")
        .await?;
    client
        .publish_scripted(
            &neighbour,
            &ids(&neighbour, NEIGHBOUR),
            &format!("*:send={handled},ack"),
        )
        .await?;

    // Every hostile delivery failed its one attempt and was dead-lettered;
    // every neighbour delivery was handled. From here on nobody reads the
    // host's log: a stalled log pipe must not stall the host.
    wharf
        .wait_for_log("resource table has no free keys")
        .await?;
    wharf
        .wait_for_log("which this mount does not grant; add `http = [")
        .await?;
    let mut dead = Vec::new();
    for i in 0..HOSTILE {
        dead.push(message_id(
            &granted_dead
                .next()
                .await
                .with_context(|| format!("granted {i}"))?
                .1,
        ));
        dead.push(message_id(
            &ungranted_dead
                .next()
                .await
                .with_context(|| format!("ungranted {i}"))?
                .1,
        ));
    }
    for i in 0..NEIGHBOUR {
        outputs
            .next()
            .await
            .with_context(|| format!("neighbour {i}"))?;
    }
    let peak = peak_resident(&wharf)?;
    let fds_after = open_fds(&wharf)?;
    println!(
        "hostile header maps: {} deliveries of `fields` ({HOSTILE} with grants.http, stopped at {} resources; {HOSTILE} without, denied), all dead-lettered; {NEIGHBOUR} neighbour deliveries handled; peak RSS {} MiB; open fds {fds_before} before, {fds_after} after",
        2 * HOSTILE,
        wharf::sandbox::MAX_RESOURCES,
        peak >> 20
    );
    assert_eq!(dead.len(), 2 * HOSTILE);
    assert!(peak < RSS_BOUND, "peak RSS {peak} bytes");
    assert!(
        fds_after <= fds_before + 8,
        "fds {fds_before} -> {fds_after}"
    );
    assert!(wharf.child.try_wait()?.is_none(), "the host exited");
    for watcher in [granted_dead, ungranted_dead, outputs] {
        watcher.close().await;
    }
    client.close().await;
    Ok(())
}
