//! Publishers who are not on our side: messages built to exhaust the host,
//! messages carrying what a broker reserves for itself, requests whose
//! `reply-to` points at someone else's queue. Whatever arrives, the host
//! lives, every delivery ends by the contract, and no tenant's reply lands
//! where it does not belong.

use fe2o3_amqp::types::messaging::{MessageAnnotations, Properties};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use wharf::events::{Event, Handled};
use wharf_core::config::Config;
use wharf_core::message::limits;
use wharf_core::settlement::{Disposition, Plan, Publish};

use crate::client::{Client, TestMessage};
use crate::process::WharfProcess;
use crate::{
    MountToml, TenantToml, TestHost, artemis_url, config_text, rabbitmq4_shared, rabbitmq4_url,
    repo_root, tenants_text, unique, wait_for_count,
};

/// The annotation a dead letter carries its reason in.
const REASON: &str = "x-opt-wharf-dead-letter-reason";

/// A list nested `depth` deep (around an empty one), encoded.
fn nested_list(depth: usize) -> Vec<u8> {
    let mut value = vec![0x45];
    for _ in 1..depth {
        let size = u32::try_from(value.len() + 4).expect("under 4 GiB");
        let mut outer = vec![0xd0];
        outer.extend_from_slice(&size.to_be_bytes());
        outer.extend_from_slice(&1u32.to_be_bytes());
        outer.extend_from_slice(&value);
        value = outer;
    }
    value
}

/// A message with id `id` whose `amqp-value` body is a list nested
/// `depth` deep.
fn nested_body(id: &str, depth: usize) -> Vec<u8> {
    let mut payload = properties(id);
    payload.extend_from_slice(&[0x00, 0x53, 0x77]);
    payload.extend_from_slice(&nested_list(depth));
    payload
}

/// A message with id `id` whose application property `k` is a list nested
/// `depth` deep.
fn nested_property(id: &str, depth: usize) -> Vec<u8> {
    let mut payload = properties(id);
    let list = nested_list(depth);
    let mut map = vec![0x00, 0x53, 0x74, 0xd1];
    let size = u32::try_from(4 + 3 + list.len()).expect("under 4 GiB");
    map.extend_from_slice(&size.to_be_bytes());
    map.extend_from_slice(&2u32.to_be_bytes());
    map.extend_from_slice(&[0xa1, 0x01, b'k']);
    map.extend_from_slice(&list);
    payload.extend_from_slice(&map);
    // A body after it, as any message has.
    payload.extend_from_slice(&[0x00, 0x53, 0x75, 0xa0, 0x01, b'x']);
    payload
}

fn properties(id: &str) -> Vec<u8> {
    let properties = Properties::builder().message_id(id.to_owned()).build();
    serde_amqp::to_vec(&properties).expect("properties encode")
}

/// The reason a dead letter's payload carries, read from its annotations
/// alone (the rest may be nested past any decoder's reach).
fn dead_letter_reason(payload: &[u8]) -> Option<String> {
    let sections = limits::sections(payload)?;
    let (_, range) = sections.iter().find(|(code, _)| *code == 0x72)?;
    let annotations: MessageAnnotations = serde_amqp::from_slice(&payload[range.clone()]).ok()?;
    annotations.0.iter().find_map(|(key, value)| {
        (format!("{key:?}").contains(REASON)).then(|| match value {
            Value::String(text) => text.clone(),
            other => format!("{other:?}"),
        })
    })
}

