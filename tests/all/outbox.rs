//! Handlers that publish: outputs go out if and only if their input is
//! acknowledged, the mount's grants and limits hold, replies find their
//! requester, and a host killed mid-stream leaves every accepted input with
//! its outputs: exactly once on Artemis's transaction path, once each on its
//! confirm path (the broker drops duplicates by id), at least once on
//! RabbitMQ 4.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use wharf::events::Event;
use wharf_core::config::Config;
use wharf_core::settlement::{Disposition, Outcome};

use crate::client::{Client, TestMessage, body_bytes, correlation_id, input_of_output, message_id};
use crate::faults::rabbitmq4_ctl;
use crate::process::WharfProcess;
use crate::{
    DEADLINE, MountToml, TenantToml, TestHost, artemis_url, config_text, rabbitmq4_exclusive,
    rabbitmq4_shared, rabbitmq4_url, start_with_client, tenants_text, unique, wait_for_count,
};
use wharf_tests::rabbitmq4::{declare, delete};

const SCRIPT: &str = "fixture_script";

/// A mount of the script fixture on `address` that may send to `send`.
fn mount(address: &str, send: &[&str], extra: &[&str]) -> MountToml {
    let mut mount = MountToml::new("m", SCRIPT, address);
    for line in extra {
        mount = mount.with(line);
    }
    let send: Vec<String> = send.iter().map(|a| format!("\"{a}\"")).collect();
    mount
        .with("[tenant.mount.grants]")
        .with(&format!("send = [{}]", send.join(", ")))
}

/// Waits for the last handling of `id`: the one that settled it for good.
async fn settled(host: &mut TestHost, id: &str, attempt: u32) -> anyhow::Result<Disposition> {
    loop {
        let handled = host.handled(id).await?;
        if handled.attempt >= attempt {
            return handled
                .disposition
                .ok_or_else(|| anyhow::anyhow!("{id} was not settled: {handled:?}"));
        }
    }
}

pub(crate) async fn artemis_count(
    client: &mut Client,
    queue: &str,
    expected: u64,
) -> anyhow::Result<()> {
    wait_for_count(queue, expected, async || client.artemis_count(queue).await).await
}

/// Whether the host's mount commits outputs in transactions.
pub(crate) fn commits_in_transactions(host: &mut TestHost) -> bool {
    host.seen(|e| {
        matches!(
            e,
            Event::MountReady {
                transactions: true,
                ..
            }
        )
    })
}

#[tokio::test]
async fn outputs_are_published_only_when_the_input_is_acked_in_a_transaction_on_artemis()
-> anyhow::Result<()> {
    outputs_only_with_an_ack(None).await
}

#[tokio::test]
async fn outputs_are_published_only_when_the_input_is_acked_when_confirmed_on_artemis()
-> anyhow::Result<()> {
    outputs_only_with_an_ack(Some("confirm")).await
}

