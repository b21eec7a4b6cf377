use fe2o3_amqp_types::messaging::{
    AmqpSequence, AmqpValue, ApplicationProperties, Batch, Data, Header, MessageAnnotations,
    Properties,
};
use fe2o3_amqp_types::primitives::{Binary, OrderedMap, SimpleValue};

use super::view::PropertyValue;
use super::*;

fn message() -> AmqpMessage {
    Message::builder()
        .properties(
            Properties::builder()
                .message_id(String::from("m-1"))
                .build(),
        )
        .application_properties(ApplicationProperties::builder().insert("k", "v").build())
        .body(Body::Value(AmqpValue(Value::String("hello".into()))))
        .build()
        .into()
}

fn context() -> DeliveryContext<'static> {
    DeliveryContext {
        address: "q",
        tenant: "t",
        mount: "m",
        attempt: 1,
        presettled: false,
    }
}

#[test]
fn no_header_no_counter() {
    assert_eq!(message().counters(), Counters::default());
}

#[test]
fn header_counter_and_retry_count() {
    let mut m = message().copy(2, None);
    m.header = Some(Header {
        delivery_count: 3,
        ..Header::default()
    });
    let c = m.counters();
    assert_eq!(c.delivery_count, Some(3));
    assert_eq!(c.retry_count, Some(2));
    assert_eq!(c.attempt(), 6);
}

#[test]
fn annotation_counter_fills_an_empty_header() {
    let mut m = message();
    m.header = Some(Header::default());
    m.message_annotations = Some(
        MessageAnnotations::builder()
            .insert(Symbol::from(DELIVERY_COUNT_ANNOTATION), Value::Long(4))
            .build(),
    );
    assert_eq!(m.counters().delivery_count, Some(4));
}

#[test]
fn a_copy_keeps_the_header_but_not_its_count() {
    let mut m = message();
    m.header = Some(Header {
        durable: true,
        priority: 7.into(),
        ttl: Some(60_000),
        delivery_count: 5,
        ..Header::default()
    });
    let c = m.copy(1, None);
    let header = c.header.as_ref().expect("header kept");
    assert!(header.durable);
    assert_eq!(header.priority, 7.into());
    assert_eq!(header.ttl, Some(60_000));
    assert_eq!(header.delivery_count, 0);
    assert_eq!(c.body, m.body);
    assert_eq!(c.property("k"), Some(&Value::String("v".into())));
    assert_eq!(c.property(RETRY_COUNT_PROPERTY), Some(&Value::Uint(1)));
    // The copy is counted by its retry count, not its header.
    assert!(c.counters().is_copy());
    assert_eq!(c.counters().attempt(), 2);
    // A copy of a copy replaces the count rather than adding a second one.
    let again = c.copy(2, None);
    let counts = again
        .application_properties
        .iter()
        .flatten()
        .filter(|(k, _)| k == RETRY_COUNT_PROPERTY)
        .count();
    assert_eq!(counts, 1);
}

#[test]
fn a_copy_leaves_what_the_broker_and_producer_said_of_the_original_behind() {
    let mut m = message();
    m.application_properties = Some(vec![
        ("k".to_owned(), Value::String("v".into())),
        (
            ARTEMIS_DUPLICATE_ID.to_owned(),
            Value::String("order-7".into()),
        ),
        (
            "_AMQ_ORIG_ADDRESS".to_owned(),
            Value::String("elsewhere".into()),
        ),
    ]);
    let mut annotations = MessageAnnotations::builder().build();
    for (key, value) in [
        ("x-opt-delivery-delay", Value::Long(60_000)),
        ("x-delivery-count", Value::Uint(4)),
        ("x-opt-jms-msg-type", Value::Byte(5)),
    ] {
        annotations
            .0
            .insert(OwnedKey::Symbol(Symbol::from(key)), value);
    }
    m.message_annotations = Some(annotations);
    let first = m.copy(1, None);
    assert_eq!(
        first.property(ARTEMIS_DUPLICATE_ID),
        Some(&Value::String("order-7#retry-1".into()))
    );
    assert_eq!(first.property("_AMQ_ORIG_ADDRESS"), None);
    assert_eq!(first.property("k"), Some(&Value::String("v".into())));
    let kept: Vec<String> = first
        .message_annotations
        .iter()
        .flat_map(|a| a.0.keys())
        .map(|k| format!("{k:?}"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].contains("x-opt-jms-msg-type"), "{kept:?}");
    assert_eq!(first.counters().attempt(), 2);
    // The next copy's id is its own too, not a chain of suffixes.
    assert_eq!(
        first.copy(2, None).property(ARTEMIS_DUPLICATE_ID),
        Some(&Value::String("order-7#retry-2".into()))
    );
}

