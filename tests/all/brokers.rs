//! The contract on ActiveMQ Classic 6.3 and Qpid Broker-J 9.2, beside
//! Artemis and RabbitMQ: the settlement vectors, a poison message, both
//! delay paths, crashes with copies pending and while publishing outputs,
//! a cut connection and hostile messages, each checked against what wharf
//! chose from what the broker offered and is, and counted.
//!
//! The test ActiveMQ Classic (`scripts/activemq`) dead-letters a `rejected`
//! message from queue `Q` into `DLQ.Q`; Broker-J (`scripts/qpid`) would put
//! it back, and is never sent one.

use std::time::{Duration, Instant};

use wharf::events::Event;
use wharf_core::settlement::{DelayPath, Disposition, RetryPath};

use crate::client::{Client, TestMessage};
use crate::faults::{killed_with_pending_copies, through_two_cuts};
use crate::hostile::{forged_retry_counts_are_not_believed, nested_messages, replies_are_confined};
use crate::outbox::killed_while_publishing;
use crate::poison::{poison_on, take};
use crate::{MountToml, TestHost, activemq_url, config_text, qpid_url, unique};

/// A broker under test and what wharf must choose on it.
struct Broker {
    /// For the printed counts.
    name: &'static str,
    url: String,
    /// How `retry` asks for another attempt.
    retry: RetryPath,
    /// How the original of a `retry-after` is settled once its copy is in.
    retry_after_original: Disposition,
    /// How a dropped delivery, or one at its limit without a dead-letter
    /// address, is settled.
    gives_up: Disposition,
    /// What `wharf check --connect` says of a mount with outputs there.
    check_says: &'static [&'static str],
    /// Addresses of the broker's own a reply must never reach.
    system: &'static [&'static str],
    /// How deep the nested bodies and application properties a publisher
    /// sends are: past wharf's limit, within what the broker itself takes.
    nested: (&'static [usize], &'static [usize]),
}

/// ActiveMQ Classic counts `modified`, but encodes a redelivered message
/// anew and loses sections of some: retries are copies.
fn activemq() -> Broker {
    Broker {
        name: "ActiveMQ Classic 6.3",
        url: activemq_url(),
        retry: RetryPath::Copy,
        retry_after_original: Disposition::Rejected,
        gives_up: Disposition::Rejected,
        check_says: &[
            "ok (ActiveMQ 6.3.1)",
            "retry copies (the broker re-encodes what it redelivers)",
            "retry-after scheduled on the broker, original rejected",
            "outputs in transactions",
        ],
        system: &["ActiveMQ.DLQ", "topic://ActiveMQ.Advisory.Connection"],
        nested: (&[5_000, 100_000], &[5_000]),
    }
}

/// Broker-J does not offer `modified`, and puts a `rejected` message back
/// until the queue's delivery limit: wharf never sends it `rejected`.
fn qpid() -> Broker {
    Broker {
        name: "Qpid Broker-J 9.2",
        url: qpid_url(),
        retry: RetryPath::Copy,
        retry_after_original: Disposition::Accepted,
        gives_up: Disposition::Accepted,
        check_says: &[
            "ok (Apache Qpid Broker-J Core 9.2.0)",
            "retry copies (no `modified` offered)",
            "retry-after scheduled on the broker, original accepted",
            "the broker puts `rejected` back",
            "outputs in transactions",
        ],
        system: &["$management", "DLQ"],
        // Broker-J decodes every message it takes, recursively: one nested
        // 5,000 deep overflows its stack and shuts the broker down. It
        // refuses an application property that is not a simple value.
        nested: (&[100, 1_000], &[]),
    }
}

/// The retry and delay paths the mount attached with, and whether its
/// outputs commit in transactions.
async fn paths(host: &mut TestHost) -> anyhow::Result<(RetryPath, DelayPath, bool)> {
    host.next(|e| match e {
        Event::MountReady {
            retry,
            delay,
            transactions,
            ..
        } => Some((*retry, *delay, *transactions)),
        _ => None,
    })
    .await
}

/// Stops `host`, then shows `queue` empty: a marker published after is the
/// first message on it.
async fn assert_drained(host: TestHost, client: &mut Client, queue: &str) -> anyhow::Result<()> {
    host.stop().await?;
    let marker = format!("{queue}.marker");
    client
        .publish(queue, TestMessage::new(&marker, "x"))
        .await?;
    assert_eq!(take(client, queue, 1).await?, [marker], "{queue} held more");
    Ok(())
}

