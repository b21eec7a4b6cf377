//! Ordered mounts: deliveries with the same key run one at a time, in the
//! order the broker delivered them; different keys run side by side.
//!
//! The key is read from each message as the mount's `order_by` says
//! ([`key_of`]) and kept as a digest, so a publisher's choice of key costs
//! the host the same few bytes whatever it is. A [`Sequencer`] then holds
//! each key's later deliveries behind the one running.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use serde::Deserialize;

use crate::brokers::BrokerKind;
use crate::message::AmqpMessage;
use crate::text::shown_up_to;

/// What a mount orders its deliveries by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderBy {
    /// `properties.group-id`: the key brokers with message groups use.
    GroupId,
    /// An application property's value, with its AMQP type: the string
    /// `"7"` and the integer `7` are different keys.
    Property(String),
}

impl OrderBy {
    /// The prefix of `order_by = "property:<name>"`.
    pub const PROPERTY: &str = "property:";

    /// Reads `order_by` as the config writes it.
    pub fn parse(text: &str) -> Result<OrderBy, String> {
        if text == "group-id" {
            return Ok(OrderBy::GroupId);
        }
        match text.strip_prefix(Self::PROPERTY) {
            Some("") => Err("`property:` needs the name of an application property".to_owned()),
            Some(name) => Ok(OrderBy::Property(name.to_owned())),
            None => Err(format!(
                "`{}` is neither \"group-id\" nor \"property:<name>\"",
                shown_up_to(text, 64)
            )),
        }
    }
}

impl std::fmt::Display for OrderBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OrderBy::GroupId => f.write_str("group-id"),
            OrderBy::Property(name) => write!(f, "{}{name}", Self::PROPERTY),
        }
    }
}

impl<'de> Deserialize<'de> for OrderBy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OrderBy, D::Error> {
        let text = String::deserialize(d)?;
        OrderBy::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// What order a mount ordered by `order_by` keeps across replicas (more
/// than one wharf on its queue) on a broker of `kind`, as `wharf check`
/// and the attach log say it. Within one host a key is always one at a
/// time, in the order the broker delivered.
pub fn across_replicas(order_by: &OrderBy, kind: BrokerKind) -> &'static str {
    match (order_by, kind) {
        (OrderBy::GroupId, BrokerKind::Artemis | BrokerKind::ActiveMqClassic) => {
            "across replicas too: the broker's message groups give each group-id to one consumer at a time"
        }
        (OrderBy::Property(_), BrokerKind::Artemis | BrokerKind::ActiveMqClassic) => {
            "within this host only: the broker groups by group-id, not by this property; have publishers set group-id to the key and order by group-id, or run one replica"
        }
        (_, BrokerKind::RabbitMq) => {
            "within this host only: RabbitMQ has no message groups; run one replica, declare the queue with x-single-active-consumer, or spread keys with a consistent-hash exchange over queues with one mount each"
        }
        (_, BrokerKind::QpidBrokerJ | BrokerKind::Other) => {
            "within this host only: wharf relies on no message groups there; run one replica, or one consumer on the queue"
        }
    }
}

/// A key as the host keeps it: the first 16 bytes of the SHA-256 digest of
/// what the message carries.
pub type Key = [u8; 16];

/// The longest key a span or a log line shows, in bytes.
pub const SHOWN_KEY_BYTES: usize = 64;

/// The key of `message` on a mount ordered by `order_by`; `None` when the
/// message carries none: it runs unordered.
pub fn key_of(order_by: &OrderBy, message: &AmqpMessage) -> Option<Key> {
    use sha2::Digest as _;
    let full = match order_by {
        OrderBy::GroupId => sha2::Sha256::digest(group_id(message)?.as_bytes()),
        // The value's encoding tells types apart; it cannot fail for a
        // value that was decoded.
        OrderBy::Property(name) => {
            sha2::Sha256::digest(serde_amqp::to_vec(message.property(name)?).ok()?)
        }
    };
    let mut key = [0; 16];
    key.copy_from_slice(&full[..16]);
    Some(key)
}

/// The key of `message` as a person reads it: bounded to
/// [`SHOWN_KEY_BYTES`], escaped. Only for what is shown (a span), so the
/// text is made only when it is.
pub fn shown_key(order_by: &OrderBy, message: &AmqpMessage) -> Option<String> {
    let shown = match order_by {
        OrderBy::GroupId => shown_up_to(group_id(message)?, SHOWN_KEY_BYTES).to_string(),
        OrderBy::Property(name) => {
            let text = crate::message::property_text(message.property(name)?);
            shown_up_to(&text, SHOWN_KEY_BYTES).to_string()
        }
    };
    Some(shown)
}

fn group_id(message: &AmqpMessage) -> Option<&String> {
    message.properties.as_ref()?.group_id.as_ref()
}

/// Each key's deliveries in arrival order: the first one runs, the others
/// wait for it. `T` is what a waiting delivery is woken with.
#[derive(Debug)]
pub struct Sequencer<T> {
    keys: HashMap<Key, VecDeque<Waiting<T>>>,
    waiting: usize,
}

#[derive(Debug)]
struct Waiting<T> {
    item: T,
    since: Instant,
}

impl<T> Default for Sequencer<T> {
    fn default() -> Self {
        Sequencer {
            keys: HashMap::new(),
            waiting: 0,
        }
    }
}

impl<T> Sequencer<T> {
    /// A delivery of `key` arrived: it runs now (`Some(item)` back) when
    /// its key has nothing running, or waits behind the ones before it.
    pub fn arrive(&mut self, key: Key, item: T, now: Instant) -> Option<T> {
        match self.keys.get_mut(&key) {
            Some(queue) => {
                queue.push_back(Waiting { item, since: now });
                self.waiting += 1;
                None
            }
            None => {
                self.keys.insert(key, VecDeque::new());
                Some(item)
            }
        }
    }

    /// The delivery running for `key` is settled: the next one of the key
    /// runs (returned), or the key is forgotten.
    pub fn done(&mut self, key: &Key) -> Option<T> {
        let queue = self.keys.get_mut(key)?;
        match queue.pop_front() {
            Some(next) => {
                self.waiting -= 1;
                Some(next.item)
            }
            None => {
                self.keys.remove(key);
                None
            }
        }
    }

    /// Keys with a delivery running or waiting.
    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    /// Deliveries waiting behind their key's running one.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// When the delivery waiting longest arrived.
    pub fn oldest_waiting(&self) -> Option<Instant> {
        self.keys
            .values()
            .filter_map(|queue| queue.front().map(|w| w.since))
            .min()
    }
}

#[cfg(test)]
mod tests;
