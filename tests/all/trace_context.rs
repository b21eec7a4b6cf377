//! W3C trace context through wharf on a real broker: a publisher's context,
//! in each form clients write it, continues on the outputs, replies and
//! retry copies and dead letters of its delivery, one new span id per
//! publish.

use fe2o3_amqp::types::messaging::MessageAnnotations;
use fe2o3_amqp::types::messaging::annotations::OwnedKey;
use fe2o3_amqp::types::primitives::{Binary, OrderedMap, SimpleValue, Symbol, Value};
use wharf_core::message::AmqpMessage;
use wharf_core::trace::{DIAGNOSTIC_ID, QPID_TRACESTATE, TRACEPARENT, TRACESTATE, TraceContext};

use crate::client::{Client, TestMessage, trace_context as carried};
use crate::{MountToml, TestHost, artemis_url, unique};

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const STATE: &str = "congo=t61rcWkgMzE";

/// `message` with the message annotation `key` set to `value`.
fn annotated(message: TestMessage, key: &str, value: Value) -> AmqpMessage {
    let mut message = AmqpMessage::from(message);
    let mut annotations = MessageAnnotations::builder().build();
    annotations
        .0
        .insert(OwnedKey::Symbol(Symbol::from(key)), value);
    message.message_annotations = Some(annotations);
    message
}

#[tokio::test(flavor = "multi_thread")]
async fn a_publishers_context_in_any_form_continues_on_outputs_replies_and_copies()
-> anyhow::Result<()> {
    let url = artemis_url();
    let q = unique("trace");
    let out = format!("{q}.out");
    let replies = format!("{q}.replies");
    let dead = format!("{q}.dead");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with(&format!("dead_letter = \"{dead}\"\nmax_attempts = 2"))
        .with("[tenant.mount.grants]")
        .with(&format!("send = [\"{out}\"]\nreply = true\nclocks = true"));
    let mut host = TestHost::start(&url, &[mount]).await?;
    let mut client = Client::connect(&url).await?;
    let mut outputs = client.watch(&out).await?;
    let mut answers = client.watch(&replies).await?;
    let mut dead_letters = client.watch(&dead).await?;
    let script = format!("*:send={out},reply,ack");
    let message = |form: &str| {
        TestMessage::new(&format!("{q}.{form}"), form)
            .script(&script)
            .reply_to(&replies)
    };
    let mut qpid = OrderedMap::new();
    qpid.insert(
        Value::Symbol(Symbol::from(TRACEPARENT)),
        Value::String(PARENT.to_owned()),
    );
    qpid.insert(
        Value::Symbol(Symbol::from(TRACESTATE)),
        Value::String(STATE.to_owned()),
    );
    let forms: Vec<(&str, AmqpMessage, bool)> = vec![
        (
            "message annotation",
            annotated(
                message("annotation"),
                TRACEPARENT,
                Value::String(PARENT.into()),
            ),
            false,
        ),
        (
            "x-opt-qpid-tracestate",
            annotated(message("qpid"), QPID_TRACESTATE, Value::Map(qpid)),
            true,
        ),
        (
            "application properties",
            message("properties")
                .property(TRACEPARENT, SimpleValue::String(PARENT.into()))
                .property(TRACESTATE, SimpleValue::String(STATE.into()))
                .into(),
            true,
        ),
        (
            "binary application property",
            message("binary")
                .property(
                    TRACEPARENT,
                    SimpleValue::Binary(Binary::from(PARENT.as_bytes().to_vec())),
                )
                .into(),
            false,
        ),
        (
            "Diagnostic-Id",
            message("diagnostic")
                .property(DIAGNOSTIC_ID, SimpleValue::String(PARENT.into()))
                .into(),
            false,
        ),
    ];
    for (form, sent, with_state) in forms {
        client.publish(&q, sent).await?;
        let (_, output) = outputs.next().await?;
        let (_, reply) = answers.next().await?;
        let output = carried(&output, &format!("{form}: the output"))?;
        let reply = carried(&reply, &format!("{form}: the reply"))?;
        for (what, context) in [("output", &output), ("reply", &reply)] {
            assert_eq!(context.trace_id_hex(), TRACE, "{form}: the {what}'s trace");
            assert_ne!(
                context.span_id_hex(),
                "b7ad6b7169203331",
                "{form}: the {what} has a span of its own"
            );
            let state = with_state.then_some(STATE);
            assert_eq!(
                context.state.as_deref(),
                state,
                "{form}: the {what}'s tracestate"
            );
        }
        assert_ne!(
            output.span_id, reply.span_id,
            "{form}: one span per publish"
        );
        println!(
            "{form}: output {}, reply {}",
            output.traceparent(),
            reply.traceparent()
        );
    }

    // A dead letter is the delivery as it arrived, but for a context of
    // its own in the same trace.
    let id = format!("{q}.dead");
    client
        .publish(
            &q,
            TestMessage::new(&id, "poison")
                .script("*:retry")
                .property(TRACEPARENT, SimpleValue::String(PARENT.into())),
        )
        .await?;
    let (_, dead_letter) = dead_letters.next().await?;
    let context = carried(&dead_letter, "the dead letter")?;
    assert_eq!(context.trace_id_hex(), TRACE);
    assert_ne!(context.span_id_hex(), "b7ad6b7169203331");
    assert_eq!(
        crate::client::message_id(&dead_letter).as_deref(),
        Some(id.as_str())
    );
    assert_eq!(crate::client::body_text(&dead_letter), "poison");

    // A retry-after copy carries the trace to the next attempt, whose
    // output is in the same trace.
    let id = format!("{q}.retried");
    client
        .publish(
            &q,
            TestMessage::new(&id, "again")
                .script(&format!("1:after=50 *:send={out},ack"))
                .property(TRACEPARENT, SimpleValue::String(PARENT.into())),
        )
        .await?;
    let second = loop {
        let handled = host.handled(&id).await?;
        if handled.attempt == 2 {
            break handled;
        }
    };
    assert_eq!(second.attempt, 2);
    let (_, output) = outputs.next().await?;
    let after_copy = carried(&output, "the output after a retry-after copy")?;
    assert_eq!(after_copy.trace_id_hex(), TRACE);

    // A context that cannot be read is ignored: the delivery is handled,
    // its output carries none; a delivery without one starts none.
    for (form, sent) in [
        (
            "malformed",
            message("malformed").property(TRACEPARENT, SimpleValue::String("00-nope".into())),
        ),
        ("none", message("none")),
    ] {
        client.publish(&q, sent).await?;
        let (_, output) = outputs.next().await?;
        answers.next().await?;
        assert_eq!(
            TraceContext::of(&output).map_err(|e| anyhow::anyhow!(e.place))?,
            None,
            "{form}: the output"
        );
    }
    outputs.close().await;
    answers.close().await;
    dead_letters.close().await;
    client.close().await;
    host.stop().await
}