/// Publishes the five vectors that differ between brokers to `address`,
/// with ids `<prefix>.<case>`: ack, drop, retry, retry-after, and a retry
/// at the limit of a mount with two attempts and no dead-letter address.
/// Checks each is settled as expected (`gives_up` for the drop and the
/// limit, `original` for the retry-after's original) and returns, sorted,
/// the ids settled `rejected`: what the broker's dead-letter policy gets.
pub(crate) async fn five_vectors(
    host: &mut TestHost,
    client: &mut Client,
    address: &str,
    prefix: &str,
    gives_up: Disposition,
    original: Disposition,
) -> anyhow::Result<Vec<String>> {
    let cases = [
        ("ack", "*:ack"),
        ("drop", "*:drop"),
        ("retry", "1:retry *:ack"),
        ("after", "1:after=300 *:ack"),
        ("limit", "*:retry"),
    ];
    let id = |case: &str| format!("{prefix}.{case}");
    for (case, script) in cases {
        client
            .publish(address, TestMessage::new(&id(case), "x").script(script))
            .await?;
    }
    assert_eq!(
        host.handled(&id("ack")).await?.disposition,
        Some(Disposition::Accepted)
    );
    assert_eq!(host.handled(&id("drop")).await?.disposition, Some(gives_up));
    let [first, second] = <[_; 2]>::try_from(host.handled_n(&id("retry"), 2).await?).expect("two");
    assert_eq!((first.attempt, second.attempt), (1, 2));
    assert_eq!(second.disposition, Some(Disposition::Accepted));
    let [first, copy] = <[_; 2]>::try_from(host.handled_n(&id("after"), 2).await?).expect("two");
    assert_eq!(first.disposition, Some(original));
    assert_eq!((copy.attempt, copy.counters.retry_count), (2, Some(1)));
    let [_, last] = <[_; 2]>::try_from(host.handled_n(&id("limit"), 2).await?).expect("two");
    assert_eq!((last.attempt, last.disposition), (2, Some(gives_up)));
    let mut rejected = Vec::new();
    if gives_up == Disposition::Rejected {
        rejected.extend([id("drop"), id("limit")]);
    }
    if original == Disposition::Rejected {
        rejected.push(id("after"));
    }
    rejected.sort();
    Ok(rejected)
}

/// Ack, drop, retry, retry-after and a retry at the limit without a
/// dead-letter address, on one mount with two attempts.
async fn vectors(broker: &Broker) -> anyhow::Result<()> {
    let q = unique("contract");
    // Granted outputs it never sends: they would commit in transactions.
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("max_attempts = 2")
        .with("[tenant.mount.grants]")
        .with(&format!("send = [\"{q}.out\"]"));
    let mut host = TestHost::start(&broker.url, &[mount]).await?;
    assert_eq!(
        paths(&mut host).await?,
        (broker.retry, DelayPath::Scheduled, true)
    );
    let mut client = Client::connect(&broker.url).await?;
    let expected = five_vectors(
        &mut host,
        &mut client,
        &q,
        &q,
        broker.gives_up,
        broker.retry_after_original,
    )
    .await?;
    let dlq = format!("DLQ.{q}");
    let mut dead = take(&mut client, &dlq, expected.len()).await?;
    dead.sort();
    assert_eq!(dead, expected);
    let marker = format!("{dlq}.marker");
    client.publish(&dlq, TestMessage::new(&marker, "x")).await?;
    assert_eq!(take(&mut client, &dlq, 1).await?, [marker]);
    assert_drained(host, &mut client, &q).await?;
    println!(
        "{}: vectors ack, drop, retry, retry-after, limit hold; retry path {:?}, retry-after original {}, dead-lettered {}",
        broker.name,
        broker.retry,
        broker.retry_after_original.as_str(),
        expected.len()
    );
    client.close().await;
    Ok(())
}

