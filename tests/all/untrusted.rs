//! Input nobody vouches for, on every broker: text and sizes a publisher
//! chooses never reach a frame, a log line or an isolation check
//! unbounded. Two tenants share one connection; whatever the first is
//! sent, the connection stays up, the message ends within its attempts,
//! and the neighbour's deliveries go on. Then a generator of hostile
//! messages (`wharf_tests::hostile_messages`) publishes batches and the same
//! invariants are checked after each.
//!
//! `WHARF_HOSTILE_SEED` and `WHARF_HOSTILE_COUNT` run the generator with
//! another seed or longer (`scripts/fuzz hostile` does, with random seeds).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context as _;
use fe2o3_amqp::types::messaging::Outcome;
use tokio::sync::RwLockReadGuard;
use wharf::events::{Event, Handled};
use wharf_core::brokers::BrokerKind;
use wharf_core::config::Config;
use wharf_core::settlement::{Disposition, Publish};

use crate::client::{Client, TestMessage};
use crate::hostile_messages::{self as hostile, Rng, Through, spellings};
use crate::{
    DEADLINE, MountToml, TenantToml, TestHost, activemq_url, artemis_url, qpid_url, rabbitmq_url,
    rabbitmq4_shared, rabbitmq4_url, repo_root, tenants_text, unique,
};

/// A broker the hostile messages go through.
pub(crate) struct Broker {
    name: &'static str,
    url: String,
    kind: BrokerKind,
    /// The address of the queue `name`, as mounts spell it there.
    queue: fn(&str) -> String,
    /// How deep the broker itself decodes a message without failing.
    max_depth: usize,
    /// It takes only simple application-property values.
    simple_properties: bool,
}

impl Broker {
    /// RabbitMQ 4 is shared with tests that stop it: held while in use.
    async fn hold(&self) -> Option<RwLockReadGuard<'static, ()>> {
        match self.name {
            "RabbitMQ 4" => Some(rabbitmq4_shared().await),
            _ => None,
        }
    }
}

fn plain(name: &str) -> String {
    name.to_owned()
}

pub(crate) fn artemis() -> Broker {
    Broker {
        name: "Artemis",
        url: artemis_url(),
        kind: BrokerKind::Artemis,
        queue: plain,
        max_depth: 1_000,
        simple_properties: false,
    }
}

pub(crate) fn rabbitmq4() -> Broker {
    Broker {
        name: "RabbitMQ 4",
        url: rabbitmq4_url(),
        kind: BrokerKind::RabbitMq,
        queue: plain,
        max_depth: 1_000,
        simple_properties: false,
    }
}

pub(crate) fn rabbitmq3() -> Broker {
    Broker {
        name: "RabbitMQ 3.10",
        url: rabbitmq_url(),
        kind: BrokerKind::RabbitMq,
        queue: |name| format!("/queue/{name}"),
        max_depth: 1_000,
        simple_properties: false,
    }
}

pub(crate) fn activemq() -> Broker {
    Broker {
        name: "ActiveMQ Classic",
        url: activemq_url(),
        kind: BrokerKind::ActiveMqClassic,
        queue: plain,
        max_depth: 1_000,
        simple_properties: false,
    }
}

pub(crate) fn qpid() -> Broker {
    Broker {
        name: "Qpid Broker-J",
        url: qpid_url(),
        kind: BrokerKind::QpidBrokerJ,
        queue: plain,
        // Broker-J decodes what it takes, recursively (see `brokers.rs`).
        max_depth: 100,
        simple_properties: true,
    }
}

/// Two tenants on one connection: `a` takes what is under test on its
/// queue (three attempts, a dead-letter address, replies granted), `b`
/// is the neighbour.
struct Pair {
    host: TestHost,
    client: Client,
    a: String,
    a_dead: String,
    /// The neighbour's queue names (its queue and its dead-letter queue).
    b_names: [String; 2],
    b: String,
}

