//! Ordered mounts (`order_by`) on real brokers: each key's deliveries are
//! handled one at a time in the order they were published while keys run
//! side by side, and a failing head holds its key alone: the ordering
//! vectors O10–O12 of the README.

use std::collections::{BTreeMap, HashMap};

use wharf::events::{Event, Handled};
use wharf_core::settlement::{Plan, Publish};

use crate::client::{Client, TestMessage, Watcher, body_bytes};
use crate::poison::take;
use crate::process::WharfProcess;
use crate::{
    MountToml, TestHost, activemq_url, artemis_url, config_text, qpid_url, rabbitmq4_shared,
    rabbitmq4_url, unique,
};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use wharf_tests::rabbitmq4::{declare, delete};

const SCRIPT: &str = "fixture_script";

/// A mount of the script fixture on `address`, ordered by `order_by`,
/// that may send to `out` (16 handlers at once unless `extra` says).
fn ordered(address: &str, order_by: &str, out: &str, extra: &[&str]) -> MountToml {
    let mut mount =
        MountToml::new("m", SCRIPT, address).with(&format!("order_by = \"{order_by}\""));
    if !extra.iter().any(|line| line.starts_with("concurrency")) {
        mount = mount.with("concurrency = 16");
    }
    for line in extra {
        mount = mount.with(line);
    }
    mount
        .with("[tenant.mount.grants]")
        .with(&format!("send = [\"{out}\"]"))
        .with("clocks = true")
}

/// Message `seq` of key `key`: its id and body are `KEY.SEQ`, it carries
/// the key as property `key` and as its group, and its script says what
/// the handler does before it sends its body on to `out`.
fn keyed(key: &str, seq: u32, script: &str) -> TestMessage {
    let id = format!("{key}.{seq}");
    TestMessage::new(&id, &id)
        .header(0)
        .group(key, seq)
        .property("key", SimpleValue::String(key.to_owned()))
        .script(script)
}

/// A small pseudo-random number below `n` for `i`: handler times that
/// differ from message to message, the same on every run.
fn spread(i: u32, n: u32) -> u32 {
    (i.wrapping_mul(2_654_435_761) >> 16) % n.max(1)
}

/// Publishes `per_key` messages for each of `keys` keys to `queue`,
/// interleaved, each handled for a few milliseconds and sent on to `out`;
/// reads them back from `out` and checks each key's came out in published
/// order, each once.
async fn through_in_order(
    client: &mut Client,
    queue: &str,
    out: &str,
    keys: u32,
    per_key: u32,
) -> anyhow::Result<()> {
    let mut messages = Vec::new();
    for seq in 0..per_key {
        for k in 0..keys {
            let busy = spread(seq * keys + k, 3);
            messages
                .push(keyed(&format!("k{k}"), seq, &format!("*:send={out},busy={busy}")).build());
        }
    }
    client.publish_many(queue, messages).await?;
    let watch = client.watch(out).await?;
    outputs_in_order(watch, keys, per_key).await
}

/// Reads `keys` × `per_key` outputs whose bodies are `KEY.SEQ` from
/// `watch` and checks each key's came out in published order, each once.
async fn outputs_in_order(mut watch: Watcher, keys: u32, per_key: u32) -> anyhow::Result<()> {
    let mut seen: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for _ in 0..keys * per_key {
        let (_, message) = watch.next().await?;
        let body = String::from_utf8(body_bytes(&message))?;
        let (key, seq) = body
            .split_once('.')
            .ok_or_else(|| anyhow::anyhow!("not KEY.SEQ: {body:?}"))?;
        seen.entry(key.to_owned()).or_default().push(seq.parse()?);
    }
    watch.close().await;
    assert_eq!(seen.len(), keys as usize);
    let expected: Vec<u32> = (0..per_key).collect();
    for (key, sequence) in &seen {
        assert_eq!(
            sequence, &expected,
            "key {key} out of order or not once each"
        );
    }
    Ok(())
}

