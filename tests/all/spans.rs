//! Spans exported over OTLP to a collector the test runs: one message's
//! attempts, copy and dead letter read as one trace; outputs and replies
//! carry the context of their `send` spans; sampling follows the
//! publisher; a collector that is down costs only dropped spans.

use std::time::Duration;

use fe2o3_amqp::types::primitives::SimpleValue;
use wharf_core::trace::TRACEPARENT;

use crate::client::{Client, TestMessage, trace_context as carried};
use crate::collector::{Collector, ReceivedSpan};
use crate::process::WharfProcess;
use crate::{MountToml, TestHost, artemis_url, unique};

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PUBLISHER_SPAN: &str = "b7ad6b7169203331";
const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
/// Long enough for a loaded machine; the test ends as soon as they come.
const SPANS_WITHIN: Duration = Duration::from_secs(30);

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_messages_attempts_copy_and_dead_letter_are_one_trace() -> anyhow::Result<()> {
    let collector = Collector::start().await?;
    let q = unique("spans");
    let dead = format!("{q}.dead");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with(&format!("dead_letter = \"{dead}\"\nmax_attempts = 4"));
    let mut host = TestHost::start_traced(
        vec![mount],
        &format!(
            "endpoint = \"{}\"\nservice_name = \"orders\"",
            collector.http
        ),
    )
    .await?;
    let mut client = Client::connect(&artemis_url()).await?;
    let mut dead_letters = client.watch(&dead).await?;
    let id = format!("{q}.1");
    client
        .publish(
            &q,
            TestMessage::new(&id, "four attempts")
                .script("1:retry 2:trap 3:after=50 *:retry")
                .correlation_id("conversation-7")
                .property(TRACEPARENT, SimpleValue::String(PARENT.into())),
        )
        .await?;
    let (_, dead_letter) = dead_letters.next().await?;
    let process_name = format!("process {q}");
    let spans = collector
        .wait_until(SPANS_WITHIN, |spans| {
            named(spans, &process_name).len() == 4
                && named(spans, &format!("send {dead}")).len() == 1
                && named(spans, &format!("settle {q}")).len() == 4
        })
        .await?;
    println!("{}", crate::collector::tree(&spans));
    assert!(spans.iter().all(|s| s.trace_id == TRACE), "one trace");
    assert!(spans.iter().all(|s| s.service == "orders"));

    let mut processes = named(&spans, &process_name);
    processes.sort_by_key(|s| s.attribute("wharf.attempt").to_owned());
    for (attempt, process) in processes.iter().enumerate() {
        assert_eq!(process.kind, "consumer");
        assert_eq!(
            process.attribute("wharf.attempt"),
            (attempt + 1).to_string()
        );
        assert_eq!(process.attribute("messaging.system"), "activemq");
        assert_eq!(process.attribute("messaging.operation.type"), "process");
        assert_eq!(process.attribute("messaging.destination.name"), q);
        assert_eq!(process.attribute("messaging.message.id"), id);
        assert_eq!(
            process.attribute("messaging.message.conversation_id"),
            "conversation-7"
        );
        assert_eq!(process.attribute("messaging.message.body.size"), "13");
        assert_eq!(process.attribute("wharf.tenant"), "t");
        assert_eq!(process.attribute("wharf.mount"), "m");
        assert!(process.attributes.contains_key("server.address"));
        assert!(process.attributes.contains_key("server.port"));
        assert!(process.attributes.contains_key("wharf.module.version"));
    }
    let outcome = |n: usize| processes[n].attribute("wharf.outcome");
    assert_eq!(outcome(0), "retry");
    assert_eq!(processes[1].attribute("error.type"), "trap");
    assert!(processes[1].failed, "a trapped handler's span failed");
    assert!(outcome(2).starts_with("retry-after"), "{}", outcome(2));

    // Each retry is a copy, sent below the attempt that asked for it; the
    // next attempt reads the copy's context, so it is below that send.
    let mut copies = named(&spans, &format!("send {q}"));
    copies.sort_by_key(|s| s.attribute("wharf.retry_count").to_owned());
    assert_eq!(copies.len(), 3);
    assert_eq!(processes[0].parent_span_id, PUBLISHER_SPAN);
    for (n, copy) in copies.iter().enumerate() {
        assert_eq!(copy.kind, "producer");
        assert_eq!(copy.attribute("wharf.retry_count"), (n + 1).to_string());
        assert_eq!(copy.parent_span_id, processes[n].span_id);
        assert_eq!(processes[n + 1].parent_span_id, copy.span_id);
    }
    assert_eq!(copies[2].attribute("wharf.delay_ms"), "50");

    // The dead letter is sent below the last attempt, with its context.
    let dead_span = named(&spans, &format!("send {dead}"))[0];
    assert_eq!(dead_span.parent_span_id, processes[3].span_id);
    assert_eq!(dead_span.attribute("wharf.dead_letter"), "true");
    assert_eq!(
        carried(&dead_letter, "the dead letter")?.span_id_hex(),
        dead_span.span_id
    );

    // Every settle is below the attempt it settles.
    for settle in named(&spans, &format!("settle {q}")) {
        assert_eq!(settle.kind, "client");
        assert!(
            processes.iter().any(|p| p.span_id == settle.parent_span_id),
            "{settle:?}"
        );
        assert!(settle.attributes.contains_key("messaging.operation.name"));
    }
    let _ = host.handled(&id).await?;
    dead_letters.close().await;
    client.close().await;
    host.stop().await
}