#[test]
fn identity_tells_messages_sharing_an_id_apart() {
    let m = message();
    let mut other = message();
    other.body = Body::Value(AmqpValue(Value::String("different".into())));
    assert_ne!(m.identity(), other.identity());
    assert_eq!(m.identity(), message().identity());
    assert!(m.identity().starts_with("m-1#"), "{}", m.identity());
    // A redelivery differs only in its header: the same identity.
    let mut redelivered = message();
    redelivered.header = Some(Header {
        delivery_count: 3,
        ..Header::default()
    });
    assert_eq!(m.identity(), redelivered.identity());
}

#[test]
fn a_scheduled_copy_carries_its_delivery_time() {
    let due = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    let c = message().copy(1, Some(due));
    let annotations = c.message_annotations.expect("annotations");
    assert_eq!(
        annotations
            .0
            .get(&OwnedKey::Symbol(Symbol::from(DELIVERY_TIME_ANNOTATION))),
        Some(&Value::Long(1_700_000_000_123))
    );
}

#[test]
fn encoding_then_decoding_gives_the_message_back() {
    let mut m = message().copy(3, None);
    m.header = Some(Header {
        durable: true,
        ..Header::default()
    });
    let bytes = m.encode().expect("encode");
    assert_eq!(AmqpMessage::decode(&bytes).expect("decode"), m);
    // fe2o3's own decoder reads what we write.
    let typed: Message<Body<Value>> = serde_amqp::from_slice::<
        fe2o3_amqp_types::messaging::message::__private::Deserializable<_>,
    >(&bytes)
    .map(|d| d.0)
    .expect("typed decode");
    assert_eq!(AmqpMessage::from(typed), m);
}

#[test]
fn properties_of_any_type_decode_and_reach_the_handler_as_json() {
    let mut m = message();
    let list = Value::List(vec![Value::Int(1), Value::Int(2)]);
    let mut map = OrderedMap::new();
    map.insert(Value::String("a".into()), Value::Int(1));
    m.application_properties = Some(vec![
        ("list".into(), list),
        ("map".into(), Value::Map(map)),
        ("s".into(), Value::String("x".into())),
    ]);
    let bytes = m.encode().expect("encode");
    let decoded = AmqpMessage::decode(&bytes).expect("lenient decode");
    assert_eq!(decoded, m);
    let d = to_delivery(&decoded, context());
    let rendered: Vec<(String, String)> = d
        .properties
        .iter()
        .map(|p| {
            let text = match &p.value {
                PropertyValue::Other(text) | PropertyValue::String(text) => text.clone(),
                other => panic!("unexpected {}", describe(other)),
            };
            (p.key.clone(), text)
        })
        .collect();
    assert_eq!(
        rendered,
        [
            ("list".to_owned(), "[1,2]".to_owned()),
            ("map".to_owned(), r#"{"a":1}"#.to_owned()),
            ("s".to_owned(), "x".to_owned()),
        ]
    );
}

fn describe(value: &PropertyValue) -> &'static str {
    match value {
        PropertyValue::String(_) => "string",
        PropertyValue::Int(_) => "int",
        PropertyValue::Uint(_) => "uint",
        PropertyValue::Float(_) => "float",
        PropertyValue::Boolean(_) => "boolean",
        PropertyValue::Bytes(_) => "bytes",
        PropertyValue::Timestamp(_) => "timestamp",
        PropertyValue::Null => "null",
        PropertyValue::Other(_) => "other",
    }
}

