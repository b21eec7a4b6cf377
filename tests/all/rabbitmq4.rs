//! RabbitMQ 4 (AMQP 1.0 in the core): classic queues count nothing, quorum
//! queues count and dead-letter on their own, streams cannot requeue. wharf
//! asks the broker which one an address is and carries retries so that a
//! poison message reaches its limit on every kind.

use wharf_core::brokers::QueueKind;
use wharf_core::settlement::{Disposition, Publish, RetryPath};

use crate::brokers::five_vectors;
use crate::client::{Client, TestMessage};
use crate::poison::{attached, poison_on, take};
use crate::process::WharfProcess;
use crate::{MountToml, TestHost, config_text, rabbitmq4_shared, rabbitmq4_url, unique};
use wharf_tests::rabbitmq4::{bind, declare, delete};

/// [`poison_on`] RabbitMQ 4, reading dead letters back from `dla`.
async fn poison(
    address: &str,
    dla: &str,
    label: &str,
) -> anyhow::Result<(Option<QueueKind>, RetryPath)> {
    let label = format!("RabbitMQ 4, {label}");
    poison_on(&rabbitmq4_url(), address, dla, dla, &label).await
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
    let rejected = five_vectors(
        &mut host,
        &mut client,
        &address,
        &q,
        Disposition::Rejected,
        Disposition::Rejected,
    )
    .await?;
    // `rejected` goes to the queue's dead-letter exchange: the drop, the
    // retry-after's original, and the one at its limit.
    assert_eq!(rejected.len(), 3);
    let mut dead = take(&mut client, &format!("/queues/{dlx}"), 3).await?;
    dead.sort();
    assert_eq!(dead, rejected);
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

#[tokio::test]
async fn dead_letters_may_go_to_an_exchange_address() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let (q, dlq, key) = (unique("rmq4-to-x"), unique("rmq4-to-x-dlq"), unique("key"));
    declare(&q, "quorum", "").await?;
    declare(&dlq, "classic", "").await?;
    bind("amq.direct", &dlq, &key).await?;
    poison_on(
        &rabbitmq4_url(),
        &format!("/queues/{q}"),
        &format!("/exchanges/amq.direct/{key}"),
        &format!("/queues/{dlq}"),
        "RabbitMQ 4, quorum queue dead-lettering to an exchange",
    )
    .await?;
    delete(&q).await?;
    delete(&dlq).await
}

#[tokio::test]
async fn every_mount_of_many_learns_its_queue_kind() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    // More mounts than the 64 sessions RabbitMQ allows on a connection, each
    // ending its management session as the next ones begin: a session begun
    // on a channel just ended must still be answered.
    let queues: Vec<String> = (0..150).map(|n| unique(&format!("rmq4-many{n}"))).collect();
    let mounts: Vec<MountToml> = queues
        .iter()
        .enumerate()
        .map(|(n, q)| MountToml::new(&format!("m{n}"), "fixture_script", q))
        .collect();
    let mut host = TestHost::start(&rabbitmq4_url(), &mounts).await?;
    for _ in &queues {
        let (queue, retry) = attached(&mut host).await?;
        assert_eq!((queue, retry), (Some(QueueKind::Classic), RetryPath::Copy));
    }
    host.stop().await?;
    for q in &queues {
        delete(q).await?;
    }
    Ok(())
}

#[tokio::test]
async fn anonymous_login_works_where_the_broker_allows_it_and_is_refused_elsewhere()
-> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    // RabbitMQ 4 maps ANONYMOUS to its `anonymous_login_user` (guest, from
    // loopback); the test Artemis requires a login.
    let anonymous = rabbitmq4_url().replace("guest:guest@", "");
    let config = wharf_core::config::Config::parse(
        &config_text(&anonymous, &[]),
        &crate::repo_root().join("anonymous.toml"),
    )?;
    assert_eq!(
        config.broker.credentials.mechanism,
        wharf_core::config::SaslMechanism::Anonymous
    );
    let q = unique("rmq4-anonymous");
    let mut host = TestHost::start(&anonymous, &[MountToml::new("m", "ack", &q)]).await?;
    let mut client = Client::connect(&rabbitmq4_url()).await?;
    let id = unique("anonymous");
    client
        .publish(&q, TestMessage::new(&id, "anonymous"))
        .await?;
    host.handled(&id).await?;
    client.close().await;
    host.stop().await?;
    delete(&q).await?;

    // Artemis refuses it at the first session, after the open.
    let artemis = crate::artemis_url().replace("admin:admin@", "");
    let refused = crate::tls::refusal(wharf_core::config::Broker::at(&artemis)).await?;
    println!("ANONYMOUS to Artemis with logins required: {refused}");
    assert!(refused.contains("Unable to validate user"), "{refused}");
    Ok(())
}