/// [`through_in_order`] through one host ordered by `order_by`, and
/// nothing more came out.
async fn in_order(
    url: &str,
    queue: &str,
    out: &str,
    order_by: &str,
    keys: u32,
    per_key: u32,
) -> anyhow::Result<()> {
    let mut client = Client::connect(url).await?;
    let host = TestHost::start(url, &[ordered(queue, order_by, out, &["credit = 256"])]).await?;
    through_in_order(&mut client, queue, out, keys, per_key).await?;
    // Nothing more came out: no duplicates.
    let marker = format!("{out}.marker");
    client.publish(out, TestMessage::new(&marker, "x")).await?;
    assert_eq!(
        take(&mut client, out, 1).await?,
        [marker],
        "{out} held more"
    );
    host.stop().await?;
    client.close().await;
    println!(
        "ordered by {order_by}: {keys} keys x {per_key}, concurrency 16: every key in order, once"
    );
    Ok(())
}

/// O10 on a broker whose queues need no declaring: 100 keys of 100.
async fn ten_thousand_in_order(url: &str, order_by: &str) -> anyhow::Result<()> {
    let queue = unique("ordered");
    in_order(url, &queue, &format!("{queue}.out"), order_by, 100, 100).await
}

#[tokio::test]
async fn ten_thousand_messages_over_a_hundred_keys_stay_in_order_per_key_on_artemis()
-> anyhow::Result<()> {
    ten_thousand_in_order(&artemis_url(), "group-id").await
}

#[tokio::test]
async fn ten_thousand_messages_over_a_hundred_keys_stay_in_order_per_key_on_rabbitmq4()
-> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let (queue, out) = (unique("ordered"), unique("ordered-out"));
    declare(&queue, "quorum", "").await?;
    declare(&out, "classic", "").await?;
    let result = in_order(
        &rabbitmq4_url(),
        &format!("/queues/{queue}"),
        &format!("/queues/{out}"),
        "property:key",
        100,
        100,
    )
    .await;
    delete(&queue).await?;
    delete(&out).await?;
    result
}

#[tokio::test]
async fn ten_thousand_messages_over_a_hundred_keys_stay_in_order_per_key_on_activemq()
-> anyhow::Result<()> {
    ten_thousand_in_order(&activemq_url(), "group-id").await
}

#[tokio::test]
async fn ten_thousand_messages_over_a_hundred_keys_stay_in_order_per_key_on_broker_j()
-> anyhow::Result<()> {
    ten_thousand_in_order(&qpid_url(), "property:key").await
}

/// Two hosts on one queue ordered by group-id, 20 keys: the broker's
/// message groups give each key to one of them, so no key is ever in both;
/// and each key's messages come out in order.
async fn two_hosts(url: &str) -> anyhow::Result<()> {
    let queue = unique("ordered-two");
    let out = format!("{queue}.out");
    let (keys, per_key) = (20, 20);
    let mount = ordered(&queue, "group-id", &out, &["concurrency = 4"]);
    // Each config has a container-id of its own.
    let mut hosts = Vec::new();
    for _ in 0..2 {
        hosts.push(TestHost::start(url, std::slice::from_ref(&mount)).await?);
    }
    let mut client = Client::connect(url).await?;
    through_in_order(&mut client, &queue, &out, keys, per_key).await?;
    let mut owners: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, host) in hosts.iter_mut().enumerate() {
        for handled in host.handled_so_far() {
            let id = handled.message_id.unwrap_or_default();
            let key = id.split_once('.').map_or(id.clone(), |(k, _)| k.to_owned());
            let hosts = owners.entry(key).or_default();
            if !hosts.contains(&i) {
                hosts.push(i);
            }
        }
    }
    let shared: Vec<_> = owners.iter().filter(|(_, h)| h.len() > 1).collect();
    assert!(shared.is_empty(), "keys handled by both hosts: {shared:?}");
    let by_a = owners.values().filter(|h| h == &&[0]).count();
    assert!(
        by_a > 0 && by_a < keys as usize,
        "one host took every key: {owners:?}"
    );
    for host in hosts {
        host.stop().await?;
    }
    client.close().await;
    println!(
        "two hosts, {keys} keys x {per_key}: {by_a} keys in one, {} in the other, none in both, every key in order",
        keys as usize - by_a
    );
    Ok(())
}