/// A dropped message on a mount with a dead-letter address: `rejected`,
/// into the broker's own dead-letter queue, where the broker has one;
/// where it would put it back, published to the mount's address and
/// accepted.
async fn a_drop(broker: &Broker) -> anyhow::Result<()> {
    let q = unique("drop");
    let dla = format!("{q}.dla");
    let mount = MountToml::new("m", "fixture_script", &q).with(&format!("dead_letter = \"{dla}\""));
    let mut host = TestHost::start(&broker.url, &[mount]).await?;
    let mut client = Client::connect(&broker.url).await?;
    let id = format!("{q}.dropped");
    client
        .publish(&q, TestMessage::new(&id, "x").script("*:drop"))
        .await?;
    let handled = host.handled(&id).await?;
    assert_eq!(handled.disposition, Some(broker.gives_up));
    let (to, other) = match broker.gives_up {
        Disposition::Rejected => (format!("DLQ.{q}"), dla),
        _ => (dla, format!("DLQ.{q}")),
    };
    assert_eq!(take(&mut client, &to, 1).await?, [id]);
    let marker = format!("{other}.marker");
    client
        .publish(&other, TestMessage::new(&marker, "x"))
        .await?;
    assert_eq!(take(&mut client, &other, 1).await?, [marker]);
    assert_drained(host, &mut client, &q).await?;
    client.close().await;
    Ok(())
}

/// A message of two data sections, retried: the copy carries both.
async fn a_retry_keeps_every_section(broker: &Broker) -> anyhow::Result<()> {
    let q = unique("sections");
    let mount = MountToml::new("m", "fixture_script", &q).with("max_attempts = 3");
    let mut host = TestHost::start(&broker.url, &[mount]).await?;
    let mut client = Client::connect(&broker.url).await?;
    let id = format!("{q}.two-sections");
    crate::faults::rhea_publish(&broker.url, &q, "data-sections", &id, "1:retry *:body=abcd")
        .await?;
    let [first, second] = <[_; 2]>::try_from(host.handled_n(&id, 2).await?).expect("two");
    assert_eq!(first.attempt, 1);
    assert_eq!(
        second.disposition,
        Some(Disposition::Accepted),
        "the retried message lost its body: {second:?}"
    );
    assert_drained(host, &mut client, &q).await?;
    client.close().await;
    Ok(())
}

/// A `retry-after(2 s)` waits on each delay path: the copy is handled no
/// sooner.
async fn delays(broker: &Broker) -> anyhow::Result<()> {
    const DELAY: Duration = Duration::from_secs(2);
    for path in [DelayPath::Scheduled, DelayPath::Held] {
        let q = unique("delay");
        let mount = MountToml::new("m", "fixture_script", &q)
            .with(&format!("delay = \"{}\"", path.as_str()));
        let mut host = TestHost::start(&broker.url, &[mount]).await?;
        assert_eq!(paths(&mut host).await?.1, path);
        let mut client = Client::connect(&broker.url).await?;
        let id = format!("{q}.later");
        let published = Instant::now();
        client
            .publish(
                &q,
                TestMessage::new(&id, "x").script(&format!("1:after={} *:ack", DELAY.as_millis())),
            )
            .await?;
        let [_, copy] = <[_; 2]>::try_from(host.handled_n(&id, 2).await?).expect("two");
        let waited = published.elapsed();
        assert!(waited >= DELAY, "{path:?}: the copy came after {waited:?}");
        assert_eq!(copy.disposition, Some(Disposition::Accepted));
        println!(
            "{}: retry-after 2 s on the {} path, the copy handled after {:.2} s",
            broker.name,
            path.as_str(),
            waited.as_secs_f64()
        );
        assert_drained(host, &mut client, &q).await?;
        client.close().await;
    }
    Ok(())
}

/// Two thousand deliveries through a proxy cut twice mid-stream.
async fn cut(broker: &Broker) -> anyhow::Result<()> {
    let q = unique("cut");
    let (host, _proxy, mut client, tally) = through_two_cuts(&broker.url, &q).await?;
    tally.report(&format!("connection cut twice, {}", broker.name));
    assert_drained(host, &mut client, &q).await?;
    client.close().await;
    Ok(())
}

/// Three hosts killed mid-stream while each input publishes an output;
/// a last one finishes. Every input has its output.
async fn killed_publishing(broker: &Broker, extra: &[&str], path: &str) -> anyhow::Result<()> {
    let (input, output) = (unique("kill-out"), unique("kill-out-out"));
    let n = 300;
    let published = killed_while_publishing(&broker.url, &input, &output, n, extra).await?;
    let duplicates: usize = published.outputs.values().map(|n| n - 1).sum();
    println!(
        "SIGKILL x3, {} ({path}): inputs {n}, outputs {} distinct, duplicated {duplicates}, lost 0",
        broker.name,
        published.outputs.len()
    );
    let mut client = Client::connect(&broker.url).await?;
    let marker = format!("{input}.marker");
    client
        .publish(&input, TestMessage::new(&marker, "x"))
        .await?;
    assert_eq!(take(&mut client, &input, 1).await?, [marker], "inputs left");
    client.close().await;
    if extra.contains(&"outputs = \"transaction\"") {
        assert_eq!(duplicates, 0, "{path}");
    }
    Ok(())
}