async fn pair(broker: &Broker) -> anyhow::Result<Pair> {
    let (a_name, b_name) = (unique("a.in"), unique("b.work"));
    let b_dead_name = format!("{b_name}.dlq");
    let a = (broker.queue)(&a_name);
    let a_dead = (broker.queue)(&format!("{a_name}.dlq"));
    let b = (broker.queue)(&b_name);
    let tenants = [
        TenantToml::new(
            "a",
            vec![
                MountToml::new("in", "fixture_script", &a)
                    .with("max_attempts = 3")
                    .with(&format!("dead_letter = \"{a_dead}\""))
                    .with("[tenant.mount.grants]\nreply = true"),
            ],
        ),
        TenantToml::new(
            "b",
            vec![MountToml::new("work", "fixture_script", &b).with(&format!(
                "dead_letter = \"{}\"",
                (broker.queue)(&b_dead_name)
            ))],
        ),
    ];
    let text = tenants_text(&broker.url, "", &tenants);
    let host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    let client = Client::connect(&broker.url).await?;
    Ok(Pair {
        host,
        client,
        a,
        a_dead,
        b_names: [b_name, b_dead_name],
        b,
    })
}

/// How long a broker may take to answer a hostile publish before it counts
/// as refused (RabbitMQ 3.10 never answers some it cannot read).
const PUBLISH_ANSWER: Duration = Duration::from_secs(5);

/// Publishes `payload` as it is; whether the broker took it.
async fn publish(client: &mut Client, address: &str, payload: Vec<u8>) -> bool {
    matches!(
        client
            .publish_raw_within(address, payload, PUBLISH_ANSWER)
            .await,
        Ok(Outcome::Accepted(_))
    )
}

/// Whether `handled` is a delivery's last: settled for good, with no copy
/// still to come.
fn ends(handled: &Handled) -> bool {
    let plan = handled.instead.unwrap_or(handled.plan);
    !matches!(plan.publish(), Some(Publish::Copy { .. }))
        && matches!(
            handled.disposition,
            Some(Disposition::Accepted | Disposition::Rejected)
        )
}

/// What the host did while a pair ran, as the invariants read it.
#[derive(Default)]
struct Seen {
    /// Message ids of tenant `a` whose last delivery ended, or that were
    /// refused unread.
    ended: BTreeSet<String>,
    /// Message ids tenant `b` handled.
    neighbour: BTreeSet<String>,
    /// Mounts that went down, and why.
    down: Vec<String>,
    /// Fates of `a`'s deliveries, by how they ended.
    fates: BTreeMap<&'static str, usize>,
}

impl Seen {
    fn take(&mut self, event: &Event) {
        match event {
            Event::Handled(h) if &*h.tenant == "b" => {
                if let Some(id) = &h.message_id {
                    self.neighbour.insert(id.clone());
                }
            }
            Event::Handled(h) if ends(h) => {
                let fate = match (h.plan.publish(), h.disposition) {
                    (Some(Publish::DeadLetter), _) => "dead-lettered",
                    (_, Some(Disposition::Rejected)) => "rejected",
                    _ => "accepted",
                };
                *self.fates.entry(fate).or_default() += 1;
                if let Some(id) = &h.message_id {
                    self.ended.insert(id.clone());
                }
            }
            Event::Refused { message_id, .. } => {
                *self.fates.entry("refused unread").or_default() += 1;
                if let Some(id) = message_id {
                    self.ended.insert(id.clone());
                }
            }
            Event::MountDown {
                tenant,
                mount,
                error,
            } => self.down.push(format!("{tenant}/{mount}: {error}")),
            _ => {}
        }
    }

    /// Reads events until every one of `a_ids` ended and the neighbour
    /// handled every one of `b_ids`, or the deadline passes.
    async fn until(
        &mut self,
        host: &mut TestHost,
        a_ids: &BTreeSet<String>,
        b_ids: &BTreeSet<String>,
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        while !(a_ids.is_subset(&self.ended) && b_ids.is_subset(&self.neighbour)) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let Ok(Ok(event)) = tokio::time::timeout(left, host.next_event()).await else {
                let unended: Vec<_> = a_ids.difference(&self.ended).take(5).collect();
                let unhandled = b_ids.difference(&self.neighbour).count();
                anyhow::bail!(
                    "within {within:?}: not ended {unended:?} (of {}), neighbour's unhandled {unhandled}; mounts down {:?}",
                    a_ids.difference(&self.ended).count(),
                    self.down
                );
            };
            self.take(&event);
        }
        Ok(())
    }
}

/// Publishes `count` ordinary messages to the neighbour; their ids.
async fn neighbour_messages(pair: &mut Pair, count: usize) -> anyhow::Result<BTreeSet<String>> {
    let ids: Vec<String> = (0..count).map(|_| unique("b.msg")).collect();
    let messages = ids.iter().map(|id| TestMessage::new(id, "x").build());
    pair.client.publish_many(&pair.b, messages).await?;
    Ok(ids.into_iter().collect())
}