#[tokio::test]
async fn two_hosts_never_share_a_key_on_artemis() -> anyhow::Result<()> {
    two_hosts(&artemis_url()).await
}

#[tokio::test]
async fn two_hosts_never_share_a_key_on_activemq() -> anyhow::Result<()> {
    two_hosts(&activemq_url()).await
}

/// Two `wharf run` processes on one queue ordered by group-id, 20 keys of
/// 30; one is SIGKILLed once it has settled a fifth of them. Every message
/// comes out at least once (what the killed host handled but had not
/// settled comes out again), and the survivor handles each key's messages
/// in published order.
async fn two_hosts_one_killed(url: &str) -> anyhow::Result<()> {
    let queue = unique("ordered-kill");
    let out = format!("{queue}.out");
    let (keys, per_key) = (20u32, 30u32);
    let total = (keys * per_key) as usize;
    let mount = ordered(&queue, "group-id", &out, &["concurrency = 4"]);
    let mut client = Client::connect(url).await?;
    let mut messages = Vec::new();
    for seq in 0..per_key {
        for k in 0..keys {
            let script = format!("*:send={out},busy={}", 2 + spread(seq * keys + k, 4));
            messages.push(keyed(&format!("k{k}"), seq, &script).build());
        }
    }
    let mut watch = client.watch(&out).await?;
    // Two configs: two container-ids.
    let mut killed =
        WharfProcess::start_config(&config_text(url, std::slice::from_ref(&mount))).await?;
    let mut survivor =
        WharfProcess::start_config(&config_text(url, std::slice::from_ref(&mount))).await?;
    let by_killed = killed.collect_handled();
    let by_survivor = survivor.collect_handled();
    client.publish_many(&queue, messages).await?;
    let deadline = tokio::time::Instant::now() + crate::DEADLINE;
    while by_killed.lock().expect("log").len() + by_survivor.lock().expect("log").len() < total / 5
    {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "too little handled");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    killed.child.kill().await?;
    let settled_by_killed = by_killed.lock().expect("log").len();
    let survivor_before = by_survivor.lock().expect("log").len();
    let mut outputs: BTreeMap<String, usize> = BTreeMap::new();
    while outputs.len() < total {
        let (_, message) = watch
            .next()
            .await
            .map_err(|e| e.context(format!("{} of {total} outputs read", outputs.len())))?;
        *outputs
            .entry(String::from_utf8(body_bytes(&message))?)
            .or_default() += 1;
    }
    // A stop settles what the survivor holds; what it had not taken stays
    // on the queue. Then every duplicate is on `out` before the marker.
    crate::process::signal(&survivor, "-TERM").await?;
    let _ = tokio::time::timeout(crate::DEADLINE, survivor.child.wait()).await;
    let left = take_all(&mut client, &queue).await?;
    let marker = format!("{out}.marker");
    client
        .publish(&out, TestMessage::new(&marker, &marker))
        .await?;
    loop {
        let (_, message) = watch.next().await?;
        let body = String::from_utf8(body_bytes(&message))?;
        if body == marker {
            break;
        }
        *outputs.entry(body).or_default() += 1;
    }
    watch.close().await;
    let duplicated: usize = outputs.values().map(|n| n - 1).sum();
    let survived = by_survivor.lock().expect("log").clone();
    let mut by_key: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for id in &survived {
        if let Some((key, seq)) = id.split_once('.') {
            by_key.entry(key).or_default().push(seq.parse()?);
        }
    }
    for (key, seqs) in &by_key {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "the survivor handled key {key} out of order: {seqs:?}"
        );
    }
    client.close().await;
    println!(
        "two hosts, one SIGKILLed, {keys} keys x {per_key}: sent {total}, settled by the killed host {settled_by_killed} (logged before the kill), by the survivor {survivor_before} before it and {} in all, left on the queue {left}, outputs {}, duplicated {duplicated}, lost 0, the survivor's every key in order",
        survived.len(),
        outputs.len(),
    );
    Ok(())
}

