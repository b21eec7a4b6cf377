use std::collections::HashMap;
use std::time::{Duration, Instant};

use fe2o3_amqp_types::messaging::Properties;
use proptest::prelude::*;
use serde_amqp::Value;

use super::*;

fn with_group(group: &str) -> AmqpMessage {
    let mut message = AmqpMessage::empty();
    message.properties = Some(Properties {
        group_id: Some(group.to_owned()),
        ..Properties::default()
    });
    message
}

fn with_property(name: &str, value: Value) -> AmqpMessage {
    let mut message = AmqpMessage::empty();
    message.application_properties = Some(vec![(name.to_owned(), value)]);
    message
}

#[test]
fn order_by_reads_as_the_config_writes_it() {
    assert_eq!(OrderBy::parse("group-id"), Ok(OrderBy::GroupId));
    assert_eq!(
        OrderBy::parse("property:account"),
        Ok(OrderBy::Property("account".into()))
    );
    assert!(OrderBy::parse("property:").is_err());
    assert!(OrderBy::parse("group").is_err());
    assert_eq!(OrderBy::Property("a".into()).to_string(), "property:a");
}

#[test]
fn keys_come_from_the_group_or_the_property_with_its_type() {
    let group = OrderBy::GroupId;
    let a = key_of(&group, &with_group("order-1")).expect("a key");
    assert_eq!(
        shown_key(&group, &with_group("order-1")).as_deref(),
        Some("order-1")
    );
    assert_eq!(key_of(&group, &with_group("order-1")), Some(a));
    assert_ne!(key_of(&group, &with_group("order-2")), Some(a));
    assert_eq!(key_of(&group, &AmqpMessage::empty()), None);

    let account = OrderBy::Property("account".into());
    let text = key_of(
        &account,
        &with_property("account", Value::String("7".into())),
    );
    let seven = with_property("account", Value::Long(7));
    let number = key_of(&account, &seven);
    assert!(text.is_some() && number.is_some());
    assert_ne!(text, number);
    assert_eq!(shown_key(&account, &seven).as_deref(), Some("7"));
    assert_eq!(
        key_of(&account, &with_property("other", Value::Long(7))),
        None
    );
}

#[test]
fn a_long_key_is_shown_cut() {
    let long = "k".repeat(10_000);
    let shown = shown_key(&OrderBy::GroupId, &with_group(&long)).expect("a key");
    assert!(shown.len() <= SHOWN_KEY_BYTES + 16, "{}", shown.len());
}

#[test]
fn a_key_runs_one_at_a_time_and_is_forgotten_when_idle() {
    let now = Instant::now();
    let mut sequencer = Sequencer::default();
    assert_eq!(sequencer.arrive([1; 16], "a1", now), Some("a1"));
    assert_eq!(sequencer.arrive([1; 16], "a2", now), None);
    assert_eq!(sequencer.arrive([2; 16], "b1", now), Some("b1"));
    assert_eq!(
        sequencer.arrive([1; 16], "a3", now + Duration::from_secs(1)),
        None
    );
    assert_eq!((sequencer.keys(), sequencer.waiting()), (2, 2));
    assert_eq!(sequencer.oldest_waiting(), Some(now));
    assert_eq!(sequencer.done(&[1; 16]), Some("a2"));
    assert_eq!(
        sequencer.oldest_waiting(),
        Some(now + Duration::from_secs(1))
    );
    assert_eq!(sequencer.done(&[2; 16]), None);
    assert_eq!(sequencer.done(&[1; 16]), Some("a3"));
    assert_eq!(sequencer.done(&[1; 16]), None);
    assert_eq!((sequencer.keys(), sequencer.waiting()), (0, 0));
    assert_eq!(sequencer.oldest_waiting(), None);
}

/// One step of a random run: a delivery of a key arrives, or one of the
/// running ones (by index) finishes.
#[derive(Debug, Clone)]
enum Step {
    Arrive(u8),
    Finish(usize),
}

proptest! {
    /// Whatever the arrivals and finishing order: never two of a key at
    /// once, each key's deliveries run in arrival order, and every one
    /// runs once all running ones finish.
    #[test]
    fn one_at_a_time_in_arrival_order_nothing_lost(
        steps in prop::collection::vec(
            prop_oneof![(0u8..6).prop_map(Step::Arrive), (0usize..8).prop_map(Step::Finish)],
            0..200,
        )
    ) {
        let now = Instant::now();
        let mut sequencer = Sequencer::default();
        let mut arrived: HashMap<u8, Vec<u32>> = HashMap::new();
        let mut ran: HashMap<u8, Vec<u32>> = HashMap::new();
        let mut running: Vec<(u8, u32)> = Vec::new();
        let mut next = 0u32;
        let start = |running: &mut Vec<(u8, u32)>, ran: &mut HashMap<u8, Vec<u32>>, key: u8, n: u32| {
            assert!(running.iter().all(|(k, _)| *k != key), "key {key} twice at once");
            running.push((key, n));
            ran.entry(key).or_default().push(n);
        };
        for step in steps {
            match step {
                Step::Arrive(key) => {
                    next += 1;
                    arrived.entry(key).or_default().push(next);
                    if let Some(n) = sequencer.arrive([key; 16], next, now) {
                        start(&mut running, &mut ran, key, n);
                    }
                }
                Step::Finish(i) if !running.is_empty() => {
                    let (key, _) = running.remove(i % running.len());
                    if let Some(n) = sequencer.done(&[key; 16]) {
                        start(&mut running, &mut ran, key, n);
                    }
                }
                Step::Finish(_) => {}
            }
        }
        while let Some((key, _)) = running.pop() {
            if let Some(n) = sequencer.done(&[key; 16]) {
                start(&mut running, &mut ran, key, n);
            }
        }
        prop_assert_eq!(ran, arrived);
        prop_assert_eq!((sequencer.keys(), sequencer.waiting()), (0, 0));
    }
}
