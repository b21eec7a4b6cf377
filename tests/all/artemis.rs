//! Every vector of the settlement contract on Apache Artemis, observed on
//! the broker: what is left on the queue, what reached the dead-letter
//! address, what copies were published, and what the broker redelivered.
//!
//! Artemis notes the assertions rely on (measured on 2.40): a message
//! without a header arrives without one; a publisher-set `delivery-count`
//! is delivered as is the first time, but after `modified` the broker sends
//! its own count (1, 2, ...); `rejected` moves the message to the broker's
//! dead-letter address (`DLQ`, queue `DLQ.<address>` in the test broker).

use std::time::{Duration, Instant};

use wharf::events::Event;
use wharf_core::settlement::{DelayPath, Disposition, Outcome, Publish};

use crate::client::{Client, TestMessage, body_text, message_id, retry_count};
use crate::{
    MountToml, TestHost, artemis_url, assert_failed, start_with_client, unique, wait_for_count,
};

const SCRIPT: &str = "fixture_script";

/// The queue where the test broker's own dead-letter policy puts messages
/// rejected on `address`.
fn broker_dlq(address: &str) -> String {
    format!("DLQ.{address}")
}

fn broker_dlq_fqqn(address: &str) -> String {
    format!("DLQ::DLQ.{address}")
}

/// Polls the broker until `queue` holds `expected` messages.
async fn assert_count(client: &mut Client, queue: &str, expected: u64) -> anyhow::Result<()> {
    wait_for_count(queue, expected, async || client.artemis_count(queue).await).await
}

/// Starts a host with one mount `m` on `address`, connects a client.
pub(crate) async fn setup(address: &str, extra: &[&str]) -> anyhow::Result<(TestHost, Client)> {
    let mut mount = MountToml::new("m", SCRIPT, address);
    for line in extra {
        mount = mount.with(line);
    }
    let url = artemis_url();
    start_with_client(&url, &[mount]).await
}

/// Asserts that `address`'s queue and the broker's dead-letter queue for it
/// are both empty once the host has stopped.
pub(crate) async fn assert_gone(client: &mut Client, address: &str) -> anyhow::Result<()> {
    assert_count(client, address, 0).await?;
    assert_count(client, &broker_dlq(address), 0).await
}

/// Asserts `got` is `sent` as published: the dead-letter address receives
/// the delivery exactly as it arrived.
fn assert_same_message(got: &wharf_core::message::AmqpMessage, sent: &TestMessage) {
    let sent = sent.build();
    assert_eq!(got.header, sent.header, "header");
    assert_eq!(got.properties, sent.properties, "properties");
    assert_eq!(
        got.application_properties, sent.application_properties,
        "application properties"
    );
    assert_eq!(got.body, sent.body, "body");
}