/// Reads and accepts what `queue` holds; how many there were.
async fn take_all(client: &mut Client, queue: &str) -> anyhow::Result<usize> {
    let marker = format!("{queue}.marker");
    client
        .publish(queue, TestMessage::new(&marker, &marker))
        .await?;
    let mut watch = client.watch(queue).await?;
    let mut left = 0;
    loop {
        let (_, message) = watch.next().await?;
        if body_bytes(&message) == marker.as_bytes() {
            break;
        }
        left += 1;
    }
    watch.close().await;
    Ok(left)
}

#[tokio::test]
async fn two_hosts_one_killed_lose_nothing_and_keep_order_on_artemis() -> anyhow::Result<()> {
    two_hosts_one_killed(&artemis_url()).await
}

#[tokio::test]
async fn two_hosts_one_killed_lose_nothing_and_keep_order_on_activemq() -> anyhow::Result<()> {
    two_hosts_one_killed(&activemq_url()).await
}

/// What became of each attempt of each delivery, in the order the host
/// told it: `(id, attempt, plan)`.
type Told = Vec<(String, u32, Plan)>;

/// Publishes `keys` keys of `per_key` messages, of which key `k0`'s first
/// one runs `head`; the mount gives up after 3 attempts. Returns the
/// attempts as the host told them, once every delivery is settled.
async fn a_failing_head(
    head: &str,
    extra: &[&str],
    keys: u32,
    per_key: u32,
) -> anyhow::Result<Told> {
    let url = artemis_url();
    let queue = unique("ordered-head");
    let (out, dlq) = (format!("{queue}.out"), format!("{queue}.dlq"));
    let mut lines = vec![
        "max_attempts = 3".to_owned(),
        format!("dead_letter = \"{dlq}\""),
    ];
    lines.extend(extra.iter().map(|l| (*l).to_owned()));
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let mut client = Client::connect(&url).await?;
    let mut host = TestHost::start(&url, &[ordered(&queue, "property:key", &out, &lines)]).await?;
    let mut messages = Vec::new();
    for seq in 0..per_key {
        for k in 0..keys {
            let script = if (k, seq) == (0, 0) {
                head.to_owned()
            } else {
                format!("*:send={out},ack")
            };
            messages.push(keyed(&format!("k{k}"), seq, &script).build());
        }
    }
    client.publish_many(&queue, messages).await?;
    let mut told = Told::new();
    let mut settled = 0;
    while settled < keys * per_key {
        let Handled {
            message_id,
            attempt,
            plan,
            ..
        } = host
            .next(|e| match e {
                Event::Handled(h) => Some(h.clone()),
                _ => None,
            })
            .await?;
        if !matches!(plan, Plan::RunAgain { .. }) {
            settled += 1;
        }
        told.push((message_id.unwrap_or_default(), attempt, plan));
    }
    assert_eq!(
        take(&mut client, &dlq, 1).await?,
        ["k0.0"],
        "the head is dead-lettered"
    );
    host.stop().await?;
    client.close().await;
    Ok(told)
}