/// `wharf check --connect` says what the mount will do on the broker and
/// why, as its attach then does.
async fn check_says(broker: &Broker, says: &[&str]) -> anyhow::Result<()> {
    let q = unique("check");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("[tenant.mount.grants]")
        .with(&format!("send = [\"{q}.out\"]"));
    let config = std::env::temp_dir().join(format!("{q}.toml"));
    std::fs::write(&config, config_text(&broker.url, &[mount]))?;
    let checked = tokio::process::Command::new(crate::process::wharf_binary())
        .args(["check", "--connect", "--config"])
        .arg(&config)
        .output()
        .await?;
    let _ = std::fs::remove_file(&config);
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{stdout}");
    for said in says {
        assert!(stdout.contains(said), "`{said}` not in:\n{stdout}");
    }
    Ok(())
}

/// Generates each test of the contract for one broker, in a module of
/// its own.
macro_rules! contract_on {
    ($module:ident, $broker:expr) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn the_settlement_vectors_hold() -> anyhow::Result<()> {
                vectors(&$broker).await
            }

            #[tokio::test]
            async fn wharf_check_says_how_each_outcome_is_carried_out() -> anyhow::Result<()> {
                let broker = $broker;
                let says = broker.check_says;
                check_says(&broker, says).await
            }

            #[tokio::test]
            async fn a_drop_goes_to_the_brokers_dead_letter_queue_or_the_mounts()
            -> anyhow::Result<()> {
                a_drop(&$broker).await
            }

            #[tokio::test]
            async fn a_retried_message_keeps_every_section() -> anyhow::Result<()> {
                a_retry_keeps_every_section(&$broker).await
            }

            #[tokio::test]
            async fn a_poison_message_reaches_its_limit() -> anyhow::Result<()> {
                let broker = $broker;
                let q = unique("poison-q");
                let dla = format!("{q}.dla");
                let (_, retry) = poison_on(&broker.url, &q, &dla, &dla, broker.name).await?;
                assert_eq!(retry, broker.retry);
                Ok(())
            }

            #[tokio::test]
            async fn a_retry_after_waits_on_either_delay_path() -> anyhow::Result<()> {
                delays(&$broker).await
            }

            #[tokio::test]
            async fn a_crash_with_copies_scheduled_loses_nothing() -> anyhow::Result<()> {
                let broker = $broker;
                let label = format!("SIGKILL, copies scheduled on {}", broker.name);
                killed_with_pending_copies(&broker.url, &unique("kill-scheduled"), &[], &label)
                    .await
            }

            #[tokio::test]
            async fn a_crash_with_copies_held_loses_nothing() -> anyhow::Result<()> {
                let broker = $broker;
                let label = format!("SIGKILL, copies held for {}", broker.name);
                let held = ["delay = \"held\""];
                killed_with_pending_copies(&broker.url, &unique("kill-held"), &held, &label).await
            }

            #[tokio::test]
            async fn a_crash_while_publishing_in_transactions_commits_each_output_once()
            -> anyhow::Result<()> {
                let transaction = ["outputs = \"transaction\""];
                killed_publishing(&$broker, &transaction, "transaction path").await
            }

            #[tokio::test]
            async fn a_crash_while_publishing_confirmed_outputs_loses_none() -> anyhow::Result<()> {
                let confirm = ["outputs = \"confirm\""];
                killed_publishing(&$broker, &confirm, "confirm path").await
            }

            #[tokio::test]
            async fn a_cut_connection_loses_nothing() -> anyhow::Result<()> {
                cut(&$broker).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn nested_messages_are_dead_lettered_and_the_host_lives() -> anyhow::Result<()> {
                let broker = $broker;
                let (bodies, properties) = broker.nested;
                nested_messages(&broker.url, bodies, properties).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn a_forged_retry_count_is_not_believed() -> anyhow::Result<()> {
                forged_retry_counts_are_not_believed(&$broker.url).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn replies_cannot_reach_another_tenant_or_the_broker() -> anyhow::Result<()> {
                let broker = $broker;
                replies_are_confined(&broker.url, broker.system).await
            }
        }
    };
}

contract_on!(activemq, activemq());
contract_on!(qpid, qpid());