#[tokio::test]
async fn vector_01_ack_is_accepted() -> anyhow::Result<()> {
    let q = unique("v01");
    let (mut host, mut client) = setup(&q, &[]).await?;
    client
        .publish(&q, TestMessage::new(&q, "hi").header(0).script("*:ack"))
        .await?;
    let handled = host.handled(&q).await?;
    assert_eq!(handled.outcome, Outcome::Ack);
    assert_eq!(handled.disposition, Some(Disposition::Accepted));
    host.stop().await?;
    assert_gone(&mut client, &q).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_02_drop_is_rejected_and_the_broker_dead_letters_it() -> anyhow::Result<()> {
    let q = unique("v02");
    let (mut host, mut client) = setup(&q, &[]).await?;
    client
        .publish(&q, TestMessage::new(&q, "bad").header(0).script("*:drop"))
        .await?;
    let handled = host.handled(&q).await?;
    assert_eq!(handled.disposition, Some(Disposition::Rejected));
    host.stop().await?;
    assert_count(&mut client, &q, 0).await?;
    let mut dlq = client.watch(&broker_dlq_fqqn(&q)).await?;
    let (_, dead) = dlq.next_with_id(&q).await?;
    assert_eq!(body_text(&dead), "bad");
    dlq.close().await;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_03_retry_is_modified_and_the_broker_counts_it() -> anyhow::Result<()> {
    let q = unique("v03");
    let (mut host, mut client) = setup(&q, &[]).await?;
    assert!(host.seen(|e| matches!(
        e,
        Event::MountReady {
            modified_supported: true,
            ..
        }
    )));
    client
        .publish(
            &q,
            TestMessage::new(&q, "x").header(7).script("8:retry *:ack"),
        )
        .await?;
    let first = host.handled(&q).await?;
    assert_eq!(first.attempt, 8);
    assert_eq!(first.disposition, Some(Disposition::Modified));
    // Back on the queue with the broker's count raised (Artemis counts its
    // own deliveries from 0, so the redelivery carries 1).
    let again = host.handled(&q).await?;
    assert_eq!(again.counters.delivery_count, Some(1));
    assert_eq!(again.disposition, Some(Disposition::Accepted));
    host.stop().await?;
    assert_gone(&mut client, &q).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_04_retry_below_the_limit_is_modified() -> anyhow::Result<()> {
    let q = unique("v04");
    let (mut host, mut client) = setup(&q, &["max_attempts = 3"]).await?;
    client
        .publish(
            &q,
            TestMessage::new(&q, "x").header(1).script("2:retry *:ack"),
        )
        .await?;
    let first = host.handled(&q).await?;
    assert_eq!(first.attempt, 2);
    assert_eq!(first.disposition, Some(Disposition::Modified));
    let again = host.handled(&q).await?;
    assert!(again.counters.delivery_count >= Some(1), "{again:?}");
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_05_retry_at_the_limit_without_dla_is_rejected() -> anyhow::Result<()> {
    let q = unique("v05");
    let (mut host, mut client) = setup(&q, &["max_attempts = 3"]).await?;
    client
        .publish(&q, TestMessage::new(&q, "x").header(2).script("3:retry"))
        .await?;
    let handled = host.handled(&q).await?;
    assert_eq!(handled.attempt, 3);
    assert_eq!(handled.disposition, Some(Disposition::Rejected));
    host.stop().await?;
    assert_count(&mut client, &q, 0).await?;
    let mut dlq = client.watch(&broker_dlq_fqqn(&q)).await?;
    dlq.next_with_id(&q).await?;
    dlq.close().await;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_06_retry_at_the_limit_goes_to_the_dla_as_it_arrived() -> anyhow::Result<()> {
    let q = unique("v06");
    let dla = format!("{q}.dla");
    let dla_line = format!("dead_letter = \"{dla}\"");
    let (mut host, mut client) = setup(&q, &["max_attempts = 3", &dla_line]).await?;
    let sent = TestMessage::new(&q, "poison").header(2).script("3:retry");
    client.publish(&q, &sent).await?;
    let handled = host.handled(&q).await?;
    assert_eq!(handled.plan.publish(), Some(Publish::DeadLetter));
    assert_eq!(handled.disposition, Some(Disposition::Accepted));
    host.stop().await?;
    let mut dead = client.watch(&dla).await?;
    let (_, got) = dead.next_with_id(&q).await?;
    assert_same_message(&got, &sent);
    dead.close().await;
    assert_gone(&mut client, &q).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_07_a_dla_without_limit_takes_every_retry() -> anyhow::Result<()> {
    let q = unique("v07");
    let dla = format!("{q}.dla");
    let dla_line = format!("dead_letter = \"{dla}\"");
    let (mut host, mut client) = setup(&q, &[&dla_line]).await?;
    let sent = TestMessage::new(&q, "x").header(0).script("*:retry");
    client.publish(&q, &sent).await?;
    let handled = host.handled(&q).await?;
    assert_eq!(handled.attempt, 1);
    assert_eq!(handled.disposition, Some(Disposition::Accepted));
    host.stop().await?;
    let mut dead = client.watch(&dla).await?;
    let (_, got) = dead.next_with_id(&q).await?;
    assert_same_message(&got, &sent);
    dead.close().await;
    assert_gone(&mut client, &q).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_08_retry_after_rejects_then_publishes_a_copy_later() -> anyhow::Result<()> {
    let f = unique("fanout.v08");
    let (mut host, mut client) = setup(&f, &[]).await?;
    let mut watch = client.watch(&f).await?;
    let published = Instant::now();
    client
        .publish(
            &f,
            TestMessage::new(&f, "later")
                .header(0)
                .script("1:after=2000 *:ack"),
        )
        .await?;
    let [first, handled_copy] = <[_; 2]>::try_from(host.handled_n(&f, 2).await?).expect("two");
    assert_eq!(first.disposition, Some(Disposition::Rejected));
    let (_, original) = watch.next_with_id(&f).await?;
    assert!(original.header.is_some());
    let (arrived, copy) = watch.next_with_id(&f).await?;
    assert!(
        arrived - published >= Duration::from_secs(2),
        "copy after {:?}",
        arrived - published
    );
    // The copy keeps the original's header (durable survives a broker
    // restart) with the count at zero: its retry count carries the attempt.
    let header = copy.header.as_ref().expect("the original's header");
    assert!(header.durable);
    assert_eq!(header.delivery_count, 0);
    assert_eq!(retry_count(&copy), Some(1));
    assert_eq!(body_text(&copy), "later");
    assert_eq!(handled_copy.attempt, 2);
    assert_eq!(handled_copy.disposition, Some(Disposition::Accepted));
    watch.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_09_retry_of_a_copy_below_the_limit_copies_now_then_accepts() -> anyhow::Result<()> {
    let f = unique("fanout.v09");
    let (mut host, mut client) = setup(&f, &["max_attempts = 3"]).await?;
    let mut watch = client.watch(&f).await?;
    client
        .publish(
            &f,
            TestMessage::new(&f, "x")
                .retry_count(1)
                .script("2:retry *:ack"),
        )
        .await?;
    let [first, handled_copy] = <[_; 2]>::try_from(host.handled_n(&f, 2).await?).expect("two");
    assert_eq!(first.attempt, 2);
    assert_eq!(
        first.plan.publish(),
        Some(Publish::Copy {
            retry_count: 2,
            delay: Duration::ZERO,
            path: DelayPath::Scheduled
        })
    );
    assert_eq!(first.disposition, Some(Disposition::Accepted));
    assert_eq!(handled_copy.attempt, 3);
    let (_, original) = watch.next_with_id(&f).await?;
    assert_eq!(retry_count(&original), Some(1));
    let (_, copy) = watch.next_with_id(&f).await?;
    assert!(copy.header.is_none());
    assert_eq!(retry_count(&copy), Some(2));
    watch.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_10_retry_after_at_the_limit_goes_to_the_dla() -> anyhow::Result<()> {
    let q = unique("v10");
    let dla = format!("{q}.dla");
    let dla_line = format!("dead_letter = \"{dla}\"");
    let (mut host, mut client) = setup(&q, &["max_attempts = 3", &dla_line]).await?;
    let sent = TestMessage::new(&q, "x")
        .retry_count(2)
        .script("3:after=1000");
    client.publish(&q, &sent).await?;
    let handled = host.handled(&q).await?;
    assert_eq!(handled.attempt, 3);
    assert_eq!(handled.plan.publish(), Some(Publish::DeadLetter));
    assert_eq!(handled.disposition, Some(Disposition::Accepted));
    host.stop().await?;
    let mut dead = client.watch(&dla).await?;
    let (_, got) = dead.next_with_id(&q).await?;
    assert_same_message(&got, &sent);
    dead.close().await;
    assert_gone(&mut client, &q).await?;
    client.close().await;
    Ok(())
}

/// Publishes a sentinel and asserts it is the next message on the watched
/// address: nothing else was published in between.
async fn assert_nothing_else_published(
    client: &mut Client,
    watch: &mut crate::client::Watcher,
    address: &str,
) -> anyhow::Result<()> {
    let sentinel = format!("{address}.sentinel");
    client
        .publish(address, TestMessage::new(&sentinel, "sentinel"))
        .await?;
    let (_, next) = watch.next().await?;
    assert_eq!(
        message_id(&next).as_deref(),
        Some(sentinel.as_str()),
        "unexpected message {next:?}"
    );
    Ok(())
}

#[tokio::test]
async fn vector_12_at_most_once_ack_and_drop_are_unsupported_and_silent() -> anyhow::Result<()> {
    let f = unique("fanout.v12");
    let (mut host, mut client) = setup(&f, &["settle = \"at-most-once\""]).await?;
    let mut watch = client.watch(&f).await?;
    for (id, script) in [
        (format!("{f}.ack"), "*:ack"),
        (format!("{f}.drop"), "*:drop"),
    ] {
        client
            .publish(&f, TestMessage::new(&id, "x").script(script))
            .await?;
        let handled = host.handled(&id).await?;
        assert!(handled.plan.unsupported());
        assert_eq!(handled.disposition, None);
        assert_eq!(handled.plan.publish(), None);
        watch.next_with_id(&id).await?;
    }
    assert_nothing_else_published(&mut client, &mut watch, &f).await?;
    watch.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_13_at_most_once_retry_with_a_broker_counter_makes_no_copy() -> anyhow::Result<()> {
    let f = unique("fanout.v13");
    let (mut host, mut client) =
        setup(&f, &["settle = \"at-most-once\"", "max_attempts = 3"]).await?;
    let mut watch = client.watch(&f).await?;
    client
        .publish(&f, TestMessage::new(&f, "x").header(0).script("*:retry"))
        .await?;
    let handled = host.handled(&f).await?;
    assert!(handled.plan.unsupported());
    assert_eq!(handled.plan.publish(), None);
    watch.next_with_id(&f).await?;
    assert_nothing_else_published(&mut client, &mut watch, &f).await?;
    watch.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_14_at_most_once_retry_without_a_counter_copies_at_once() -> anyhow::Result<()> {
    let f = unique("fanout.v14");
    let (mut host, mut client) =
        setup(&f, &["settle = \"at-most-once\"", "max_attempts = 3"]).await?;
    let mut watch = client.watch(&f).await?;
    client
        .publish(&f, TestMessage::new(&f, "x").script("1:retry *:ack"))
        .await?;
    let [first, handled_copy] = <[_; 2]>::try_from(host.handled_n(&f, 2).await?).expect("two");
    assert!(first.plan.unsupported());
    assert_eq!(
        first.plan.publish(),
        Some(Publish::Copy {
            retry_count: 1,
            delay: Duration::ZERO,
            path: DelayPath::Scheduled
        })
    );
    assert_eq!(handled_copy.attempt, 2);
    watch.next_with_id(&f).await?;
    let (_, copy) = watch.next_with_id(&f).await?;
    assert!(copy.header.is_none());
    assert_eq!(retry_count(&copy), Some(1));
    watch.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_15_at_most_once_retry_after_copies_later() -> anyhow::Result<()> {
    let f = unique("fanout.v15");
    let (mut host, mut client) = setup(&f, &["settle = \"at-most-once\""]).await?;
    let mut watch = client.watch(&f).await?;
    let published = Instant::now();
    client
        .publish(&f, TestMessage::new(&f, "x").script("1:after=1000 *:ack"))
        .await?;
    let [first, _copy] = <[_; 2]>::try_from(host.handled_n(&f, 2).await?).expect("two");
    assert!(!first.plan.unsupported());
    watch.next_with_id(&f).await?;
    let (arrived, copy) = watch.next_with_id(&f).await?;
    assert!(
        arrived - published >= Duration::from_secs(1),
        "copy after {:?}",
        arrived - published
    );
    assert!(copy.header.is_none());
    assert_eq!(retry_count(&copy), Some(1));
    watch.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_16_at_most_once_retry_at_the_limit_goes_to_the_dla() -> anyhow::Result<()> {
    let q = unique("v16");
    let dla = format!("{q}.dla");
    let dla_line = format!("dead_letter = \"{dla}\"");
    let (mut host, mut client) = setup(
        &q,
        &["settle = \"at-most-once\"", "max_attempts = 2", &dla_line],
    )
    .await?;
    let sent = TestMessage::new(&q, "x").retry_count(1).script("2:retry");
    client.publish(&q, &sent).await?;
    let handled = host.handled(&q).await?;
    assert_eq!(handled.attempt, 2);
    assert_eq!(handled.plan.publish(), Some(Publish::DeadLetter));
    host.stop().await?;
    let mut dead = client.watch(&dla).await?;
    let (_, got) = dead.next_with_id(&q).await?;
    assert_same_message(&got, &sent);
    dead.close().await;
    assert_gone(&mut client, &q).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn vector_17_a_trapping_handler_is_retried_with_modified() -> anyhow::Result<()> {
    let q = unique("v17");
    let (mut host, mut client) = setup(&q, &["max_attempts = 3"]).await?;
    client
        .publish(
            &q,
            TestMessage::new(&q, "x").header(0).script("1:trap *:ack"),
        )
        .await?;
    let first = host.handled(&q).await?;
    assert_failed(&first, "trapped");
    assert_eq!(first.outcome, Outcome::Retry);
    assert_eq!(first.disposition, Some(Disposition::Modified));
    let again = host.handled(&q).await?;
    assert_eq!(again.attempt, 2);
    assert_eq!(again.counters.delivery_count, Some(1));
    assert_eq!(again.disposition, Some(Disposition::Accepted));
    host.stop().await?;
    assert_gone(&mut client, &q).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn node_queue_asks_the_broker_for_a_queue() -> anyhow::Result<()> {
    // `fanout.*` addresses are topics by the test broker's defaults; a mount
    // that says `node = "queue"` gets a queue there instead.
    let plain = unique("fanout.node-default");
    let queue = unique("fanout.node-queue");
    let url = artemis_url();
    let mounts = [
        MountToml::new("plain", SCRIPT, &plain),
        MountToml::new("queue", SCRIPT, &queue).with("node = \"queue\""),
    ];
    let (host, mut client) = start_with_client(&url, &mounts).await?;
    let plain_types = client.artemis_routing_types(&plain).await?;
    assert!(
        plain_types.contains("MULTICAST") && !plain_types.contains("ANYCAST"),
        "{plain_types}"
    );
    let queue_types = client.artemis_routing_types(&queue).await?;
    assert!(
        queue_types.contains("ANYCAST") && !queue_types.contains("MULTICAST"),
        "{queue_types}"
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn retry_after_may_accept_the_original_so_nothing_reaches_the_dlq() -> anyhow::Result<()> {
    let q = unique("after-accepted");
    let (mut host, mut client) = setup(&q, &["retry_after_original = \"accepted\""]).await?;
    client
        .publish(
            &q,
            TestMessage::new(&q, "x")
                .header(0)
                .script("1:after=500 *:ack"),
        )
        .await?;
    let [first, copy] = <[_; 2]>::try_from(host.handled_n(&q, 2).await?).expect("two");
    assert_eq!(first.disposition, Some(Disposition::Accepted));
    assert_eq!(copy.attempt, 2);
    assert_eq!(copy.disposition, Some(Disposition::Accepted));
    // With the contract's `rejected`, Artemis' dead-letter policy would
    // hold the original too.
    assert_eq!(client.artemis_count(&format!("DLQ.{q}")).await?, 0);
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_poison_message_reaches_its_limit_on_artemis() -> anyhow::Result<()> {
    let (q, dla) = (unique("poison"), unique("poison-dla"));
    crate::poison::poison_on(&artemis_url(), &q, &dla, &dla, "Artemis").await?;
    Ok(())
}