/// The checks every failing head must pass: the head ran 3 times and was
/// dead-lettered; its key's later deliveries ran after it, in order, once
/// each; every other key's ran in order too. Returns how many deliveries
/// of other keys were settled while the head held its key.
fn key_held(told: &Told, keys: u32, per_key: u32) -> usize {
    let head: Vec<_> = told.iter().filter(|(id, ..)| id == "k0.0").collect();
    let attempts: Vec<u32> = head.iter().map(|(_, a, _)| *a).collect();
    assert_eq!(attempts, [1, 2, 3], "{head:?}");
    assert!(
        matches!(head[0].2, Plan::RunAgain { .. }) && matches!(head[1].2, Plan::RunAgain { .. })
    );
    assert_eq!(head[2].2.publish(), Some(Publish::DeadLetter), "{head:?}");
    let position = |id: &str| told.iter().position(|(i, ..)| i == id);
    let first = position("k0.0").expect("head told");
    let last = told
        .iter()
        .rposition(|(i, ..)| i == "k0.0")
        .expect("head told");
    let mut by_key: HashMap<&str, Vec<u32>> = HashMap::new();
    for (id, _, plan) in told {
        if matches!(plan, Plan::RunAgain { .. }) {
            continue;
        }
        let (key, seq) = id.split_once('.').expect("KEY.SEQ");
        by_key
            .entry(key)
            .or_default()
            .push(seq.parse().expect("a number"));
    }
    let expected: Vec<u32> = (0..per_key).collect();
    assert_eq!(by_key.len(), keys as usize);
    for (key, sequence) in &by_key {
        assert_eq!(sequence, &expected, "key {key}");
    }
    // Nothing of the held key between its head's first and last attempts.
    assert!(
        told[first..last]
            .iter()
            .all(|(id, ..)| id == "k0.0" || !id.starts_with("k0.")),
        "a later delivery of k0 overtook its head"
    );
    told[first..last]
        .iter()
        .filter(|(id, ..)| !id.starts_with("k0."))
        .count()
}