/// Messages nested past the limits, as body (`body_depths`) and as an
/// application property (`property_depths`), then an ordinary one, to a
/// mount with a dead-letter address on the broker at `url`.
pub(crate) async fn nested_messages(
    url: &str,
    body_depths: &[usize],
    property_depths: &[usize],
) -> anyhow::Result<()> {
    let q = unique("nested");
    let dla = format!("{q}.dlq");
    let mount = MountToml::new("m", "fixture_script", &q).with(&format!("dead_letter = \"{dla}\""));
    let mut wharf = WharfProcess::start_config(&config_text(url, &[mount])).await?;
    let mut client = Client::connect(url).await?;
    let mut dead_letters = client.watch_raw(&dla).await?;
    let mut sent = Vec::new();
    for depth in body_depths {
        let id = format!("{q}.body.{depth}");
        client.publish_raw(&q, nested_body(&id, *depth)).await?;
        sent.push(id);
    }
    for depth in property_depths {
        let id = format!("{q}.property.{depth}");
        client.publish_raw(&q, nested_property(&id, *depth)).await?;
        sent.push(id);
    }
    let after = format!("{q}.after");
    client
        .publish(&q, TestMessage::new(&after, "x").script("*:ack"))
        .await?;
    wharf
        .wait_for_log(&format!("\"messaging.message.id\":\"{after}\""))
        .await?;
    for _ in &sent {
        let payload = dead_letters.next().await?;
        let reason = dead_letter_reason(&payload).unwrap_or_default();
        assert!(reason.contains("levels deep"), "{reason:?}");
    }
    dead_letters.close().await;
    assert!(
        wharf.child.try_wait()?.is_none(),
        "the host exited on a nested message"
    );
    println!(
        "nested messages on {url}: bodies {body_depths:?} and properties {property_depths:?} deep, {} sent, {} dead-lettered with the reason, the host lived and handled the next message",
        sent.len(),
        sent.len()
    );
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_nested_past_the_limit_are_dead_lettered_and_the_host_lives_on_artemis()
-> anyhow::Result<()> {
    // Artemis 2.40 decodes application properties itself, and overflows its
    // own stack on one nested 100,000 deep: it never answers that publish.
    nested_messages(&artemis_url(), &[5_000, 100_000], &[5_000]).await
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_nested_past_the_limit_are_dead_lettered_and_the_host_lives_on_rabbitmq4()
-> anyhow::Result<()> {
    let _shared = rabbitmq4_shared().await;
    nested_messages(&rabbitmq4_url(), &[5_000, 100_000], &[5_000, 100_000]).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nested_message_without_a_dead_letter_address_is_rejected() -> anyhow::Result<()> {
    let url = artemis_url();
    let q = unique("nested.plain");
    let mut host = TestHost::start(&url, &[MountToml::new("m", "fixture_script", &q)]).await?;
    let mut client = Client::connect(&url).await?;
    client
        .publish_raw(&q, nested_body("plain", 100_000))
        .await?;
    let reason = host.refused().await?;
    assert!(reason.contains("levels deep"), "{reason}");
    // Rejected: the broker's own policy decides (Artemis's DLQ).
    let dlq = format!("DLQ.{q}");
    wait_for_count(&dlq, 1, async || client.artemis_count(&dlq).await).await?;
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// Every attempt of `id`, in order, and what became of the last.
async fn attempts(host: &mut TestHost, id: &str, n: usize) -> anyhow::Result<Vec<Handled>> {
    let handled = host.handled_n(id, n).await?;
    let seen: Vec<u32> = handled.iter().map(|h| h.attempt).collect();
    let wanted: Vec<u32> = (1..=u32::try_from(n)?).collect();
    assert_eq!(seen, wanted, "{id}");
    Ok(handled)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_retry_of_a_message_with_a_duplicate_id_happens_on_artemis() -> anyhow::Result<()> {
    let url = artemis_url();
    let cases = [
        ("scheduled", "", "1:after=50 2:after=50 *:ack"),
        (
            "copies",
            "retry = \"copy\"\nmax_attempts = 5",
            "1:retry 2:retry *:ack",
        ),
        (
            "original-accepted",
            "retry_after_original = \"accepted\"",
            "1:after=50 2:after=50 *:ack",
        ),
        ("held", "delay = \"held\"", "1:after=50 2:after=50 *:ack"),
        (
            "at-most-once",
            "settle = \"at-most-once\"",
            "1:after=50 2:after=50 *:ack",
        ),
    ];
    let queues: Vec<String> = cases.iter().map(|(name, ..)| unique(name)).collect();
    let mounts: Vec<MountToml> = cases
        .iter()
        .zip(&queues)
        .map(|((name, extra, _), q)| MountToml::new(name, "fixture_script", q).with(extra))
        .collect();
    let mut host = TestHost::start(&url, &mounts).await?;
    let mut client = Client::connect(&url).await?;
    for ((name, _, script), q) in cases.iter().zip(&queues) {
        let id = format!("{q}.{name}");
        let message = TestMessage::new(&id, "x")
            .header(0)
            .script(script)
            .property("_AMQ_DUPL_ID", SimpleValue::String(unique("dupl")));
        client.publish(q, message).await?;
    }
    for ((name, ..), q) in cases.iter().zip(&queues) {
        let id = format!("{q}.{name}");
        let handled = attempts(&mut host, &id, 3).await?;
        let last = handled.last().expect("three");
        assert_eq!(last.error, None, "{name}");
        println!("{name}: attempts 1, 2, 3 of a message carrying _AMQ_DUPL_ID all happened");
    }
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// Requests to `rpc` whose `reply-to` names each of `forbidden`: the
/// handler must be told `denied` (the script acks only then).
async fn deny_each(
    host: &mut TestHost,
    client: &mut Client,
    rpc: &str,
    forbidden: &[String],
) -> anyhow::Result<()> {
    for address in forbidden {
        let id = unique("request");
        let request = TestMessage::new(&id, "ping")
            .reply_to(address)
            .script("*:reply,fails=denied,ack");
        client.publish(rpc, request).await?;
        let handled = host.handled(&id).await?;
        assert_eq!(
            handled.disposition,
            Some(Disposition::Accepted),
            "a reply to {address} was not denied: {handled:?}"
        );
    }
    Ok(())
}

/// Two tenants on `url`: `a` serves requests on `rpc`; `b` owns `orders`
/// (not consumed: its mount is on another address) and `orders.dlq`.
fn two_tenants(url: &str, rpc: &str, b_queue: &str, b_orders: &str) -> anyhow::Result<Config> {
    let a = TenantToml::new(
        "a",
        vec![
            MountToml::new("rpc", "fixture_script", rpc)
                .with("[tenant.mount.grants]\nreply = true"),
        ],
    );
    let b = TenantToml::new(
        "b",
        vec![
            MountToml::new("work", "fixture_script", b_queue)
                .with(&format!("dead_letter = \"{b_orders}.dlq\"")),
            MountToml::new("sender", "fixture_script", &unique("b.in"))
                .with(&format!("[tenant.mount.grants]\nsend = [\"{b_orders}\"]")),
        ],
    );
    Ok(Config::parse(
        &tenants_text(url, "", &[a, b]),
        &repo_root().join("test.toml"),
    )?)
}

pub(crate) async fn replies_are_confined(url: &str, system: &[&str]) -> anyhow::Result<()> {
    let rpc = unique("rpc");
    let b_queue = unique("b.work");
    let b_orders = unique("b.orders");
    let mut host = TestHost::start_config(two_tenants(url, &rpc, &b_queue, &b_orders)?).await?;
    let mut client = Client::connect(url).await?;
    let mut forbidden = vec![b_queue.clone(), b_orders.clone(), format!("{b_orders}.dlq")];
    forbidden.extend(system.iter().map(|s| (*s).to_owned()));
    deny_each(&mut host, &mut client, &rpc, &forbidden).await?;
    // Nothing reached tenant b: its mount handled nothing.
    assert!(
        !host.seen(|e| matches!(e, Event::Handled(h) if &*h.tenant == "b")),
        "a reply reached tenant b"
    );
    // A reply to the requester's own address still goes out.
    let own = unique("client.replies");
    let mut replies = client.watch(&own).await?;
    let id = unique("request");
    client
        .publish(
            &rpc,
            TestMessage::new(&id, "ping")
                .reply_to(&own)
                .script("*:reply,ack"),
        )
        .await?;
    let (_, reply) = replies.next().await?;
    assert_eq!(crate::client::body_bytes(&reply), b"re:ping");
    replies.close().await;
    println!(
        "replies: {} forbidden reply-to addresses denied ({}), the requester's own answered",
        forbidden.len(),
        forbidden.join(", ")
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn replies_cannot_reach_another_tenant_or_the_broker_on_artemis() -> anyhow::Result<()> {
    replies_are_confined(
        &artemis_url(),
        &["activemq.management", "DLQ", "$sys.mqtt.sessions"],
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn replies_cannot_reach_another_tenant_or_the_broker_on_rabbitmq4() -> anyhow::Result<()> {
    let _shared = rabbitmq4_shared().await;
    replies_are_confined(
        &rabbitmq4_url(),
        &["/exchange/amq.direct/x", "/queues/amq.gen-forged"],
    )
    .await
}

/// A request whose reply cannot be delivered, on a mount with a limit and
/// a dead-letter address: every attempt fails, the last dead-letters it
/// with the reason.
async fn undeliverable_reply(
    url: &str,
    rpc: &str,
    reply_to: &str,
    extra: &str,
) -> anyhow::Result<()> {
    let dla = format!("{rpc}.dlq");
    let mount = MountToml::new("rpc", "fixture_script", rpc)
        .with(&format!(
            "max_attempts = 2\ndead_letter = \"{dla}\"\n{extra}"
        ))
        .with("[tenant.mount.grants]\nreply = true");
    let mut host = TestHost::start(url, &[mount]).await?;
    let mut client = Client::connect(url).await?;
    let mut dead_letters = client.watch_raw(&dla).await?;
    let id = unique("request");
    client
        .publish(
            rpc,
            TestMessage::new(&id, "ping")
                .header(0)
                .reply_to(reply_to)
                .script("*:reply,ack"),
        )
        .await?;
    let handled = attempts(&mut host, &id, 2).await?;
    for h in &handled {
        assert!(h.instead.is_some(), "the ack stood: {h:?}");
        assert!(
            h.error.as_deref().is_some_and(|e| e.contains(reply_to)),
            "{h:?}"
        );
    }
    let last = handled.last().expect("two");
    assert!(
        matches!(
            last.instead,
            Some(Plan::PublishThenSettle {
                publish: Publish::DeadLetter,
                ..
            })
        ),
        "{last:?}"
    );
    assert_eq!(last.disposition, Some(Disposition::Accepted));
    let payload = dead_letters.next().await?;
    let reason = dead_letter_reason(&payload).unwrap_or_default();
    assert!(reason.contains(reply_to), "{reason:?}");
    println!("undeliverable reply to {reply_to}: 2 attempts failed, dead-lettered: {reason}");
    dead_letters.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ack_whose_reply_cannot_be_delivered_is_dead_lettered_at_its_limit_on_rabbitmq4()
-> anyhow::Result<()> {
    let _shared = rabbitmq4_shared().await;
    // A v2 address names a queue that must exist.
    let missing = format!("/queues/{}", unique("missing"));
    undeliverable_reply(&rabbitmq4_url(), &unique("rpc"), &missing, "").await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ack_whose_reply_cannot_be_delivered_is_dead_lettered_at_its_limit_on_artemis()
-> anyhow::Result<()> {
    let url = artemis_url();
    let mut client = Client::connect(&url).await?;
    let prefix = unique("noauto");
    client
        .artemis_address_settings(
            &format!("{prefix}.#"),
            r#"{"autoCreateAddresses":false,"autoCreateQueues":false}"#,
        )
        .await?;
    client.close().await;
    let missing = format!("{prefix}.replies");
    // The transaction path (Artemis's default) and the confirm path.
    undeliverable_reply(&url, &unique("rpc"), &missing, "").await?;
    undeliverable_reply(&url, &unique("rpc"), &missing, "outputs = \"confirm\"").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_requesters_each_get_one_reply_in_transactions_on_artemis() -> anyhow::Result<()>
{
    const REQUESTERS: usize = 100;
    let url = artemis_url();
    let rpc = unique("rpc");
    let mut client = Client::connect(&url).await?;
    // All waiting before the host starts: they share transactions, with
    // more reply addresses than a mount keeps senders for.
    let requesters: Vec<String> = (0..REQUESTERS).map(|_| unique("requester")).collect();
    let messages = requesters.iter().enumerate().map(|(i, reply_to)| {
        TestMessage::new(&format!("{rpc}.{i}"), "ping")
            .header(0)
            .reply_to(reply_to)
            .script("*:reply,ack")
            .build()
    });
    client.publish_many(&rpc, messages).await?;
    let mount = MountToml::new("rpc", "fixture_script", &rpc)
        .with("credit = 200\nconcurrency = 100")
        .with("[tenant.mount.grants]\nreply = true");
    let mut host = TestHost::start_config(Config::parse(
        &config_text(&url, &[mount]),
        &repo_root().join("test.toml"),
    )?)
    .await?;
    for i in 0..REQUESTERS {
        let handled = host.handled(&format!("{rpc}.{i}")).await?;
        assert_eq!(
            handled.disposition,
            Some(Disposition::Accepted),
            "{handled:?}"
        );
        assert_eq!(handled.attempt, 1, "{handled:?}");
    }
    for reply_to in &requesters {
        wait_for_count(reply_to, 1, async || client.artemis_count(reply_to).await).await?;
    }
    assert!(
        !host.seen(|e| matches!(e, Event::MountDown { .. })),
        "the mount went down"
    );
    println!(
        "{REQUESTERS} requesters, {REQUESTERS} replies, each exactly once; the mount stayed up"
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_may_not_set_a_property_the_broker_reserves() -> anyhow::Result<()> {
    let url = artemis_url();
    let q = unique("reserved");
    let out = unique("reserved.out");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with(&format!("[tenant.mount.grants]\nsend = [\"{out}\"]"));
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    for key in ["_AMQ_DUPL_ID", "_AMQ_ROUTING_TYPE", "_HQ_ORIG_ADDRESS"] {
        let id = unique("reserved");
        client
            .publish(
                &q,
                TestMessage::new(&id, "x")
                    .script(&format!("*:sendwith={key}={out},fails=denied,ack")),
            )
            .await?;
        let handled = host.handled(&id).await?;
        assert_eq!(
            handled.disposition,
            Some(Disposition::Accepted),
            "{key}: {handled:?}"
        );
    }
    assert_eq!(client.artemis_count(&out).await?, 0);
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_reusing_one_message_id_do_not_switch_a_mount_to_copies() -> anyhow::Result<()> {
    const MESSAGES: usize = 6;
    let url = artemis_url();
    let q = unique("reused");
    let id = unique("same-id");
    let mut client = Client::connect(&url).await?;
    // Distinct messages, one id: each comes back once, counted by Artemis.
    let messages = (0..MESSAGES).map(|n| {
        TestMessage::new(&id, &format!("body {n}"))
            .header(0)
            .script("1:retry *:ack")
            .build()
    });
    client.publish_many(&q, messages).await?;
    let mount = MountToml::new("m", "fixture_script", &q).with("concurrency = 1");
    let mut host = TestHost::start(&url, &[mount]).await?;
    let handled = host.handled_n(&id, 2 * MESSAGES).await?;
    for h in &handled {
        let expected = if h.attempt == 1 {
            Plan::Settle(Disposition::Modified)
        } else {
            Plan::Settle(Disposition::Accepted)
        };
        assert_eq!(h.plan, expected, "{h:?}");
    }
    println!(
        "{MESSAGES} messages sharing one message-id: each retried by `modified` and acked; the mount never switched to copies"
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_retry_count_is_not_believed_where_counts_are_sealed() -> anyhow::Result<()> {
    forged_retry_counts_are_not_believed(&artemis_url()).await
}

/// A publisher's retry count is not believed on a mount whose host seals
/// its own copies' counts, on the broker at `url`.
pub(crate) async fn forged_retry_counts_are_not_believed(url: &str) -> anyhow::Result<()> {
    let q = unique("sealed");
    let key = crate::process::TempFile::new("key", "a shared secret")?;
    let mount =
        MountToml::new("m", "fixture_script", &q).with("retry = \"copy\"\nmax_attempts = 3");
    let text = tenants_text(
        url,
        &format!("retry_key_file = \"{}\"", key.0.display()),
        &[TenantToml::new("t", vec![mount])],
    );
    let mut host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("test.toml"))?).await?;
    let mut client = Client::connect(url).await?;
    // Claims four earlier retries: believed, it would be past the limit.
    let forged = unique("forged");
    client
        .publish(
            &q,
            TestMessage::new(&forged, "x")
                .header(0)
                .retry_count(4)
                .script("1:ack *:drop"),
        )
        .await?;
    let handled = host.handled(&forged).await?;
    assert_eq!(handled.attempt, 1, "{handled:?}");
    assert_eq!(handled.disposition, Some(Disposition::Accepted));
    // The host's own copies carry their seal, and count on.
    let genuine = unique("genuine");
    client
        .publish(
            &q,
            TestMessage::new(&genuine, "x")
                .header(0)
                .script("1:retry 2:retry *:ack"),
        )
        .await?;
    attempts(&mut host, &genuine, 3).await?;
    println!(
        "sealed retry counts on {url}: a forged count of 4 was handled as attempt 1; sealed copies counted 1, 2, 3"
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}
