//! Every AMQP field of contract 0.3.0, from a publisher through the
//! `flaky` example's `mirror:` in each language and out through its output;
//! components built against 0.2.0 still run and publish.

use std::collections::BTreeMap;

use fe2o3_amqp::types::messaging::{
    AmqpValue, ApplicationProperties, Body, Header, Message, MessageAnnotations, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, SimpleValue, Symbol, Timestamp, Value};
use wharf_core::message::AmqpMessage;
use wharf_core::settlement::Outcome;

use crate::client::{TestMessage, body_bytes};
use crate::languages::FLAKY;
use crate::tenants::start_tenants;
use crate::{MountToml, TenantToml, artemis_url, start_with_client, unique};

const CREATED: i64 = 1_700_000_000_000;

/// A message with every field a publisher sets, bound for `mirror:out`.
fn every_field(id: &str, out: &str, expires: i64) -> AmqpMessage {
    Message::builder()
        .header(Header {
            durable: true,
            priority: 7.into(),
            ..Header::default()
        })
        .message_annotations(
            MessageAnnotations::builder()
                .insert(Symbol::from("x-opt-test-note"), Value::from("note"))
                .insert(Symbol::from("x-opt-test-count"), Value::Ulong(3))
                .build(),
        )
        .properties(Properties {
            to: Some("written-on-it".to_owned()),
            user_id: Some(Binary::from(b"publisher".to_vec())),
            group_id: Some("g-7".to_owned()),
            group_sequence: Some(41),
            reply_to_group_id: Some("rg-7".to_owned()),
            creation_time: Some(Timestamp::from_milliseconds(CREATED)),
            absolute_expiry_time: Some(Timestamp::from_milliseconds(expires)),
            ..Properties::builder().message_id(id.to_owned()).build()
        })
        .application_properties(
            ApplicationProperties::builder()
                .insert("kind", "mirrored")
                .insert("n", SimpleValue::Long(-5))
                .build(),
        )
        .body(Body::Value(AmqpValue(Value::String(format!(
            "mirror:{out}"
        )))))
        .build()
        .into()
}

