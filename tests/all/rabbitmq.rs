//! The second broker: RabbitMQ 3.10 with its AMQP 1.0 plugin.
//!
//! It does not offer `modified` (and ends the whole session on receiving
//! one), never sets the header's delivery-count, and adds a header to every
//! message. So `retry` takes the copy path here, and the attempt limit runs
//! on the host's retry count.

use std::time::{Duration, Instant};

use wharf::events::Event;
use wharf_core::settlement::{DelayPath, Disposition, Publish};

use crate::client::{Client, TestMessage, retry_count};
use crate::{
    MountToml, TestHost, rabbitmq_url, run_tool, start_with_client, unique, wait_for_count,
};

/// `/queue/NAME` declares the queue NAME on attach.
fn queue(name: &str) -> String {
    format!("/queue/{name}")
}

/// How many messages (ready and unacknowledged) RabbitMQ holds in `name`.
async fn count(name: &str) -> anyhow::Result<u64> {
    let output = run_tool(tokio::process::Command::new("rabbitmqctl").args([
        "list_queues",
        "name",
        "messages",
        "--quiet",
        "--no-table-headers",
    ]))
    .await?;
    let listing = String::from_utf8_lossy(&output.stdout);
    Ok(listing
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .find(|(queue, _)| *queue == name)
        .map_or(Ok(0), |(_, n)| n.trim().parse())?)
}

/// Asserts the queue is empty, then deletes it.
async fn assert_empty_and_delete(name: &str) -> anyhow::Result<()> {
    assert_count(name, 0).await?;
    let status = run_tool(tokio::process::Command::new("rabbitmqctl").args([
        "delete_queue",
        name,
        "--quiet",
    ]))
    .await?
    .status;
    anyhow::ensure!(
        status.success(),
        "rabbitmqctl delete_queue {name}: {status}"
    );
    Ok(())
}

async fn assert_count(name: &str, expected: u64) -> anyhow::Result<()> {
    wait_for_count(name, expected, async || count(name).await).await
}

async fn setup(name: &str, extra: &[&str]) -> anyhow::Result<(TestHost, Client)> {
    let mut mount = MountToml::new("m", "fixture_script", &queue(name));
    for line in extra {
        mount = mount.with(line);
    }
    let url = rabbitmq_url();
    start_with_client(&url, &[mount]).await
}