/// Sends `payload` (message `id`) to tenant `a` beside ordinary messages to
/// `b`, and checks that it ended, the neighbour's all were handled, and no
/// mount went down. Returns whether the broker took the message, and what
/// the host did.
async fn one_beside_the_neighbour(
    broker: &Broker,
    id: &str,
    payload: Vec<u8>,
) -> anyhow::Result<(bool, Seen, Pair)> {
    let mut pair = pair(broker).await?;
    let a = pair.a.clone();
    let taken = publish(&mut pair.client, &a, payload).await;
    if !taken {
        // The broker refused it or closed the publisher's connection.
        pair.client = Client::connect(&broker.url).await?;
    }
    let b_ids = neighbour_messages(&mut pair, 20).await?;
    let a_ids: BTreeSet<String> = if taken {
        [id.to_owned()].into()
    } else {
        BTreeSet::new()
    };
    let mut seen = Seen::default();
    seen.until(&mut pair.host, &a_ids, &b_ids, DEADLINE).await?;
    assert!(
        seen.down.is_empty(),
        "{}: mounts went down: {:?}",
        broker.name,
        seen.down
    );
    Ok((taken, seen, pair))
}

/// A properties section holding the message-id `id`.
fn properties(id: &str) -> anyhow::Result<Vec<u8>> {
    let properties = fe2o3_amqp::types::messaging::Properties::builder()
        .message_id(id.to_owned())
        .build();
    Ok(serde_amqp::to_vec(&properties)?)
}

/// A ~40 KB message whose application-properties map has a binary key:
/// refused once (dead-lettered, with a reason that quotes nothing of the
/// key), never a reason to close the shared connection.
pub(crate) async fn a_binary_key(broker: &Broker) -> anyhow::Result<()> {
    let id = unique("binary-key");
    let payload = [
        properties(&id)?,
        hostile::section(
            0x74,
            &hostile::map(&[(hostile::binary(&[0xab; 40_000]), hostile::int(1))]),
        ),
        hostile::section(0x77, &hostile::string("x")),
    ]
    .concat();
    let (taken, seen, mut pair) = one_beside_the_neighbour(broker, &id, payload).await?;
    if taken {
        assert_eq!(
            seen.fates.get("refused unread"),
            Some(&1),
            "{:?}",
            seen.fates
        );
        let mut dead = pair.client.watch_raw(&pair.a_dead).await?;
        let letter = dead.next().await?;
        assert_eq!(
            wharf_core::message::message_id_of(&letter).as_deref(),
            Some(id.as_str())
        );
        dead.close().await;
    }
    println!(
        "{}: a 40 KB binary key {}; refused once, the neighbour's 20 handled, no mount down",
        broker.name,
        if taken {
            "was delivered"
        } else {
            "was refused by the broker"
        }
    );
    pair.host.stop().await?;
    pair.client.close().await;
    Ok(())
}

/// A request whose `reply-to` is 70 KB: the reply is refused as too large
/// before any link exists.
pub(crate) async fn a_long_reply_to(broker: &Broker) -> anyhow::Result<()> {
    let id = unique("long-reply-to");
    let request = TestMessage::new(&id, "ping")
        .reply_to(&format!("client.{}", "r".repeat(70_000)))
        .script("*:reply,fails=too-large,ack")
        .build()
        .encode()?;
    let (taken, seen, pair) = one_beside_the_neighbour(broker, &id, request.to_vec()).await?;
    if taken {
        assert_eq!(seen.fates.get("accepted"), Some(&1), "{:?}", seen.fates);
    }
    println!(
        "{}: a 70 KB reply-to {}; the reply was too large, the neighbour's 20 handled, no mount down",
        broker.name,
        if taken {
            "was delivered"
        } else {
            "was refused by the broker"
        }
    );
    pair.host.stop().await?;
    pair.client.close().await;
    Ok(())
}