/// What an output's application properties say, by key.
fn properties_of(message: &AmqpMessage) -> BTreeMap<String, Value> {
    message
        .application_properties
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_field_round_trips_in_every_language() -> anyhow::Result<()> {
    let queues: Vec<String> = FLAKY.iter().map(|(name, _)| unique(name)).collect();
    let tenants: Vec<TenantToml> = FLAKY
        .iter()
        .zip(&queues)
        .map(|((name, grants), q)| {
            let mut mount = MountToml::new("fields", name, q)
                .with("timeout = \"60s\"")
                .with("[tenant.mount.grants]")
                .with(&format!("send = [\"{q}.out\"]"));
            for grant in *grants {
                mount = mount.with(grant);
            }
            TenantToml::new(name, vec![mount])
        })
        .collect();
    let (mut host, mut client) = start_tenants("", &tenants).await?;
    let expires = i64::try_from(
        (std::time::SystemTime::now() + std::time::Duration::from_secs(86_400))
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    let mut outputs = BTreeMap::new();
    for ((name, _), q) in FLAKY.iter().zip(&queues) {
        let out = format!("{q}.out");
        let mut watcher = client.watch(&out).await?;
        client.publish(q, every_field(q, &out, expires)).await?;
        let handled = host.handled(q).await?;
        assert_eq!(handled.outcome, Outcome::Ack, "{name}: {handled:?}");
        let (_, output) = watcher.next().await?;
        watcher.close().await;
        assert_eq!(
            body_bytes(&output),
            format!("mirror:{out}").as_bytes(),
            "{name}"
        );
        let header = output.header.clone().unwrap_or_default();
        assert_eq!((header.priority.0, header.durable), (7, true), "{name}");
        let p = output.properties.clone().unwrap_or_default();
        assert_eq!(p.group_id.as_deref(), Some("g-7"), "{name}");
        assert_eq!(p.group_sequence, Some(41), "{name}");
        assert_eq!(p.reply_to_group_id.as_deref(), Some("rg-7"), "{name}");
        let time = |t: Option<Timestamp>| t.map(|t| t.milliseconds());
        assert_eq!(time(p.creation_time), Some(CREATED), "{name}");
        assert_eq!(time(p.absolute_expiry_time), Some(expires), "{name}");
        let properties = properties_of(&output);
        let expected = [
            ("kind", Value::from("mirrored")),
            ("n", Value::Long(-5)),
            ("to", Value::from("written-on-it")),
            (
                "user-id",
                Value::Binary(Binary::from(b"publisher".to_vec())),
            ),
            ("annotation:x-opt-test-note", Value::from("note")),
            ("annotation:x-opt-test-count", Value::Ulong(3)),
        ];
        for (key, value) in expected {
            assert_eq!(
                properties.get(key),
                Some(&value),
                "{name}: {key} in {properties:?}"
            );
        }
        assert!(
            matches!(properties.get("first-acquirer"), Some(Value::Bool(_))),
            "{name}: {properties:?}"
        );
        outputs.insert(*name, properties);
    }
    // Every language saw and sent the same, down to the broker's own
    // annotations.
    let rust = outputs["flaky"].clone();
    for (name, properties) in &outputs {
        assert_eq!(*properties, rust, "{name} differs from Rust");
    }
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_component_built_against_0_2_0_still_runs_and_publishes() -> anyhow::Result<()> {
    let q = unique("v0-2");
    let out = format!("{q}.out");
    let mount = MountToml::new("m", "fixture_v0_2", &q)
        .with("[tenant.mount.grants]")
        .with(&format!("send = [\"{out}\"]"));
    let (mut host, mut client) = start_with_client(&artemis_url(), &[mount]).await?;
    let mut watcher = client.watch(&out).await?;
    let message = TestMessage::new(&q, &format!("v0.2:{out}"))
        .group("g", 1)
        .property("kind", SimpleValue::String("old".into()));
    client.publish(&q, message).await?;
    let handled = host.handled(&q).await?;
    assert_eq!(handled.outcome, Outcome::Ack, "{handled:?}");
    let (_, output) = watcher.next().await?;
    let p = output.properties.clone().unwrap_or_default();
    assert_eq!(p.subject.as_deref(), Some("v0.2"));
    // A 0.2.0 message sets no group.
    assert_eq!(p.group_id, None);
    assert_eq!(
        properties_of(&output).get("kind"),
        Some(&Value::from("old")),
        "{output:?}"
    );
    watcher.close().await;
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// `wharf` with `args`; its stdout, which must say it succeeded.
async fn wharf(args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(crate::process::wharf_binary())
        .args(args)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "wharf {args:?}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

#[tokio::test]
async fn wharf_send_and_invoke_set_every_field() -> anyhow::Result<()> {
    let q = unique("send-fields");
    let mut client = crate::client::Client::connect(&artemis_url()).await?;
    let mut watcher = client.watch(&q).await?;
    let fields = [
        "--group-id",
        "g-1",
        "--group-sequence",
        "10",
        "--reply-to-group-id",
        "rg-1",
        "--priority",
        "8",
        "--creation-time",
        "1700000000000",
        "--to",
        "written-on-it",
        "--user-id",
        "publisher",
        "--annotation",
        "x-opt-note=n",
    ];
    let url = artemis_url();
    let mut args = vec!["send", "--url", &url, "--address", &q];
    args.extend(fields);
    args.extend(["--transient", "one", "two"]);
    wharf(&args).await?;
    for (body, sequence) in [("one", 10), ("two", 11)] {
        let (_, message) = watcher.next().await?;
        assert_eq!(crate::client::body_text(&message), body);
        let p = message.properties.clone().unwrap_or_default();
        assert_eq!(
            (
                p.group_id.as_deref(),
                p.group_sequence,
                p.reply_to_group_id.as_deref()
            ),
            (Some("g-1"), Some(sequence), Some("rg-1"))
        );
        assert_eq!(p.creation_time.map(|t| t.milliseconds()), Some(CREATED));
        assert_eq!(p.to.as_deref(), Some("written-on-it"));
        assert_eq!(
            p.user_id.as_deref().map(|b| &b[..]),
            Some(&b"publisher"[..])
        );
        let header = message.header.clone().unwrap_or_default();
        assert_eq!((header.priority.0, header.durable), (8, false));
        let note = message
            .message_annotations
            .as_ref()
            .and_then(|a| {
                a.0.iter()
                    .find(|(k, _)| format!("{k:?}").contains("x-opt-note"))
            })
            .map(|(_, v)| v.clone());
        assert_eq!(note, Some(Value::from("n")));
    }
    watcher.close().await;
    client.close().await;
    // `wharf invoke` gives the same fields to a handler, which mirrors them.
    let flaky = crate::guest("flaky").display().to_string();
    let mut args = vec!["invoke", "--module", &flaky, "--body", "mirror:out"];
    args.extend(["--send", "out", "--first-acquirer"]);
    args.extend(fields);
    let printed = wharf(&args).await?;
    for said in [
        "ack",
        "group-id=g-1",
        "reply-to-group-id=rg-1",
        "group-sequence=10",
        "priority=8",
        "creation-time=1700000000000",
        "to=written-on-it",
        "user-id=9 bytes",
        "first-acquirer=true",
        "annotation:x-opt-note=n",
    ] {
        assert!(printed.contains(said), "`{said}` not in:\n{printed}");
    }
    Ok(())
}