#[tokio::test]
async fn an_ordered_deliverys_spans_carry_its_key_cut_to_a_bound() -> anyhow::Result<()> {
    let collector = Collector::start().await?;
    let q = unique("spans-ordered");
    let mount = MountToml::new("m", "fixture_script", &q).with("order_by = \"group-id\"");
    let host =
        TestHost::start_traced(vec![mount], &format!("endpoint = \"{}\"", collector.http)).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    // A key longer than a span shows: cut at a character's edge.
    let long = "ü".repeat(100);
    for (id, key) in [
        (format!("{q}.short"), "acct-9"),
        (format!("{q}.long"), long.as_str()),
    ] {
        let message = TestMessage::new(&id, "x")
            .group(key, 1)
            .script("1:retry *:ack");
        client.publish(&q, message).await?;
    }
    let process_name = format!("process {q}");
    let spans = collector
        .wait_until(SPANS_WITHIN, |spans| {
            named(spans, &process_name).len() == 2
                && named(spans, &format!("settle {q}")).len() == 2
        })
        .await?;
    for process in named(&spans, &process_name) {
        let key = process.attribute("wharf.order.key");
        if process
            .attribute("messaging.message.id")
            .ends_with(".short")
        {
            assert_eq!(key, "acct-9");
        } else {
            let (shown, rest) = key.split_once('…').unwrap_or((key, ""));
            assert!(long.starts_with(shown) && shown.len() <= 64, "{key:?}");
            assert_eq!(rest, format!("(+{} bytes)", long.len() - shown.len()));
        }
    }
    // The retry ran again in place, within the delivery's one span, which
    // ends at the attempt that settled it.
    for process in named(&spans, &process_name) {
        assert_eq!(process.attribute("wharf.attempt"), "2");
    }
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn outputs_and_replies_carry_their_send_spans_context_over_grpc() -> anyhow::Result<()> {
    let collector = Collector::start().await?;
    let q = unique("spans-grpc");
    let out = format!("{q}.out");
    let replies = format!("{q}.replies");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("[tenant.mount.grants]")
        .with(&format!("send = [\"{out}\"]\nreply = true"));
    let host = TestHost::start_traced(
        vec![mount],
        &format!("endpoint = \"{}\"\nprotocol = \"grpc\"", collector.grpc),
    )
    .await?;
    let mut client = Client::connect(&artemis_url()).await?;
    let mut outputs = client.watch(&out).await?;
    let mut answers = client.watch(&replies).await?;
    let script = format!("*:send={out},reply,ack");
    // With a publisher's context, and without one (wharf starts a trace).
    for (n, parent) in [Some(PARENT), None].into_iter().enumerate() {
        let mut message = TestMessage::new(&format!("{q}.{n}"), "hello")
            .script(&script)
            .reply_to(&replies);
        if let Some(parent) = parent {
            message = message.property(TRACEPARENT, SimpleValue::String(parent.into()));
        }
        client.publish(&q, message).await?;
        let output = carried(&outputs.next().await?.1, "the output")?;
        let reply = carried(&answers.next().await?.1, "the reply")?;
        let spans = collector
            .wait_until(SPANS_WITHIN, |spans| {
                [&output, &reply]
                    .iter()
                    .all(|c| spans.iter().any(|s| s.span_id == c.span_id_hex()))
            })
            .await?;
        let process = spans
            .iter()
            .find(|s| s.name == format!("process {q}") && s.trace_id == output.trace_id_hex())
            .expect("the delivery's process span");
        match parent {
            Some(_) => {
                assert_eq!(process.trace_id, TRACE);
                assert_eq!(process.parent_span_id, PUBLISHER_SPAN);
            }
            None => assert_eq!(process.parent_span_id, "", "a trace of its own"),
        }
        for (context, address) in [(&output, &out), (&reply, &replies)] {
            let send = spans
                .iter()
                .find(|s| s.span_id == context.span_id_hex())
                .expect("the send span of what was published");
            assert_eq!(send.name, format!("send {address}"));
            assert_eq!(send.kind, "producer");
            assert_eq!(send.parent_span_id, process.span_id);
            assert_eq!(send.attribute("messaging.destination.name"), *address);
            assert!(context.sampled());
        }
        assert_eq!(process.service, "wharf", "the default service name");
    }
    outputs.close().await;
    answers.close().await;
    client.close().await;
    host.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn sampling_follows_the_publisher_and_decides_traces_that_start_here() -> anyhow::Result<()> {
    let collector = Collector::start().await?;
    let q = unique("spans-sampled");
    let out = format!("{q}.out");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("[tenant.mount.grants]")
        .with(&format!("send = [\"{out}\"]"));
    // No trace that starts here is kept; a publisher's decision stands.
    let host = TestHost::start_traced(
        vec![mount],
        &format!(
            "endpoint = \"{}\"\nsampler = \"parentbased_traceidratio\"\nsampler_ratio = 0.0",
            collector.http
        ),
    )
    .await?;
    let mut client = Client::connect(&artemis_url()).await?;
    let mut outputs = client.watch(&out).await?;
    let unsampled = "00-1bf7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let mut contexts = Vec::new();
    for (n, parent) in [None, Some(unsampled), Some(PARENT)]
        .into_iter()
        .enumerate()
    {
        let mut message =
            TestMessage::new(&format!("{q}.{n}"), "x").script(&format!("*:send={out},ack"));
        if let Some(parent) = parent {
            message = message.property(TRACEPARENT, SimpleValue::String(parent.into()));
        }
        client.publish(&q, message).await?;
        contexts.push(carried(&outputs.next().await?.1, "the output")?);
    }
    assert!(!contexts[0].sampled() && !contexts[1].sampled());
    assert!(contexts[2].sampled());
    assert_eq!(
        contexts[1].trace_id_hex(),
        "1bf7651916cd43dd8448eb211c80319c"
    );
    outputs.close().await;
    client.close().await;
    // Stopping exports every span recorded.
    host.stop().await?;
    let spans = collector.spans();
    assert!(
        spans.iter().any(|s| s.span_id == contexts[2].span_id_hex()),
        "the sampled trace is exported"
    );
    assert!(
        spans.iter().all(|s| s.trace_id == TRACE),
        "only the sampled trace is exported: {spans:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collector_that_is_down_costs_only_dropped_spans() -> anyhow::Result<()> {
    // A port nothing listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await?
        .local_addr()?;
    let q = unique("spans-down");
    let mount = MountToml::new("m", "fixture_script", &q);
    let mut host = TestHost::start_traced(
        vec![mount],
        &format!("endpoint = \"http://{closed}\"\nmax_queue = 8\nmax_batch = 4"),
    )
    .await?;
    let mut client = Client::connect(&artemis_url()).await?;
    let sent = 40;
    for n in 0..sent {
        client
            .publish(
                &q,
                TestMessage::new(&format!("{q}.{n}"), "x")
                    .script("*:ack")
                    .property(TRACEPARENT, SimpleValue::String(PARENT.into())),
            )
            .await?;
    }
    let mut handled = 0;
    for n in 0..sent {
        let outcome = host.handled(&format!("{q}.{n}")).await?;
        assert_eq!(
            outcome.disposition,
            Some(wharf_core::settlement::Disposition::Accepted)
        );
        handled += 1;
    }
    let deadline = tokio::time::Instant::now() + SPANS_WITHIN;
    let dropped = loop {
        let metrics = host.host().metrics_text();
        let dropped = metric(&metrics, "wharf_trace_spans_dropped_total");
        // Two spans per delivery (process, settle), every one dropped.
        if dropped >= 2 * sent {
            assert_eq!(metric(&metrics, "wharf_trace_spans_exported_total"), 0);
            break dropped;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "only {dropped} spans counted as dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("sent {sent}, handled {handled}, spans dropped {dropped}");
    assert_eq!(handled, sent);
    client.close().await;
    host.stop().await
}

/// A counter's value in Prometheus text, 0 when absent.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_carry_the_ids_of_spans_configured_by_the_otel_environment() -> anyhow::Result<()> {
    let collector = Collector::start().await?;
    let q = unique("spans-env");
    let text = crate::config_text(&artemis_url(), &[MountToml::new("m", "fixture_script", &q)]);
    let mut wharf = WharfProcess::start_config_with_env(
        &text,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.http.as_str()),
            ("OTEL_SERVICE_NAME", "from-env"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20t0ken,x-tenant=a",
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await?;
    let mut client = Client::connect(&artemis_url()).await?;
    let id = format!("{q}.1");
    client
        .publish(&q, TestMessage::new(&id, "x").script("1:trap *:ack"))
        .await?;
    let line = wharf.wait_for_log("handler failed").await?;
    let spans = collector
        .wait_until(SPANS_WITHIN, |spans| {
            spans
                .iter()
                .filter(|s| s.name == format!("process {q}"))
                .count()
                == 2
        })
        .await?;
    let failed = spans
        .iter()
        .find(|s| s.name == format!("process {q}") && s.failed)
        .expect("the trapped attempt's span");
    assert_eq!(failed.service, "from-env");
    assert_eq!(
        collector.header("authorization").as_deref(),
        Some("Bearer t0ken"),
        "the headers variable is sent, percent-decoded"
    );
    assert_eq!(collector.header("x-tenant").as_deref(), Some("a"));
    assert!(
        line.contains(&failed.trace_id) && line.contains(&failed.span_id),
        "the log line names the span: {line}"
    );

    // The handler sees its delivery's context, not the publisher's: the
    // fixture logs the `traceparent` property it was given.
    client
        .publish(
            &q,
            TestMessage::new(&format!("{q}.2"), "x")
                .script("*:expect=traceparent=none")
                .property(TRACEPARENT, SimpleValue::String(PARENT.into())),
        )
        .await?;
    let line = wharf.wait_for_log("property traceparent is").await?;
    let span_id = line
        .split("\"span_id\":\"")
        .nth(1)
        .and_then(|rest| rest.get(..16))
        .expect("the line names its span");
    assert_ne!(span_id, PUBLISHER_SPAN);
    assert!(
        line.contains(&format!("00-{TRACE}-{span_id}-01")),
        "the handler saw its own span's context: {line}"
    );
    client.close().await;
    drop(wharf);
    Ok(())
}
