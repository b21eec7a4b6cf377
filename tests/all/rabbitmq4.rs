//! RabbitMQ 4 (AMQP 1.0 in the core): classic queues count nothing, quorum
//! queues count and dead-letter on their own, streams cannot requeue. wharf
//! asks the broker which one an address is and carries retries so that a
//! poison message reaches its limit on every kind.

use std::collections::BTreeMap;

use wharf::broker::management::QueueKind;
use wharf::events::Event;
use wharf::settlement::{Disposition, Publish, RetryPath};

use crate::client::{Client, TestMessage};
use crate::process::WharfProcess;
use crate::{MountToml, TestHost, config_text, rabbitmq4_shared, rabbitmq4_url, unique};
use wharf_tests::rabbitmq4::{declare, delete};

/// Takes `n` messages off `address` and returns their ids.
async fn take(client: &mut Client, address: &str, n: usize) -> anyhow::Result<Vec<String>> {
    let mut watch = client.watch(address).await?;
    let mut ids = Vec::new();
    while ids.len() < n {
        let (_, message) = watch.next().await?;
        ids.push(message.message_id().unwrap_or_default());
    }
    watch.close().await;
    Ok(ids)
}

/// The mount's queue kind and retry path, as it attached.
async fn attached(host: &mut TestHost) -> anyhow::Result<(Option<QueueKind>, RetryPath)> {
    host.next(|e| match e {
        Event::MountReady { queue, retry, .. } => Some((queue.clone(), *retry)),
        _ => None,
    })
    .await
}

/// Five messages whose handler always retries, on `address` with three
/// attempts and a dead-letter queue: every one must be handled exactly at
/// attempts 1, 2 and 3 and then be dead-lettered.
async fn poison(
    address: &str,
    dla: &str,
    label: &str,
) -> anyhow::Result<(Option<QueueKind>, RetryPath)> {
    let url = rabbitmq4_url();
    let mount = MountToml::new("m", "fixture_script", address)
        .with("max_attempts = 3")
        .with(&format!("dead_letter = \"{dla}\""));
    let mut host = TestHost::start(&url, &[mount]).await?;
    let kind = attached(&mut host).await?;
    let mut client = Client::connect(&url).await?;
    let ids: Vec<String> = (0..5)
        .map(|n| format!("{}.{n}", unique("poison")))
        .collect();
    client
        .publish_many(
            address,
            ids.iter()
                .map(|id| TestMessage::new(id, "x").script("*:retry").build()),
        )
        .await?;
    let mut attempts: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut dead_lettered = 0;
    let mut calls = 0;
    while dead_lettered < ids.len() {
        let handled = host
            .next(|e| match e {
                Event::Handled(h) => Some(h.clone()),
                _ => None,
            })
            .await?;
        calls += 1;
        anyhow::ensure!(
            calls <= 3 * ids.len(),
            "{label}: more than 15 handler calls: {attempts:?}"
        );
        let id = handled.message_id.clone().unwrap_or_default();
        attempts.entry(id).or_default().push(handled.attempt);
        if handled.plan.publish() == Some(Publish::DeadLetter)
            && handled.disposition == Some(Disposition::Accepted)
        {
            dead_lettered += 1;
        }
    }
    for (id, seen) in &attempts {
        let mut seen = seen.clone();
        seen.sort_unstable();
        assert_eq!(seen, [1, 2, 3], "{label}: {id}");
    }
    let on_dla = take(&mut client, dla, ids.len()).await?;
    println!(
        "RabbitMQ 4, {label}: {calls} handler calls for 5 poison messages, {} dead-lettered at attempt 3 (retry path {:?})",
        on_dla.len(),
        kind.1
    );
    host.stop().await?;
    client.close().await;
    Ok(kind)
}