/// Every outcome after a send, on Artemis, with outputs committed the way
/// `outputs` says (by default in transactions).
async fn outputs_only_with_an_ack(outputs: Option<&str>) -> anyhow::Result<()> {
    let (q, out, leak) = (
        unique("outbox"),
        unique("outbox-out"),
        unique("outbox-leak"),
    );
    let mut extra = vec![
        "max_attempts = 2".to_owned(),
        "retry = \"modified\"".to_owned(),
    ];
    extra.extend(outputs.map(|path| format!("outputs = \"{path}\"")));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let (mut host, mut client) =
        start_with_client(&artemis_url(), &[mount(&q, &[&out, &leak], &extra)]).await?;
    assert_eq!(commits_in_transactions(&mut host), outputs.is_none());
    // What every input publishes before its outcome, to `leak` unless the
    // outcome is `ack`; then, when it is settled for good.
    let cases = [
        ("ack", format!("*:send={out},ack"), 1, Disposition::Accepted),
        (
            "retry",
            format!("1:send={leak},retry *:ack"),
            2,
            Disposition::Accepted,
        ),
        (
            "drop",
            format!("*:send={leak},drop"),
            1,
            Disposition::Rejected,
        ),
        (
            "trap",
            format!("*:send={leak},trap"),
            2,
            Disposition::Rejected,
        ),
        (
            "retry-after",
            format!("1:send={leak},after=50 *:ack"),
            2,
            Disposition::Accepted,
        ),
    ];
    for (name, script, _, _) in &cases {
        let id = format!("{q}.{name}");
        client
            .publish(&q, TestMessage::new(&id, "hi").header(0).script(script))
            .await?;
    }
    for (name, _, attempt, disposition) in &cases {
        let id = format!("{q}.{name}");
        assert_eq!(
            settled(&mut host, &id, *attempt).await?,
            *disposition,
            "{name}"
        );
    }
    // An output is accepted by the broker before its input is settled:
    // whatever leaked is on the queue by now.
    artemis_count(&mut client, &leak, 0).await?;
    artemis_count(&mut client, &out, 1).await?;
    let mut watch = client.watch(&out).await?;
    let (_, output) = watch.next().await?;
    let input = format!("{q}.ack");
    let output_id = message_id(&output).unwrap_or_default();
    assert_eq!(input_of_output(&output_id, 0), Some(input.as_str()));
    assert_eq!(body_bytes(&output), b"hi");
    assert!(output.header.as_ref().is_some_and(|h| h.durable), "durable");
    watch.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn the_handler_is_told_what_it_may_not_publish_and_nothing_of_it_goes_out()
-> anyhow::Result<()> {
    let (q, out, other) = (
        unique("outbox-err"),
        unique("outbox-err-out"),
        unique("nope"),
    );
    let (q2, replies) = (unique("outbox-noreply"), unique("outbox-replies"));
    let limited = mount(
        &q,
        &[&format!("{out}*")],
        &["max_outputs = 2", "max_output_bytes = 600"],
    )
    .with("reply = true");
    let mut without_reply = mount(&q2, &[], &[]);
    without_reply.name = "m2".into();
    let url = artemis_url();
    let (mut host, mut client) = start_with_client(&url, &[limited, without_reply]).await?;
    // The fixture acks only when the effect fails with the error named
    // after it; anything else drops the delivery.
    let cases = [
        (
            &q,
            "denied",
            format!("*:send={other},fails=denied,ack"),
            None,
        ),
        (
            &q,
            "too-many",
            format!("*:sends=2={out},send={out},fails=too-many,ack"),
            None,
        ),
        (
            &q,
            "too-large",
            format!("*:pad=700,send={out}.big,fails=too-large,ack"),
            None,
        ),
        (
            &q,
            "no-reply-to",
            "*:reply,fails=no-reply-to,ack".to_owned(),
            None,
        ),
        (
            &q2,
            "reply-denied",
            "*:reply,fails=denied,ack".to_owned(),
            Some(&replies),
        ),
    ];
    for (address, name, script, reply_to) in &cases {
        let mut message = TestMessage::new(&format!("{q}.{name}"), "x")
            .header(0)
            .script(script);
        if let Some(reply_to) = reply_to {
            message = message.reply_to(reply_to);
        }
        client.publish(address, message).await?;
    }
    for (_, name, _, _) in &cases {
        let handled = host.handled(&format!("{q}.{name}")).await?;
        assert_eq!(handled.outcome, Outcome::Ack, "{name}: {handled:?}");
        assert_eq!(handled.disposition, Some(Disposition::Accepted), "{name}");
    }
    // The two outputs within `max_outputs` went out with their ack; nothing
    // refused did.
    artemis_count(&mut client, &out, 2).await?;
    for nothing in [&other, &format!("{out}.big"), &replies] {
        artemis_count(&mut client, nothing, 0).await?;
    }
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// Sends two requests to a mount that replies and checks each reply's body
/// and correlation: the request's correlation-id, else its message-id.
async fn replies_find_their_requester(
    url: &str,
    requests: &str,
    replies: &str,
) -> anyhow::Result<()> {
    let mount = mount(requests, &[], &[]).with("reply = true");
    let (mut host, mut client) = start_with_client(url, &[mount]).await?;
    let mut watch = client.watch(replies).await?;
    let (with, without) = (unique("req"), unique("req"));
    client
        .publish(
            requests,
            TestMessage::new(&with, "ping")
                .script("*:reply,ack")
                .reply_to(replies)
                .correlation_id("conversation-1"),
        )
        .await?;
    client
        .publish(
            requests,
            TestMessage::new(&without, "pong")
                .script("*:reply,ack")
                .reply_to(replies),
        )
        .await?;
    let mut got = BTreeMap::new();
    for _ in 0..2 {
        let (_, reply) = watch.next().await?;
        got.insert(correlation_id(&reply), body_bytes(&reply));
    }
    assert_eq!(
        got.remove(&Some("conversation-1".to_owned())).as_deref(),
        Some(&b"re:ping"[..])
    );
    assert_eq!(
        got.remove(&Some(without.clone())).as_deref(),
        Some(&b"re:pong"[..])
    );
    for id in [&with, &without] {
        assert_eq!(
            host.handled(id).await?.disposition,
            Some(Disposition::Accepted)
        );
    }
    watch.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_reply_reaches_reply_to_with_the_request_s_correlation_on_artemis() -> anyhow::Result<()>
{
    replies_find_their_requester(&artemis_url(), &unique("rpc"), &unique("rpc-replies")).await
}

#[tokio::test]
async fn a_reply_reaches_reply_to_with_the_request_s_correlation_on_rabbitmq4() -> anyhow::Result<()>
{
    let _broker = rabbitmq4_shared().await;
    let (requests, replies) = (unique("rmq4-rpc"), unique("rmq4-rpc-replies"));
    declare(&requests, "quorum", "").await?;
    declare(&replies, "classic", "").await?;
    replies_find_their_requester(
        &rabbitmq4_url(),
        &format!("/queues/{requests}"),
        &format!("/queues/{replies}"),
    )
    .await?;
    delete(&requests).await?;
    delete(&replies).await
}

#[tokio::test]
async fn a_component_built_against_0_1_0_still_runs() -> anyhow::Result<()> {
    let q = unique("v0-1");
    let mount = MountToml::new("m", "fixture_v0_1", &q);
    let (mut host, mut client) = start_with_client(&artemis_url(), &[mount]).await?;
    client.publish(&q, TestMessage::new(&q, "v0.1")).await?;
    let handled = host.handled(&q).await?;
    assert_eq!(handled.outcome, Outcome::Ack, "{handled:?}");
    assert_eq!(handled.disposition, Some(Disposition::Accepted));
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// What the outputs of inputs a killed host worked on were.
pub(crate) struct Published {
    /// Outputs per input id.
    pub(crate) outputs: BTreeMap<String, usize>,
    /// How many carried Artemis's duplicate-detection property.
    pub(crate) with_duplicate_ids: usize,
}

/// Kills `wharf run` three times while it works through `n` inputs that
/// each publish one output (with `extra` lines in the mount), lets a last
/// host finish, then reads every output.
pub(crate) async fn killed_while_publishing(
    url: &str,
    input: &str,
    output: &str,
    n: usize,
    extra: &[&str],
) -> anyhow::Result<Published> {
    let ids: Vec<String> = (0..n).map(|i| format!("{input}.{i}")).collect();
    let mut client = Client::connect(url).await?;
    let script = format!("*:send={output},busy=3");
    client.publish_scripted(input, &ids, &script).await?;
    let mut lines = vec!["concurrency = 4"];
    lines.extend(extra);
    let text = config_text(
        url,
        &[mount(input, &[output], &lines).with("clocks = true")],
    );
    for round in 1..=3 {
        let mut wharf = WharfProcess::start_config(&text).await?;
        let handled = wharf.collect_handled();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while handled.lock().expect("log").len() < n / 6 {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "round {round}: too little handled"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        wharf.child.kill().await?;
    }
    let mut wharf = WharfProcess::start_config(&text).await?;
    // Read, so the log pipe never fills and stops the host.
    let _ = wharf.collect_handled();
    let mut watch = client.watch(output).await?;
    let mut outputs: BTreeMap<String, usize> = BTreeMap::new();
    let mut with_duplicate_ids = 0;
    while outputs.len() < n {
        let (_, message) = watch
            .next()
            .await
            .map_err(|e| e.context(format!("{} of {n} inputs' outputs read", outputs.len())))?;
        let id = message_id(&message).unwrap_or_default();
        let input_id = input_of_output(&id, 0)
            .ok_or_else(|| anyhow::anyhow!("output id {id:?} is not derived from its input"))?;
        *outputs.entry(input_id.to_owned()).or_default() += 1;
        let properties = message.application_properties.as_ref();
        if properties.is_some_and(|p| p.iter().any(|(key, _)| key == "_AMQ_DUPL_ID")) {
            with_duplicate_ids += 1;
        }
    }
    watch.close().await;
    crate::process::signal(&wharf, "-TERM").await?;
    let _ = tokio::time::timeout(DEADLINE, wharf.child.wait()).await;
    client.close().await;
    let missing: Vec<&String> = ids.iter().filter(|id| !outputs.contains_key(*id)).collect();
    anyhow::ensure!(missing.is_empty(), "inputs without outputs: {missing:?}");
    Ok(Published {
        outputs,
        with_duplicate_ids,
    })
}

/// On Artemis, every input accepted and exactly one output for each, the
/// way `extra` has the mount commit them (`path` names it).
async fn killed_on_artemis(extra: &[&str], path: &str) -> anyhow::Result<Published> {
    let url = artemis_url();
    let (input, output) = (unique("kill-out"), unique("kill-out-out"));
    let n = 600;
    let published = killed_while_publishing(&url, &input, &output, n, extra).await?;
    let mut client = Client::connect(&url).await?;
    // Every input was accepted and its one output is all the queue held.
    artemis_count(&mut client, &input, 0).await?;
    artemis_count(&mut client, &output, 0).await?;
    let duplicates: usize = published.outputs.values().map(|n| n - 1).sum();
    println!(
        "SIGKILL x3, Artemis ({path}): inputs {n}, accepted {n}, outputs {}, duplicated {duplicates}, lost 0, with _AMQ_DUPL_ID {}",
        published.outputs.len(),
        published.with_duplicate_ids,
    );
    assert_eq!(duplicates, 0, "{path}");
    client.close().await;
    Ok(published)
}

#[tokio::test]
async fn a_host_killed_mid_stream_commits_each_output_exactly_once_in_transactions_on_artemis()
-> anyhow::Result<()> {
    let published = killed_on_artemis(&[], "transaction path").await?;
    // Exactly once by the transactions alone: the broker had no id to
    // drop a duplicate by (only the confirm path gives outputs one).
    assert_eq!(published.with_duplicate_ids, 0);
    Ok(())
}

#[tokio::test]
async fn a_host_killed_mid_stream_publishes_each_output_once_when_confirmed_on_artemis()
-> anyhow::Result<()> {
    let confirm = ["outputs = \"confirm\""];
    let published = killed_on_artemis(&confirm, "confirm path, _AMQ_DUPL_ID").await?;
    assert_eq!(published.with_duplicate_ids, published.outputs.len());
    Ok(())
}

#[tokio::test]
async fn a_host_killed_mid_stream_loses_no_output_on_rabbitmq4() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let (input, output) = (unique("rmq4-kill-out"), unique("rmq4-kill-out-out"));
    declare(&input, "quorum", "").await?;
    declare(&output, "classic", "").await?;
    let n = 600;
    let published = killed_while_publishing(
        &rabbitmq4_url(),
        &format!("/queues/{input}"),
        &format!("/queues/{output}"),
        n,
        &[],
    )
    .await?;
    let duplicates: usize = published.outputs.values().map(|n| n - 1).sum();
    println!(
        "SIGKILL x3, RabbitMQ 4 (confirm path): inputs {n}, outputs {} distinct, duplicated {duplicates} (each with its first's message-id), lost 0",
        published.outputs.len()
    );
    delete(&input).await?;
    delete(&output).await
}

#[tokio::test]
async fn an_output_the_broker_refuses_keeps_its_input() -> anyhow::Result<()> {
    // RabbitMQ 4 refuses a link to a queue that does not exist: the input
    // is handed back, not accepted, and the mount's links stay up.
    let _broker = rabbitmq4_shared().await;
    let q = unique("rmq4-refused");
    declare(&q, "quorum", "").await?;
    let address = format!("/queues/{q}");
    let missing = format!("/queues/{}", unique("missing"));
    let (mut host, mut client) =
        start_with_client(&rabbitmq4_url(), &[mount(&address, &["/queues/*"], &[])]).await?;
    let id = unique("refused");
    client
        .publish(
            &address,
            TestMessage::new(&id, "x").script(&format!("1:send={missing},ack *:ack")),
        )
        .await?;
    let first = host.handled(&id).await?;
    assert_eq!(first.outcome, Outcome::Ack);
    assert!(first.error.is_some(), "{first:?}");
    assert_ne!(first.disposition, Some(Disposition::Accepted), "{first:?}");
    // Redelivered on the same links, it is acked without outputs.
    let second = host.handled(&id).await?;
    assert_eq!(second.attempt, 2);
    assert_eq!(
        second.disposition,
        Some(Disposition::Accepted),
        "{second:?}"
    );
    host.stop().await?;
    client.close().await;
    delete(&q).await
}

/// `wharf request` against the rpc example on the broker at `url`.
async fn request_to_the_rpc_example(url: &str, address: &str) -> anyhow::Result<()> {
    let mount = MountToml::new("rpc", "rpc", address)
        .with("[tenant.mount.grants]")
        .with("reply = true");
    let host = TestHost::start(url, &[mount]).await?;
    let output = tokio::process::Command::new(crate::process::wharf_binary())
        .args([
            "request",
            "--url",
            url,
            "--address",
            address,
            "--body",
            "world",
        ])
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "wharf request: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hello, world\n");
    host.stop().await
}

#[tokio::test]
async fn wharf_request_prints_the_reply_on_artemis() -> anyhow::Result<()> {
    request_to_the_rpc_example(&artemis_url(), &unique("rpc-example")).await
}

#[tokio::test]
async fn wharf_request_prints_the_reply_on_rabbitmq4() -> anyhow::Result<()> {
    let _broker = rabbitmq4_shared().await;
    let q = unique("rmq4-rpc-example");
    declare(&q, "quorum", "").await?;
    request_to_the_rpc_example(&rabbitmq4_url(), &format!("/queues/{q}")).await?;
    delete(&q).await
}

/// The first delivery handed to a handler, and whether another one was
/// handed to a handler before that first delivery was settled.
async fn overlapped(host: &mut TestHost) -> anyhow::Result<bool> {
    let first = host
        .next(|e| match e {
            Event::Started { message_id, .. } => Some(message_id.clone()),
            _ => None,
        })
        .await?;
    host.next(|e| match e {
        Event::Started { message_id, .. } if *message_id != first => Some(true),
        Event::Handled(h) if h.message_id == first => Some(false),
        _ => None,
    })
    .await
}

#[tokio::test]
async fn outputs_waiting_on_the_broker_hold_the_tenants_running_slot() -> anyhow::Result<()> {
    let _broker = rabbitmq4_exclusive().await;
    let url = rabbitmq4_url();
    let name = unique("held");
    let (q, out) = (format!("/queue/{name}"), format!("/queue/{name}.out"));
    let ids = [unique("held-a"), unique("held-b")];
    let mut client = Client::connect(&url).await?;
    for id in &ids {
        let message = TestMessage::new(id, "x").script(&format!("*:send={out},ack"));
        client.publish(&q, message).await?;
    }
    let tenant = TenantToml::new("t", vec![mount(&q, &[&out], &[])]).with("max_running = 1");
    let text =
        tenants_text(&url, "", &[tenant]).replacen("[host]", "publish_timeout = \"2s\"\n[host]", 1);
    let config = Config::parse(&text, Path::new("wharf.toml"))?;
    // The memory alarm: the broker takes no message from any publisher, so
    // the first delivery's output waits until the publish times out.
    rabbitmq4_ctl(&["set_vm_memory_high_watermark", "0"]).await?;
    let blocked = async {
        let mut host = TestHost::start_config(config).await?;
        let overlapped = overlapped(&mut host).await?;
        anyhow::Ok((host, overlapped))
    }
    .await;
    rabbitmq4_ctl(&["set_vm_memory_high_watermark", "0.4"]).await?;
    let (mut host, overlapped) = blocked?;
    assert!(
        !overlapped,
        "a delivery started while another's outputs were still unconfirmed"
    );
    // Once the broker takes messages again, both go through.
    for id in &ids {
        while host.handled(id).await?.disposition != Some(Disposition::Accepted) {}
    }
    host.stop().await?;
    let mut watch = client.watch(&out).await?;
    for _ in &ids {
        watch.next().await?;
    }
    watch.close().await;
    client.close().await;
    Ok(())
}

/// Makes the Artemis address `address` full once it holds one message,
/// and puts one there: the broker then gives no credit for it, and a host
/// gives up on an output there after its `publish_timeout`.
pub(crate) async fn fill(client: &mut Client, address: &str) -> anyhow::Result<()> {
    client
        .artemis_address_settings(
            address,
            r#"{"maxSizeBytes":2,"pageSizeBytes":1,"addressFullMessagePolicy":"FAIL"}"#,
        )
        .await?;
    client
        .publish(address, TestMessage::new("filler", "x"))
        .await
}

/// The config of `mounts` on Artemis whose host gives up on a publish
/// after 2 s (`publish_timeout`).
pub(crate) fn giving_up_on_publishes_after_2s(mounts: &[MountToml]) -> anyhow::Result<Config> {
    let text = config_text(&artemis_url(), mounts).replacen(
        "[broker]\n",
        "[broker]\npublish_timeout = \"2s\"\n",
        1,
    );
    Ok(Config::parse(&text, Path::new("test.toml"))?)
}

#[tokio::test]
async fn an_output_blocked_in_a_shared_transaction_costs_the_other_deliveries_nothing()
-> anyhow::Result<()> {
    let (q, out, full) = (
        unique("txn-batch"),
        unique("txn-batch-out"),
        unique("txn-full"),
    );
    let mut client = Client::connect(&artemis_url()).await?;
    fill(&mut client, &full).await?;
    // Waiting together, the deliveries share transactions.
    let good: Vec<String> = (0..20).map(|i| format!("{q}.{i}")).collect();
    client
        .publish_scripted(&q, &good, &format!("*:send={out},ack"))
        .await?;
    let bad = format!("{q}.bad");
    client
        .publish(
            &q,
            TestMessage::new(&bad, "x")
                .header(0)
                .script(&format!("1:send={full},ack *:ack")),
        )
        .await?;
    let mounts = [mount(&q, &[&out, &full], &["concurrency = 32"])];
    let mut host = TestHost::start_config(giving_up_on_publishes_after_2s(&mounts)?).await?;
    assert!(commits_in_transactions(&mut host));
    for id in &good {
        let handled = host.handled(id).await?;
        assert_eq!(
            (
                handled.attempt,
                handled.disposition,
                handled.error.as_deref()
            ),
            (1, Some(Disposition::Accepted), None),
            "{id}"
        );
    }
    let refused = host.handled(&bad).await?;
    assert_eq!(refused.attempt, 1);
    assert!(refused.error.is_some(), "{refused:?}");
    assert_eq!(refused.disposition, Some(Disposition::Modified));
    let again = host.handled(&bad).await?;
    assert_eq!(
        (again.attempt, again.disposition),
        (2, Some(Disposition::Accepted))
    );
    artemis_count(&mut client, &out, good.len() as u64).await?;
    artemis_count(&mut client, &full, 1).await?;
    host.stop().await?;
    client.close().await;
    Ok(())
}