/// Requests whose `reply-to` spells the neighbour's queues, and the
/// broker's own, every way the broker reads them: each reply is denied,
/// and nothing reaches the neighbour.
pub(crate) async fn every_spelling_of_the_neighbour(broker: &Broker) -> anyhow::Result<()> {
    let mut pair = pair(broker).await?;
    let mut forbidden: Vec<String> = pair
        .b_names
        .iter()
        .flat_map(|name| spellings(broker.kind, name))
        .collect();
    for system in ["DLQ", "ActiveMQ.DLQ", "amq.direct", "activemq.management"] {
        forbidden.extend(spellings(broker.kind, system));
    }
    let mut ids = BTreeSet::new();
    let rpc = pair.a.clone();
    for address in &forbidden {
        let id = unique("request");
        let request = TestMessage::new(&id, "ping")
            .reply_to(address)
            .script("*:reply,fails=denied,ack");
        pair.client.publish(&rpc, request).await?;
        ids.insert(id);
    }
    let b_ids = neighbour_messages(&mut pair, 5).await?;
    let mut seen = Seen::default();
    seen.until(&mut pair.host, &ids, &b_ids, DEADLINE).await?;
    assert_eq!(
        seen.fates.get("accepted"),
        Some(&ids.len()),
        "a reply was not denied: {:?}",
        seen.fates
    );
    let strays: Vec<_> = seen.neighbour.difference(&b_ids).collect();
    assert!(
        strays.is_empty(),
        "replies reached the neighbour: {strays:?}"
    );
    assert!(seen.down.is_empty(), "mounts went down: {:?}", seen.down);
    println!(
        "{}: {} spellings of the neighbour's and the broker's queues denied ({})",
        broker.name,
        forbidden.len(),
        forbidden.join(" | ")
    );
    pair.host.stop().await?;
    pair.client.close().await;
    Ok(())
}

/// A message whose body is an array of two empty lists (a value the
/// encoder cannot write back), retried to its limit: it is dead-lettered
/// as it arrived, however the broker counts retries.
pub(crate) async fn empty_lists_reach_the_dead_letter_address(
    broker: &Broker,
) -> anyhow::Result<()> {
    let id = unique("empty-lists");
    let body = hostile::section(0x77, &hostile::empty_lists(2));
    let payload = [
        properties(&id)?,
        hostile::section(
            0x74,
            &hostile::map(&[(hostile::string("script"), hostile::string("*:retry"))]),
        ),
        body.clone(),
    ]
    .concat();
    let (taken, seen, mut pair) = one_beside_the_neighbour(broker, &id, payload).await?;
    // RabbitMQ 3.10 refuses such a message from the publisher.
    if taken {
        assert_eq!(
            seen.fates.get("dead-lettered"),
            Some(&1),
            "{:?}",
            seen.fates
        );
        let mut dead = pair.client.watch_raw(&pair.a_dead).await?;
        let letter = dead.next().await?;
        assert!(letter.ends_with(&body), "the dead letter's body changed");
        dead.close().await;
    }
    println!(
        "{}: a body of empty lists {}",
        broker.name,
        if taken {
            "retried to its limit was dead-lettered as it arrived"
        } else {
            "was refused by the broker"
        }
    );
    pair.host.stop().await?;
    pair.client.close().await;
    Ok(())
}

/// The generator's seed and message count: `WHARF_HOSTILE_SEED`,
/// `WHARF_HOSTILE_COUNT`, or a fixed seed and `default` messages.
fn generator_run(default: usize) -> (u64, usize) {
    let seed = std::env::var("WHARF_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let count = std::env::var("WHARF_HOSTILE_COUNT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (seed, count)
}

/// Bytes of memory the process holds, and its open file descriptors.
fn resources() -> (u64, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches(" kB").parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024);
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count());
    (rss, fds)
}

/// Most the test process may grow by while the generator runs: a host
/// holding every budget it has, and the test's own records.
const RSS_GROWTH: u64 = 512 << 20;