#[tokio::test]
async fn a_poison_message_on_a_classic_queue_reaches_its_limit() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let (q, dla) = (unique("rmq4-classic"), unique("rmq4-classic-dla"));
    declare(&q, "classic", "").await?;
    declare(&dla, "classic", "").await?;
    let kind = poison(
        &format!("/queues/{q}"),
        &format!("/queues/{dla}"),
        "classic queue",
    )
    .await?;
    assert_eq!(kind, (Some(QueueKind::Classic), RetryPath::Copy));
    delete(&q).await?;
    delete(&dla).await
}

#[tokio::test]
async fn a_poison_message_on_a_plain_v1_address_reaches_its_limit() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    // A plain name is a classic queue the broker declares on first use.
    let (q, dla) = (unique("rmq4-v1"), unique("rmq4-v1-dla"));
    let kind = poison(&q, &dla, "v1 address (classic)").await?;
    assert_eq!(kind, (Some(QueueKind::Classic), RetryPath::Copy));
    delete(&q).await?;
    delete(&dla).await
}

#[tokio::test]
async fn a_poison_message_on_a_quorum_queue_reaches_its_limit() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let (q, dla) = (unique("rmq4-quorum"), unique("rmq4-quorum-dla"));
    declare(&q, "quorum", "").await?;
    declare(&dla, "classic", "").await?;
    let kind = poison(
        &format!("/queues/{q}"),
        &format!("/queues/{dla}"),
        "quorum queue",
    )
    .await?;
    assert!(matches!(kind.0, Some(QueueKind::Quorum { .. })), "{kind:?}");
    assert_eq!(kind.1, RetryPath::Modified, "a quorum queue counts");
    delete(&q).await?;
    delete(&dla).await
}

#[tokio::test]
async fn a_broker_that_counts_nothing_is_caught_even_when_told_otherwise() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let url = rabbitmq4_url();
    let (q, dla) = (unique("rmq4-guard"), unique("rmq4-guard-dla"));
    declare(&q, "classic", "").await?;
    declare(&dla, "classic", "").await?;
    // `retry = "modified"` skips asking the broker; the deliveries coming
    // back uncounted give it away.
    let mount = MountToml::new("m", "fixture_script", &format!("/queues/{q}"))
        .with("max_attempts = 3")
        .with("retry = \"modified\"")
        .with(&format!("dead_letter = \"/queues/{dla}\""));
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    let id = unique("guarded");
    client
        .publish(
            &format!("/queues/{q}"),
            TestMessage::new(&id, "x").script("*:retry"),
        )
        .await?;
    let mut calls = 0;
    loop {
        let handled = host.handled(&id).await?;
        calls += 1;
        if handled.plan.publish() == Some(Publish::DeadLetter) {
            assert_eq!(handled.attempt, 3);
            break;
        }
        anyhow::ensure!(calls < 10, "the broker's missing count was never caught");
    }
    println!(
        "RabbitMQ 4, classic queue with retry = \"modified\": dead-lettered after {calls} handler calls"
    );
    take(&mut client, &format!("/queues/{dla}"), 1).await?;
    host.stop().await?;
    client.close().await;
    delete(&q).await?;
    delete(&dla).await
}