#[tokio::test]
async fn rabbitmq_does_not_offer_modified_so_retry_takes_the_copy_path() -> anyhow::Result<()> {
    let name = unique("rmq-retry");
    let (mut host, mut client) = setup(&name, &[]).await?;
    assert!(host.seen(|e| matches!(
        e,
        Event::MountReady {
            modified_supported: false,
            ..
        }
    )));
    client
        .publish(
            &queue(&name),
            TestMessage::new(&name, "x")
                .header(0)
                .script("1:retry *:ack"),
        )
        .await?;
    let [first, copy] = <[_; 2]>::try_from(host.handled_n(&name, 2).await?).expect("two");
    assert_eq!(
        first.plan.publish(),
        Some(Publish::Copy {
            retry_count: 1,
            delay: Duration::ZERO,
            path: DelayPath::Held
        })
    );
    assert_eq!(first.disposition, Some(Disposition::Accepted));
    assert_eq!(copy.attempt, 2);
    assert_eq!(copy.counters.retry_count, Some(1));
    // The session survived: the link still takes and settles deliveries.
    let after = format!("{name}.after");
    client
        .publish(&queue(&name), TestMessage::new(&after, "y"))
        .await?;
    assert_eq!(
        host.handled(&after).await?.disposition,
        Some(Disposition::Accepted)
    );
    assert!(!host.seen(|e| matches!(e, Event::MountStopped { .. })));
    host.stop().await?;
    assert_empty_and_delete(&name).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn rabbitmq_ack_and_drop() -> anyhow::Result<()> {
    let name = unique("dlx.rmq-drop");
    let (mut host, mut client) = setup(&name, &[]).await?;
    // The test broker's policy dead-letters what `dlx.*` queues reject.
    let mut broker_dlq = client.watch(&queue("broker.dlq")).await?;
    let acked = format!("{name}.ack");
    let dropped = format!("{name}.drop");
    client
        .publish(&queue(&name), TestMessage::new(&acked, "ok"))
        .await?;
    client
        .publish(
            &queue(&name),
            TestMessage::new(&dropped, "bad").script("*:drop"),
        )
        .await?;
    assert_eq!(
        host.handled(&acked).await?.disposition,
        Some(Disposition::Accepted)
    );
    assert_eq!(
        host.handled(&dropped).await?.disposition,
        Some(Disposition::Rejected)
    );
    broker_dlq.next_with_id(&dropped).await?;
    broker_dlq.close().await;
    host.stop().await?;
    assert_empty_and_delete(&name).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn rabbitmq_retry_after_publishes_a_copy_later() -> anyhow::Result<()> {
    let name = unique("rmq-later");
    let (mut host, mut client) = setup(&name, &[]).await?;
    let published = Instant::now();
    client
        .publish(
            &queue(&name),
            TestMessage::new(&name, "x").script("1:after=1000 *:ack"),
        )
        .await?;
    // Held: the original waits unsettled, then its copy is published and
    // the original rejected; the copy may be handled before that is told.
    let [first, copy] = <[_; 2]>::try_from(host.handled_n(&name, 2).await?).expect("two");
    assert_eq!(first.disposition, Some(Disposition::Rejected));
    assert!(published.elapsed() >= Duration::from_secs(1));
    assert_eq!(copy.counters.retry_count, Some(1));
    assert_eq!(copy.disposition, Some(Disposition::Accepted));
    host.stop().await?;
    assert_empty_and_delete(&name).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn rabbitmq_dead_letters_at_the_limit() -> anyhow::Result<()> {
    let name = unique("rmq-limit");
    let dla = format!("{name}.dla");
    let dla_line = format!("dead_letter = \"{}\"", queue(&dla));
    let (mut host, mut client) = setup(&name, &["max_attempts = 2", &dla_line]).await?;
    let mut dead = client.watch(&queue(&dla)).await?;
    client
        .publish(
            &queue(&name),
            TestMessage::new(&name, "poison").script("*:retry"),
        )
        .await?;
    let [first, last] = <[_; 2]>::try_from(host.handled_n(&name, 2).await?).expect("two");
    assert_eq!(
        first.plan.publish(),
        Some(Publish::Copy {
            retry_count: 1,
            delay: Duration::ZERO,
            path: DelayPath::Held
        })
    );
    assert_eq!(last.attempt, 2);
    assert_eq!(last.plan.publish(), Some(Publish::DeadLetter));
    assert_eq!(last.disposition, Some(Disposition::Accepted));
    let (_, got) = dead.next_with_id(&name).await?;
    assert_eq!(retry_count(&got), Some(1));
    assert_eq!(crate::client::body_text(&got), "poison");
    dead.close().await;
    assert_empty_and_delete(&dla).await?;
    host.stop().await?;
    assert_empty_and_delete(&name).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn rabbitmq_at_most_once() -> anyhow::Result<()> {
    let name = unique("rmq-amo");
    let (mut host, mut client) = setup(&name, &["settle = \"at-most-once\""]).await?;
    client
        .publish(
            &queue(&name),
            TestMessage::new(&name, "x").script("1:after=500 *:ack"),
        )
        .await?;
    let [first, copy] = <[_; 2]>::try_from(host.handled_n(&name, 2).await?).expect("two");
    assert_eq!(first.disposition, None);
    assert!(!first.plan.unsupported());
    assert_eq!(copy.counters.retry_count, Some(1));
    assert!(
        copy.plan.unsupported(),
        "ack on at-most-once changes nothing"
    );
    host.stop().await?;
    assert_empty_and_delete(&name).await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_poison_message_reaches_its_limit_on_rabbitmq() -> anyhow::Result<()> {
    let (q, dla) = (unique("rmq-poison"), unique("rmq-poison-dla"));
    let (address, dead_letter) = (queue(&q), queue(&dla));
    crate::poison::poison_on(
        &rabbitmq_url(),
        &address,
        &dead_letter,
        &dead_letter,
        "RabbitMQ 3.10",
    )
    .await?;
    assert_empty_and_delete(&dla).await?;
    assert_empty_and_delete(&q).await
}