/// Hostile messages in batches of `BATCH`, each batch beside ordinary
/// messages to the neighbour; after each: no mount went down, every hostile
/// message ended, every neighbour's message was handled, nothing reached
/// the neighbour, and memory and open files stayed within bounds.
pub(crate) async fn the_hostile_publisher(broker: &Broker) -> anyhow::Result<()> {
    const BATCH: usize = 25;
    let (seed, count) = generator_run(100);
    let started = std::time::Instant::now();
    let mut pair = pair(broker).await?;
    let (rss_before, fds_before) = resources();
    let through = Through {
        kind: broker.kind,
        max_depth: broker.max_depth,
        simple_properties: broker.simple_properties,
        neighbour: pair.b_names.to_vec(),
    };
    let mut rng = Rng::new(seed);
    let mut seen = Seen::default();
    let mut sent = 0;
    let mut refused_by_broker = BTreeMap::<&str, usize>::new();
    let mut shapes = BTreeMap::<&str, usize>::new();
    let mut b_all = BTreeSet::new();
    for batch in 0..count.div_ceil(BATCH) {
        let mut a_ids = BTreeSet::new();
        let mut shape_of = BTreeMap::new();
        for n in batch * BATCH..((batch + 1) * BATCH).min(count) {
            let message = hostile::message(&mut rng, seed, n, &through);
            let a = pair.a.clone();
            if publish(&mut pair.client, &a, message.payload).await {
                shape_of.insert(message.id.clone(), message.shape);
                a_ids.insert(message.id);
                *shapes.entry(message.shape).or_default() += 1;
                sent += 1;
            } else {
                *refused_by_broker.entry(message.shape).or_default() += 1;
                pair.client = Client::connect(&broker.url).await?;
            }
        }
        let b_ids = neighbour_messages(&mut pair, 10).await?;
        b_all.extend(b_ids.iter().cloned());
        seen.until(&mut pair.host, &a_ids, &b_ids, DEADLINE * 2)
            .await
            .with_context(|| {
                let unended: Vec<_> = shape_of
                    .iter()
                    .filter(|(id, _)| !seen.ended.contains(*id))
                    .map(|(id, shape)| format!("{id}: {shape}"))
                    .collect();
                format!("seed {seed}, batch {batch}, not ended: {unended:?}")
            })?;
        assert!(
            seen.down.is_empty(),
            "seed {seed}, batch {batch}: mounts went down: {:?}",
            seen.down
        );
        let strays: Vec<_> = seen.neighbour.difference(&b_all).collect();
        assert!(
            strays.is_empty(),
            "seed {seed}: reached the neighbour: {strays:?}"
        );
        let (rss, fds) = resources();
        assert!(
            rss < rss_before + RSS_GROWTH,
            "seed {seed}, batch {batch}: RSS {} MiB, from {} MiB",
            rss >> 20,
            rss_before >> 20
        );
        assert!(
            fds <= fds_before + 16,
            "seed {seed}, batch {batch}: {fds} open files, from {fds_before}"
        );
    }
    // The neighbour's dead-letter queue got nothing: a marker sent there
    // now is the first message on it.
    let marker = unique("marker");
    let dead = (broker.queue)(&pair.b_names[1]);
    pair.client
        .publish(&dead, TestMessage::new(&marker, "x"))
        .await?;
    let mut watcher = pair.client.watch(&dead).await?;
    let (_, first) = watcher.next().await?;
    assert_eq!(
        crate::client::message_id(&first).as_deref(),
        Some(marker.as_str()),
        "seed {seed}: something reached the neighbour's dead-letter queue"
    );
    watcher.close().await;
    let (rss, fds) = resources();
    println!(
        "{}: seed {seed:#x}: {sent} hostile messages ended ({:?}), {} refused by the broker ({refused_by_broker:?}); shapes {shapes:?}; the neighbour's {} all handled; no mount down; RSS {} → {} MiB, fds {fds_before} → {fds}; {:.0?}",
        broker.name,
        seen.fates,
        count - sent,
        b_all.len(),
        rss_before >> 20,
        rss >> 20,
        started.elapsed(),
    );
    pair.host.stop().await?;
    pair.client.close().await;
    Ok(())
}

/// Tests on one broker, each running its function with the broker held.
macro_rules! on_broker {
    ($broker:expr, $($test:ident => $run:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $test() -> anyhow::Result<()> {
                let broker = $broker;
                let _held = broker.hold().await;
                $run(&broker).await
            }
        )*
    };
}

macro_rules! untrusted_on {
    ($name:ident, $broker:expr) => {
        mod $name {
            use super::*;

            on_broker!(
                $broker,
                a_binary_key_is_refused_once_and_the_connection_stays => a_binary_key,
                a_long_reply_to_is_too_large_and_the_connection_stays => a_long_reply_to,
                no_spelling_of_the_neighbours_queues_gets_a_reply => every_spelling_of_the_neighbour,
                a_body_of_empty_lists_is_dead_lettered_at_its_limit => empty_lists_reach_the_dead_letter_address,
                the_hostile_publisher_breaks_no_invariant => the_hostile_publisher,
            );
        }
    };
}