#[tokio::test]
async fn a_head_retried_to_its_limit_holds_only_its_own_key_on_artemis() -> anyhow::Result<()> {
    let (keys, per_key) = (10, 10);
    for (head, extra) in [
        ("*:retry", &[][..]),
        ("*:trap", &[][..]),
        ("*:spin", &["timeout = \"300ms\""][..]),
    ] {
        let told = a_failing_head(head, extra, keys, per_key).await?;
        let others = key_held(&told, keys, per_key);
        println!(
            "head `{head}`: 3 attempts in place, dead-lettered; {others} deliveries of other keys settled meanwhile"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_head_retried_after_a_delay_holds_its_key_while_the_others_finish_on_artemis()
-> anyhow::Result<()> {
    let (keys, per_key) = (10, 10);
    // Two waits of 3 s: long enough for the other 90 to pass.
    let told = a_failing_head("*:after=3000", &[], keys, per_key).await?;
    let others = key_held(&told, keys, per_key);
    assert_eq!(
        others,
        ((keys - 1) * per_key) as usize,
        "the other keys waited for k0"
    );
    println!(
        "head `retry-after 3s`: held its key 6 s; all {others} deliveries of the other keys settled meanwhile"
    );
    Ok(())
}

#[tokio::test]
async fn at_max_keys_the_mount_takes_no_more_until_a_key_is_done_on_artemis() -> anyhow::Result<()>
{
    let url = artemis_url();
    let queue = unique("ordered-keys");
    let out = format!("{queue}.out");
    let (keys, per_key, max_keys) = (50, 4, 4);
    let mount = ordered(
        &queue,
        "property:key",
        &out,
        &[&format!("max_keys = {max_keys}")],
    );
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    let mut messages = Vec::new();
    for k in 0..keys {
        for seq in 0..per_key {
            messages.push(keyed(&format!("k{k}"), seq, &format!("*:send={out},busy=5")).build());
        }
    }
    client.publish_many(&queue, messages).await?;
    // Handlers running at once, from the host's own account: 16 may run,
    // but no more keys than `max_keys` are taken, one delivery each.
    let most = host.most_at_once((keys * per_key) as usize).await?;
    assert!(most <= max_keys as usize, "{most} handlers ran at once");
    assert!(most > 1, "keys ran one after another: {most}");
    let bodies = take(&mut client, &out, (keys * per_key) as usize).await?;
    assert_eq!(bodies.len(), (keys * per_key) as usize);
    host.stop().await?;
    client.close().await;
    println!(
        "max_keys {max_keys}, concurrency 16: at most {most} handlers at once, all {} handled",
        keys * per_key
    );
    Ok(())
}

#[tokio::test]
async fn a_stop_leaves_a_held_key_to_the_broker_in_order_on_artemis() -> anyhow::Result<()> {
    let url = artemis_url();
    let queue = unique("ordered-stop");
    let out = format!("{queue}.out");
    let (keys, per_key) = (5, 4);
    let mount = ordered(&queue, "property:key", &out, &[]);
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    let mut messages = Vec::new();
    for seq in 0..per_key {
        for k in 0..keys {
            // k0's head waits a minute to run again: the stop comes first.
            let script = if (k, seq) == (0, 0) {
                "1:after=60000".to_owned()
            } else {
                format!("*:send={out},ack")
            };
            messages.push(keyed(&format!("k{k}"), seq, &script).build());
        }
    }
    client.publish_many(&queue, messages).await?;
    let mut settled = 0;
    while settled < (keys - 1) * per_key {
        let handled = host
            .next(|e| match e {
                Event::Handled(h) => Some(h.clone()),
                _ => None,
            })
            .await?;
        if handled.disposition.is_some() {
            settled += 1;
        }
    }
    assert!(
        !host.seen(|e| matches!(e, Event::Started { message_id: Some(id), .. } if id == "k0.1"))
    );
    host.stop().await?;
    // k0's four are back on the queue, its head first, and nothing of k0
    // was handled.
    let left = take(&mut client, &queue, per_key as usize).await?;
    let expected: Vec<String> = (0..per_key).map(|seq| format!("k0.{seq}")).collect();
    assert_eq!(left, expected);
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn keys_a_publisher_chooses_are_only_keys_on_artemis() -> anyhow::Result<()> {
    // Keys of every shape a publisher may send: huge, binary, compound,
    // null, escapes; a group-id of 60,000 bytes; and none. Each key's three
    // messages are handled in order, and the keyless ones too.
    let url = artemis_url();
    let queue = unique("ordered-hostile");
    let out = format!("{queue}.out");
    let mut by_property = ordered(&queue, "property:key", &out, &[]);
    by_property.name = "property".into();
    let groups = format!("{queue}.groups");
    let mut by_group = ordered(&groups, "group-id", &out, &[]);
    by_group.name = "group".into();
    let host = TestHost::start(&url, &[by_property, by_group]).await?;
    let keys: Vec<(&str, Value)> = vec![
        ("huge", Value::String("k".repeat(50_000))),
        ("binary", Value::Binary(vec![0xff; 10_000].into())),
        (
            "list",
            Value::List(vec![Value::Long(1), Value::String("two".into())]),
        ),
        ("null", Value::Null),
        ("escapes", Value::String("\u{1b}[2J\r\n\0key".into())),
        ("text7", Value::String("7".into())),
        ("long7", Value::Long(7)),
    ];
    let per_key = 3;
    let mut client = Client::connect(&url).await?;
    let mut messages = Vec::new();
    let mut group_messages = Vec::new();
    for seq in 0..per_key {
        for (name, value) in &keys {
            let mut message = TestMessage::new(&format!("{name}.{seq}"), &format!("{name}.{seq}"))
                .script(&format!("*:send={out},ack"))
                .build();
            if let Some(properties) = &mut message.application_properties {
                properties.push(("key".to_owned(), value.clone()));
            }
            messages.push(message);
        }
        messages.push(
            TestMessage::new(&format!("none.{seq}"), &format!("none.{seq}"))
                .script(&format!("*:send={out},ack"))
                .build(),
        );
        for (name, group) in [
            ("group-huge", "g".repeat(60_000)),
            ("group-odd", "\u{7f}\n\u{200b}".to_owned()),
        ] {
            group_messages.push(
                TestMessage::new(&format!("{name}.{seq}"), &format!("{name}.{seq}"))
                    .group(&group, seq)
                    .script(&format!("*:send={out},ack"))
                    .build(),
            );
        }
    }
    client.publish_many(&queue, messages).await?;
    client.publish_many(&groups, group_messages).await?;
    let names = keys.len() + 3;
    let mut watch = client.watch(&out).await?;
    let mut seen: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for _ in 0..names * per_key as usize {
        let (_, message) = watch
            .next()
            .await
            .map_err(|e| anyhow::anyhow!("{e}: so far {seen:?}"))?;
        let body = String::from_utf8(body_bytes(&message))?;
        let (name, seq) = body
            .rsplit_once('.')
            .ok_or_else(|| anyhow::anyhow!("not NAME.SEQ: {body:?}"))?;
        seen.entry(name.to_owned()).or_default().push(seq.parse()?);
    }
    watch.close().await;
    assert_eq!(seen.len(), names, "{seen:?}");
    for (name, sequence) in &seen {
        if name != "none" {
            assert_eq!(sequence, &[0, 1, 2], "{name} out of order");
        }
    }
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// What `wharf check --verbose --connect` prints for a mount on `address`
/// at `url` ordered by `order_by`.
async fn checked(url: &str, address: &str, order_by: &str) -> anyhow::Result<String> {
    let mount = ordered(address, order_by, &format!("{address}.out"), &[]);
    let config = crate::process::TempFile::new("toml", &config_text(url, &[mount]))?;
    let output = tokio::process::Command::new(crate::process::wharf_binary())
        .args(["check", "--verbose", "--connect", "--config"])
        .arg(&config.0)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(output.status.success(), "{stdout}");
    Ok(stdout)
}

#[tokio::test]
async fn wharf_check_says_what_order_each_broker_keeps_across_replicas() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let rabbit_queue = unique("ordered-check");
    declare(&rabbit_queue, "quorum", "").await?;
    let cases = [
        (
            artemis_url(),
            unique("ordered-check"),
            "group-id",
            "order kept across replicas too: the broker's message groups",
        ),
        (
            activemq_url(),
            unique("ordered-check"),
            "property:key",
            "order kept within this host only: the broker groups by group-id, not by this property",
        ),
        (
            rabbitmq4_url(),
            format!("/queues/{rabbit_queue}"),
            "group-id",
            "order kept within this host only: RabbitMQ has no message groups",
        ),
        (
            qpid_url(),
            unique("ordered-check"),
            "group-id",
            "order kept within this host only: wharf relies on no message groups there",
        ),
    ];
    let mut result = Ok(());
    for (url, address, order_by, says) in cases {
        let stdout = checked(&url, &address, order_by).await?;
        if !stdout.contains(says) || !stdout.contains(&format!("ordered by {order_by}")) {
            result = Err(anyhow::anyhow!("`{says}` not in:\n{stdout}"));
        }
    }
    delete(&rabbit_queue).await?;
    result
}

#[tokio::test]
async fn an_output_refused_in_a_transaction_runs_its_delivery_again_in_place_on_artemis()
-> anyhow::Result<()> {
    let (q, out, full) = (
        unique("ordered-txn"),
        unique("ordered-txn-out"),
        unique("ordered-txn-full"),
    );
    let mut client = Client::connect(&artemis_url()).await?;
    // An output there is given up on, and its transaction rolled back.
    crate::outbox::fill(&mut client, &full).await?;
    let (keys, per_key) = (4u32, 5u32);
    let mut messages = Vec::new();
    for seq in 0..per_key {
        for k in 0..keys {
            // k0's second message sends where the broker refuses it at
            // first, and where it takes it when run again.
            let script = if (k, seq) == (0, 1) {
                format!("1:send={full},ack *:send={out},ack")
            } else {
                format!("*:send={out},ack")
            };
            messages.push(keyed(&format!("k{k}"), seq, &script).build());
        }
    }
    let mount = MountToml::new("m", SCRIPT, &q)
        .with("order_by = \"group-id\"\nconcurrency = 8")
        .with("[tenant.mount.grants]")
        .with(&format!("send = [\"{out}\", \"{full}\"]"));
    let config = crate::outbox::giving_up_on_publishes_after_2s(&[mount])?;
    let mut host = TestHost::start_config(config).await?;
    assert!(crate::outbox::commits_in_transactions(&mut host));
    let watch = client.watch(&out).await?;
    client.publish_many(&q, messages).await?;
    let refused = host.handled("k0.1").await?;
    assert!(
        refused.error.is_some() && matches!(refused.instead, Some(Plan::RunAgain { .. })),
        "{refused:?}"
    );
    let again = host.handled("k0.1").await?;
    assert_eq!(again.attempt, 2, "{again:?}");
    outputs_in_order(watch, keys, per_key).await?;
    // Nothing more on `out`, and the refused output was rolled back.
    crate::outbox::artemis_count(&mut client, &out, 0).await?;
    crate::outbox::artemis_count(&mut client, &full, 1).await?;
    crate::outbox::artemis_count(&mut client, &q, 0).await?;
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// The peak resident memory of a `wharf run` ordered by group-id with
/// `max_keys = 32` that works through `n` messages of 16 KB waiting on a
/// queue, each its own key: once at `max_keys` it takes nothing more off
/// the link until a key is done, so the backlog stays on the broker.
async fn peak_with_backlog(url: &str, n: usize) -> anyhow::Result<u64> {
    let queue = unique("ordered-rss");
    let body = "x".repeat(16 * 1024);
    let messages = (0..n).map(|i| {
        let id = format!("{queue}.{i}");
        TestMessage::new(&id, &body)
            .header(0)
            .group(&id, 0)
            .script("*:ack")
            .build()
    });
    let mut client = Client::connect(url).await?;
    client.publish_many(&queue, messages).await?;
    let mount = MountToml::new("m", SCRIPT, &queue)
        .with("order_by = \"group-id\"\nmax_keys = 32\nconcurrency = 4");
    let mut wharf = WharfProcess::start_config(&config_text(url, &[mount])).await?;
    let handled = wharf.collect_handled();
    let deadline = tokio::time::Instant::now() + crate::DEADLINE * 4;
    while handled.lock().expect("log").len() < n {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} handled",
            handled.lock().expect("log").len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let peak = crate::process::peak_resident(&wharf)?;
    crate::process::signal(&wharf, "-TERM").await?;
    let _ = tokio::time::timeout(crate::DEADLINE, wharf.child.wait()).await;
    client.close().await;
    Ok(peak)
}

#[tokio::test]
async fn at_max_keys_a_backlog_eight_times_larger_costs_no_more_memory_on_artemis()
-> anyhow::Result<()> {
    let url = artemis_url();
    let small = peak_with_backlog(&url, 500).await?;
    let large = peak_with_backlog(&url, 4_000).await?;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!(
        "max_keys = 32, each message its own key, 16 KB: peak RSS {:.1} MiB with 500 waiting (8 MB), {:.1} MiB with 4,000 (64 MB)",
        mib(small),
        mib(large)
    );
    // Holding the larger backlog's extra 3,500 messages would take 56 MB.
    assert!(
        large < small + 12 * 1024 * 1024,
        "peak RSS grew with the backlog: {:.1} MiB to {:.1} MiB",
        mib(small),
        mib(large)
    );
    Ok(())
}