#[test]
fn structured_bodies_reach_the_handler_as_json() {
    let mut map = OrderedMap::new();
    map.insert(Value::String("order".into()), Value::Int(7));
    map.insert(Value::String("item".into()), Value::String("book".into()));
    let mut m = message();
    m.properties = Some(Properties::builder().message_id(String::from("m")).build());
    m.body = Body::Value(AmqpValue(Value::Map(map)));
    let d = to_delivery(&m, context());
    assert_eq!(d.body, br#"{"order":7,"item":"book"}"#);
    assert_eq!(d.content_type.as_deref(), Some("application/json"));

    m.body = Body::Sequence(Batch::new(vec![
        AmqpSequence(vec![Value::Int(1), Value::String("two".into())]),
        AmqpSequence(vec![Value::Bool(true)]),
    ]));
    assert_eq!(to_delivery(&m, context()).body, br#"[1,"two",true]"#);

    m.body = Body::Data(Batch::new(vec![
        Data(Binary::from(b"ab".to_vec())),
        Data(Binary::from(b"cd".to_vec())),
    ]));
    let d = to_delivery(&m, context());
    assert_eq!(d.body, b"abcd");
    assert_eq!(d.content_type, None);
}

#[test]
fn handler_sees_body_and_properties() {
    let d = to_delivery(&message(), context());
    assert_eq!(d.body, b"hello");
    assert_eq!(d.message_id.as_deref(), Some("m-1"));
    assert_eq!(d.properties.len(), 1);
    assert_eq!(d.properties[0].key, "k");
    assert!(matches!(&d.properties[0].value, PropertyValue::String(s) if s == "v"));
}

#[test]
fn garbage_is_a_decode_failure_that_says_where() {
    let error = AmqpMessage::decode(&[0x00, 0x53, 0x70, 0xff]).expect_err("garbage");
    assert!(error.as_str().contains("byte 3"), "{error}");
    let not_described = serde_amqp::to_vec(&Value::Int(3)).expect("encode");
    let error = AmqpMessage::decode(&not_described).expect_err("bare value");
    assert!(error.as_str().contains("not a described"), "{error}");
}

#[test]
fn simple_property_values_convert() {
    let typed: AmqpMessage = Message::builder()
        .application_properties(
            ApplicationProperties::builder()
                .insert("n", SimpleValue::Uint(3))
                .build(),
        )
        .body(Body::<Value>::Empty)
        .build()
        .into();
    assert_eq!(typed.property("n"), Some(&Value::Uint(3)));
}

#[test]
fn annotations_that_do_not_decode_travel_on_as_they_arrived() {
    // Message annotation keys must be symbols or ulongs; an int key is not.
    let mut odd = OrderedMap::new();
    odd.insert(Value::Int(1), Value::String("x".into()));
    let annotations = serde_amqp::described::Described {
        descriptor: serde_amqp::descriptor::Descriptor::Code(0x72),
        value: Value::Map(odd),
    };
    let mut bytes = serde_amqp::to_vec(&annotations).expect("encode");
    bytes.extend(serde_amqp::to_vec(&AmqpValue(Value::String("body".into()))).expect("encode"));
    let message = AmqpMessage::decode(&bytes).expect("the rest still decodes");
    assert_eq!(message.unread.len(), 1);
    assert_eq!(message.encode().expect("encode").as_ref(), bytes.as_slice());
    assert_eq!(to_delivery(&message, context()).body, b"body");
    // A scheduled copy cannot add its time to them: it carries only that.
    let due = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
    let copy = message.copy(1, Some(due));
    assert!(copy.unread.is_empty());
    assert!(copy.message_annotations.is_some());
}

#[test]
fn an_annotation_is_added_and_every_other_section_stays_as_it_was() {
    let mut with_header = message();
    with_header.header = Some(Header {
        durable: true,
        ..Header::default()
    });
    let payload = with_header.encode().expect("encode");
    let annotated = annotate(&payload, "x-opt-why", "because").expect("annotated");
    let decoded = AmqpMessage::decode(&annotated).expect("decode");
    let why = decoded
        .message_annotations
        .as_ref()
        .and_then(|a| a.0.get(&OwnedKey::Symbol(Symbol::from("x-opt-why"))));
    assert_eq!(why, Some(&Value::String("because".into())));
    assert_eq!(
        AmqpMessage {
            message_annotations: None,
            ..decoded
        },
        with_header
    );
    // Once more, into the annotations now there: one section, two keys.
    let twice = annotate(&annotated, "x-opt-more", "yes").expect("annotated");
    let sections = limits::sections(&twice).expect("sections");
    let codes: Vec<u64> = sections.iter().map(|(code, _)| *code).collect();
    assert_eq!(codes, [0x70, 0x72, 0x73, 0x74, 0x77]);
    let decoded = AmqpMessage::decode(&twice).expect("decode");
    assert_eq!(decoded.message_annotations.expect("annotations").0.len(), 2);
    // What has no sections to find travels as it is.
    assert_eq!(annotate(&[0x00, 0x53, 0x75, 0xa0, 0x10], "k", "v"), None);
}

/// Found by fuzzing: serde_amqp 0.18 writes an array of empty lists with an
/// element size it cannot read back. The host refuses to publish what it
/// could not read itself.
#[test]
fn what_would_not_decode_is_never_encoded() {
    let payload = [0x00, 0x53, 0x77, 0xf0, 0, 0, 0, 5, 0, 0, 0, 5, 0x45];
    let message = AmqpMessage::decode(&payload).expect("a valid array of empty lists");
    let error = message
        .encode()
        .expect_err("the encoder's output is malformed");
    assert!(error.as_str().contains("cannot be read back"), "{error}");
}

/// A delivery with every section a copy keeps or changes.
fn full_delivery() -> AmqpMessage {
    let mut m = message();
    m.header = Some(Header {
        durable: true,
        delivery_count: 4,
        ..Header::default()
    });
    m.message_annotations = Some(
        MessageAnnotations::builder()
            .insert(Symbol::from("x-opt-keep"), Value::String("kept".into()))
            .insert(Symbol::from("x-delivery-count"), Value::Long(4))
            .insert(Symbol::from("traceparent"), Value::String("old".into()))
            .build(),
    );
    let properties = m.application_properties.get_or_insert_with(Vec::new);
    properties.push((RETRY_COUNT_PROPERTY.to_owned(), Value::Uint(1)));
    properties.push((ARTEMIS_DUPLICATE_ID.to_owned(), Value::String("d-1".into())));
    properties.push(("_AMQ_ROUTE_TO".to_owned(), Value::String("x".into())));
    m
}

#[test]
fn a_copy_from_the_bytes_reads_as_the_decoded_copy() {
    let delivery = full_delivery();
    let payload = delivery.encode().expect("encode");
    let due = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    for due in [None, Some(due)] {
        let of = CopyOf {
            retry_count: 2,
            due,
            ..CopyOf::default()
        };
        let copy = copy_payload(&payload, &delivery, of).expect("copied");
        let read = AmqpMessage::decode(&copy).expect("the copy decodes");
        let mut expected = delivery.copy(2, due);
        // The annotations the decoded copy keeps in its own order.
        let annotations = |m: &AmqpMessage| {
            let mut all: Vec<String> = m
                .message_annotations
                .iter()
                .flat_map(|a| a.0.iter().map(|(k, v)| format!("{k:?}={v:?}")))
                .collect();
            all.sort();
            all
        };
        assert_eq!(annotations(&read), annotations(&expected));
        expected.message_annotations = read.message_annotations.clone();
        assert_eq!(read, expected);
    }
}

#[test]
fn a_copy_carries_its_trace_and_seal() {
    let delivery = full_delivery();
    let payload = delivery.encode().expect("encode");
    let key = crate::retry_key::RetryKey::new(b"k".to_vec());
    let trace = crate::trace::TraceContext::parse(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    .expect("a valid context");
    let of = CopyOf {
        retry_count: 3,
        trace: Some(&trace),
        seal: Some(&key),
        ..CopyOf::default()
    };
    let copy = AmqpMessage::decode(&copy_payload(&payload, &delivery, of).expect("copied"))
        .expect("decodes");
    assert!(copy.retry_count_verifies(&key));
    assert_eq!(copy.counters().retry_count, Some(3));
    assert_eq!(
        copy.property("traceparent"),
        Some(&Value::String(trace.traceparent()))
    );
    let annotations = copy.message_annotations.expect("annotations kept");
    assert!(
        annotations
            .0
            .get(&OwnedKey::Symbol(Symbol::from("traceparent")))
            .is_none()
    );
}

/// What the encoder cannot write back is copied as it arrived: the copy
/// of a 13-byte message whose body is an array of empty lists is built,
/// and reads back to the same body.
#[test]
fn a_body_the_encoder_cannot_write_is_copied_as_it_arrived() {
    let payload = [0x00, 0x53, 0x77, 0xf0, 0, 0, 0, 5, 0, 0, 0, 2, 0x45];
    let message = AmqpMessage::decode(&payload).expect("a valid array of empty lists");
    assert!(message.encode().is_err());
    let of = CopyOf {
        retry_count: 1,
        ..CopyOf::default()
    };
    let copy = copy_payload(&payload, &message, of).expect("copied from the bytes");
    assert!(copy.ends_with(&payload));
    let read = AmqpMessage::decode(&copy).expect("the copy decodes");
    assert_eq!(read.body, message.body);
    assert_eq!(read.counters().retry_count, Some(1));
    // And a property value of that kind travels too.
    let mut with_property = vec![0x00, 0x53, 0x74, 0xc1, 0x0e, 0x02, 0xa1, 0x01, b'k'];
    with_property.extend_from_slice(&[0xf0, 0, 0, 0, 5, 0, 0, 0, 2, 0x45]);
    with_property.extend_from_slice(&[0x00, 0x53, 0x77, 0xa1, 0x01, b'x']);
    let message = AmqpMessage::decode(&with_property).expect("decodes");
    let copy = copy_payload(&with_property, &message, of).expect("copied");
    let read = AmqpMessage::decode(&copy).expect("the copy decodes");
    assert_eq!(read.property("k"), message.property("k"));
}

#[test]
fn a_long_message_id_is_digested_in_the_identity() {
    let mut m = message();
    m.properties = Some(
        Properties::builder()
            .message_id("i".repeat(100_000))
            .build(),
    );
    let identity = m.identity();
    assert!(
        identity.starts_with("sha256:") && identity.len() < 40,
        "{identity}"
    );
    let mut other = m.clone();
    other.properties = Some(
        Properties::builder()
            .message_id("j".repeat(100_000))
            .build(),
    );
    assert_ne!(other.identity(), identity);
}

#[test]
fn a_binary_key_is_named_by_its_place_and_type_not_its_bytes() {
    let key = vec![0xab; 40_000];
    let mut map = OrderedMap::new();
    map.insert(Value::Binary(Binary::from(key)), Value::Int(1));
    let section = serde_amqp::described::Described {
        descriptor: serde_amqp::descriptor::Descriptor::Code(0x74),
        value: Value::Map(map),
    };
    let mut payload = serde_amqp::to_vec(&section).expect("encode");
    payload.extend_from_slice(&[0x00, 0x53, 0x77, 0xa1, 0x01, b'x']);
    let failure = AmqpMessage::decode(&payload).expect_err("not a string key");
    assert_eq!(
        failure.as_str(),
        "application property 1 has a key of type binary, not a string"
    );
}