untrusted_on!(artemis_broker, artemis());
untrusted_on!(rabbitmq4_broker, rabbitmq4());
untrusted_on!(rabbitmq3_broker, rabbitmq3());
untrusted_on!(activemq_broker, activemq());
untrusted_on!(qpid_broker, qpid());

/// Each performative that can carry text longer than a frame: an attach
/// (sender and receiver) on an address, a disposition with an error's
/// description, a detach with one. Over the broker's max-frame-size each
/// is refused (the detach goes with its condition alone) and the
/// connection goes on; a transfer longer than a frame is split and
/// arrives whole.
#[tokio::test(flavor = "multi_thread")]
async fn no_performative_longer_than_a_frame_reaches_the_broker() -> anyhow::Result<()> {
    use fe2o3_amqp::link::{ReceiverAttachError, SenderAttachError};
    use fe2o3_amqp::types::definitions::{AmqpError, Error};
    use fe2o3_amqp::types::messaging::{Body, Message};
    use fe2o3_amqp::types::primitives::{Binary, Value};
    use fe2o3_amqp::{Receiver, Sender, Session};

    let url = artemis_url();
    let mut connection = crate::client::open(&url).await?;
    let mut session = Session::begin(&mut connection).await?;
    let long = format!("q.{}", "x".repeat(200_000));
    let sender = Sender::attach(&mut session, unique("long-sender"), long.as_str()).await;
    assert!(
        matches!(sender, Err(SenderAttachError::FrameTooLarge(_))),
        "{:?}",
        sender.err()
    );
    let receiver = Receiver::attach(&mut session, unique("long-receiver"), long.as_str()).await;
    assert!(
        matches!(receiver, Err(ReceiverAttachError::FrameTooLarge(_))),
        "{:?}",
        receiver.err()
    );
    // The session goes on: a transfer of 500 KB is split into frames.
    let q = unique("frames");
    let mut sender = Sender::attach(&mut session, unique("sender"), q.as_str()).await?;
    let body = vec![7u8; 500_000];
    let message = Message::builder().data(Binary::from(body.clone())).build();
    sender
        .send(message)
        .await?
        .accepted_or("a 500 KB transfer")
        .map_err(anyhow::Error::msg)?;
    let mut receiver = Receiver::attach(&mut session, unique("receiver"), q.as_str()).await?;
    let delivery = receiver.recv::<Body<Value>>().await?;
    match delivery.body() {
        Body::Data(data) => assert_eq!(data.iter().map(|d| d.0.len()).sum::<usize>(), body.len()),
        other => panic!("{other:?}"),
    }
    // A rejection whose description is longer than a frame is refused;
    // the delivery is still unsettled, and accepted after.
    let description = "d".repeat(200_000);
    let error = Error::new(AmqpError::DecodeError, Some(description.clone()), None);
    let rejected = receiver.reject(&delivery, error).await;
    assert!(
        matches!(
            rejected,
            Err(fe2o3_amqp::link::DispositionError::FrameTooLarge(_))
        ),
        "{rejected:?}"
    );
    receiver.accept(&delivery).await?;
    // A detach with such an error goes with the condition alone.
    let error = Error::new(AmqpError::InternalError, Some(description), None);
    receiver
        .detach_with_error(error)
        .await
        .map_err(|(_, e)| anyhow::anyhow!("detach: {e}"))?;
    // And the connection is still the broker's: another round trip.
    let mut again = Sender::attach(&mut session, unique("sender"), q.as_str()).await?;
    again
        .send(Message::builder().value("after").build())
        .await?
        .accepted_or("a publish after")
        .map_err(anyhow::Error::msg)?;
    again.close().await?;
    sender.close().await?;
    session.end().await?;
    connection.close().await?;
    println!(
        "frames: attaches and a disposition of 200 KB refused, a detach sent without its description, a 500 KB transfer split and received, the connection kept"
    );
    Ok(())
}