/// The settlement vectors that differ between queue kinds, on `q`: ack,
/// drop (to the queue's dead-letter exchange), retry, retry-after, and a
/// retry at the limit without a dead-letter address.
async fn vectors(kind: &str) -> anyhow::Result<()> {
    let url = rabbitmq4_url();
    let (q, dlx) = (
        unique(&format!("rmq4-{kind}-v")),
        unique(&format!("rmq4-{kind}-dlx")),
    );
    declare(&dlx, "classic", "").await?;
    declare(
        &q,
        kind,
        &format!(r#""x-dead-letter-exchange":"","x-dead-letter-routing-key":"{dlx}""#),
    )
    .await?;
    let address = format!("/queues/{q}");
    let mount = MountToml::new("m", "fixture_script", &address).with("max_attempts = 2");
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    let cases = [
        ("ack", "*:ack"),
        ("drop", "*:drop"),
        ("retry", "1:retry *:ack"),
        ("after", "1:after=300 *:ack"),
        ("limit", "*:retry"),
    ];
    for (case, script) in cases {
        let id = format!("{q}.{case}");
        client
            .publish(&address, TestMessage::new(&id, "x").script(script))
            .await?;
    }
    let outcome = |case: &str| format!("{q}.{case}");
    assert_eq!(
        host.handled(&outcome("ack")).await?.disposition,
        Some(Disposition::Accepted)
    );
    assert_eq!(
        host.handled(&outcome("drop")).await?.disposition,
        Some(Disposition::Rejected)
    );
    let [first, second] =
        <[_; 2]>::try_from(host.handled_n(&outcome("retry"), 2).await?).expect("two");
    assert_eq!((first.attempt, second.attempt), (1, 2));
    assert_eq!(second.disposition, Some(Disposition::Accepted));
    let [first, copy] =
        <[_; 2]>::try_from(host.handled_n(&outcome("after"), 2).await?).expect("two");
    assert_eq!(first.disposition, Some(Disposition::Rejected));
    assert_eq!((copy.attempt, copy.counters.retry_count), (2, Some(1)));
    let [_, last] = <[_; 2]>::try_from(host.handled_n(&outcome("limit"), 2).await?).expect("two");
    assert_eq!(last.attempt, 2);
    assert_eq!(last.disposition, Some(Disposition::Rejected));
    // `rejected` goes to the queue's dead-letter exchange: the drop, the
    // retry-after's original, and the one at its limit.
    let mut dead = take(&mut client, &format!("/queues/{dlx}"), 3).await?;
    dead.sort();
    assert_eq!(dead, [outcome("after"), outcome("drop"), outcome("limit")]);
    host.stop().await?;
    client.close().await;
    delete(&q).await?;
    delete(&dlx).await
}

#[tokio::test]
async fn the_settlement_vectors_hold_on_a_classic_queue() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    vectors("classic").await
}

#[tokio::test]
async fn the_settlement_vectors_hold_on_a_quorum_queue() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    vectors("quorum").await
}

#[tokio::test]
async fn a_retry_on_a_stream_is_a_copy() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let url = rabbitmq4_url();
    let q = unique("rmq4-stream");
    declare(&q, "stream", "").await?;
    let address = format!("/queues/{q}");
    let mut host =
        TestHost::start(&url, &[MountToml::new("m", "fixture_script", &address)]).await?;
    assert_eq!(
        attached(&mut host).await?,
        (Some(QueueKind::Stream), RetryPath::Copy)
    );
    let mut client = Client::connect(&url).await?;
    client
        .publish(&address, TestMessage::new(&q, "x").script("1:retry *:ack"))
        .await?;
    let [first, copy] = <[_; 2]>::try_from(host.handled_n(&q, 2).await?).expect("two");
    assert_eq!(first.disposition, Some(Disposition::Accepted));
    assert_eq!((copy.attempt, copy.counters.retry_count), (2, Some(1)));
    host.stop().await?;
    client.close().await;
    delete(&q).await
}

#[tokio::test]
async fn a_max_attempts_past_a_quorum_queues_delivery_limit_is_warned_of() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let q = unique("rmq4-limit");
    declare(&q, "quorum", r#""x-delivery-limit":5"#).await?;
    let mount =
        MountToml::new("m", "fixture_script", &format!("/queues/{q}")).with("max_attempts = 10");
    let mut wharf = WharfProcess::start_config(&config_text(&rabbitmq4_url(), &[mount])).await?;
    let warning = wharf.wait_for_log("delivery-limit").await?;
    assert!(
        warning.contains("\"delivery_limit\":5") && warning.contains("\"max_attempts\":10"),
        "{warning}"
    );
    wharf.child.kill().await?;
    delete(&q).await
}