/// A handler's own output message-id never becomes the id Artemis drops
/// duplicates by: two deliveries whose outputs share the id a handler
/// chose both publish.
#[tokio::test(flavor = "multi_thread")]
async fn a_handlers_output_id_is_never_a_duplicate_id() -> anyhow::Result<()> {
    let url = artemis_url();
    let (q, out) = (unique("dedup.in"), unique("dedup.out"));
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("outputs = \"confirm\"")
        .with(&format!("[tenant.mount.grants]\nsend = [\"{out}\"]"));
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    let mut outputs = client.watch(&out).await?;
    let ids = [unique("first"), unique("second")];
    for id in &ids {
        let script = format!("*:sendid=chosen-by-the-handler={out},ack");
        client
            .publish(&q, TestMessage::new(id, "x").script(&script))
            .await?;
        let handled = host.handled(id).await?;
        assert_eq!(
            handled.disposition,
            Some(Disposition::Accepted),
            "{handled:?}"
        );
    }
    for _ in &ids {
        let (_, output) = outputs.next().await?;
        assert_eq!(
            crate::client::message_id(&output).as_deref(),
            Some("chosen-by-the-handler")
        );
    }
    println!("dedup: two outputs with one handler-chosen id both published on Artemis");
    outputs.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// A message of many small values takes many times its size once decoded,
/// and is counted so: with a tenant budget of 16 MiB, deliveries of
/// 240,000 one-byte values (each ~20 MiB decoded) run one at a time,
/// though the mount would run four.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_is_counted_at_its_decoded_size() -> anyhow::Result<()> {
    let url = artemis_url();
    let q = unique("decoded");
    let tenant = TenantToml::new(
        "t",
        vec![
            MountToml::new("m", "fixture_script", &q)
                .with("concurrency = 4")
                .with("max_message_size = \"1MiB\"")
                .with("[tenant.mount.grants]\nclocks = true"),
        ],
    )
    .with("max_buffered = \"16MiB\"");
    let text = tenants_text(&url, "", &[tenant]);
    let mut host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    let mut client = Client::connect(&url).await?;
    // Four lists of 60,000 `true`s: a decoder takes at most 65,536 values
    // in one list.
    let values = hostile::list(&vec![hostile::list(&vec![vec![0x41]; 60_000]); 4]);
    let mut ids = Vec::new();
    for _ in 0..4 {
        let id = unique("many-values");
        let payload = [
            properties(&id)?,
            hostile::section(
                0x74,
                &hostile::map(&[(hostile::string("script"), hostile::string("*:busy=300"))]),
            ),
            hostile::section(0x77, &values),
        ]
        .concat();
        assert!(
            publish(&mut client, &q, payload).await,
            "Artemis refused it"
        );
        ids.push(id);
    }
    let most = host.most_at_once(ids.len()).await?;
    assert_eq!(
        most, 1,
        "deliveries of ~20 MiB decoded each ran {most} at once in a 16 MiB budget"
    );
    println!(
        "decoded size: 4 messages of 250,000 one-byte values ran one at a time in a 16 MiB budget"
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// The real binary's log, while a publisher sends text meant to break it:
/// a 40 KB binary key, 30 KB string keys with line breaks and terminal
/// escapes, a 70 KB `reply-to`, a 200 KB message-id. Every line is one
/// line of at most the writer's bound, and none carries the input whole.
#[tokio::test(flavor = "multi_thread")]
async fn log_lines_stay_bounded_whatever_the_publisher_writes() -> anyhow::Result<()> {
    use fe2o3_amqp::types::messaging::Properties;

    let url = artemis_url();
    let q = unique("log.in");
    let dead = format!("{q}.dlq");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with(&format!("dead_letter = \"{dead}\""))
        .with("[tenant.mount.grants]\nreply = true");
    let mut wharf =
        crate::process::WharfProcess::start_config(&crate::config_text(&url, &[mount])).await?;
    let mut client = Client::connect(&url).await?;
    let long_id = format!("id\nFORGED {}", "i".repeat(200_000));
    let forged_key = format!("k\nFORGED\u{1b}[31m{}", "k".repeat(30_000));
    let messages = [
        [
            properties("log.binary-key")?,
            hostile::section(
                0x74,
                &hostile::map(&[(hostile::binary(&[0xab; 40_000]), hostile::int(1))]),
            ),
            hostile::section(0x77, &hostile::string("x")),
        ]
        .concat(),
        [
            properties("log.string-key")?,
            hostile::section(
                0x74,
                &hostile::map(&[
                    (hostile::string(&forged_key), hostile::int(1)),
                    (hostile::string("script"), hostile::string("*:trap")),
                ]),
            ),
            hostile::section(0x77, &hostile::string("x")),
        ]
        .concat(),
        [
            serde_amqp::to_vec(
                &Properties::builder()
                    .message_id("log.reply-to".to_owned())
                    .reply_to(format!("client\nFORGED {}", "r".repeat(70_000)))
                    .build(),
            )?,
            hostile::section(
                0x74,
                &hostile::map(&[(hostile::string("script"), hostile::string("*:reply,ack"))]),
            ),
            hostile::section(0x77, &hostile::string("x")),
        ]
        .concat(),
        [
            serde_amqp::to_vec(&Properties::builder().message_id(long_id.clone()).build())?,
            hostile::section(
                0x74,
                &hostile::map(&[(hostile::string("script"), hostile::string("*:retry"))]),
            ),
            hostile::section(0x77, &hostile::string("x")),
        ]
        .concat(),
    ];
    for payload in messages {
        assert!(
            publish(&mut client, &q, payload).await,
            "Artemis refused it"
        );
    }
    // Three end as dead letters (the unreadable one, the trap, the
    // retry); the reply goes out or not. Then one more, whose line ends
    // the reading.
    let mut letters = client.watch_raw(&dead).await?;
    for _ in 0..3 {
        letters.next().await?;
    }
    letters.close().await;
    client
        .publish(&q, TestMessage::new("log.after", "x").script("*:ack"))
        .await?;
    let lines = wharf
        .lines_until("\"messaging.message.id\":\"log.after\"")
        .await?;
    let bytes: usize = lines.iter().map(String::len).sum();
    for line in &lines {
        assert!(
            line.len() <= wharf::logging::MAX_LINE_BYTES,
            "a log line of {} bytes",
            line.len()
        );
        assert!(
            !line.contains("FORGED\u{1b}") && !line.contains(&"k".repeat(1_000)),
            "a log line carries the input whole: {}",
            &line[..line.len().min(300)]
        );
        let parsed: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("not one JSON line: {}", &line[..line.len().min(300)]))?;
        assert!(parsed.is_object());
    }
    assert!(
        bytes < 64 * 1024,
        "{} lines of {bytes} bytes for five messages",
        lines.len()
    );
    println!(
        "log: {} lines, {bytes} bytes in all, the longest {} bytes, for four hostile messages and one ordinary one",
        lines.len(),
        lines.iter().map(String::len).max().unwrap_or(0)
    );
    client.close().await;
    Ok(())
}

/// A message whose sections are named by symbol, around a body the
/// encoder cannot write back, retried by copies: each copy is made from
/// the bytes delivered (its sections found by their names), and the last
/// attempt is dead-lettered as it arrived.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_named_by_symbols_is_copied_to_its_limit() -> anyhow::Result<()> {
    let url = artemis_url();
    let q = unique("named");
    let dead = format!("{q}.dlq");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("retry = \"copy\"")
        .with("max_attempts = 3")
        .with(&format!("dead_letter = \"{dead}\""));
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    let id = unique("named");
    let named = |name: &str, value: Vec<u8>| [vec![0x00], hostile::symbol(name), value].concat();
    let body = named("amqp:amqp-value:*", hostile::empty_lists(2));
    let payload = [
        properties(&id)?,
        named(
            "amqp:application-properties:map",
            hostile::map(&[(hostile::string("script"), hostile::string("*:retry"))]),
        ),
        body.clone(),
    ]
    .concat();
    assert!(
        publish(&mut client, &q, payload).await,
        "Artemis refused it"
    );
    let handled = host.handled_n(&id, 3).await?;
    let attempts: Vec<u32> = handled.iter().map(|h| h.attempt).collect();
    assert_eq!(attempts, [1, 2, 3]);
    let last = handled.last().expect("three");
    assert_eq!(last.plan.publish(), Some(Publish::DeadLetter), "{last:?}");
    assert_eq!(last.disposition, Some(Disposition::Accepted), "{last:?}");
    let mut letters = client.watch_raw(&dead).await?;
    let letter = letters.next().await?;
    assert!(letter.ends_with(&body), "the dead letter's body changed");
    letters.close().await;
    println!("a message named by symbols was copied twice and dead-lettered at its third attempt");
    host.stop().await?;
    client.close().await;
    Ok(())
}
