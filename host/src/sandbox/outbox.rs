//! The `outbox` import: messages a handler publishes, kept for the length of
//! its call. The host publishes them only if the handler acknowledges its
//! delivery, before it accepts the delivery.

use std::sync::{Arc, RwLock};

use wasmtime::component::HasData;
use wharf_core::brokers::BrokerKind;
use wharf_core::grants::{AddressOwners, Grants, Refusal};
use wharf_core::message::OutputMessage;
use wharf_core::message::reserved_property;
use wharf_core::text::{SHOWN_BYTES, Untrusted, shown};

use super::bindings::wharf::handler::outbox::{Host, Message, SendError};
use super::output::GuestLog;
use super::{Delivery, Value};
use crate::sync::ReadWrite;

/// What every tenant of the host owns, shared by all instances and replaced
/// when the config is reloaded: no tenant's reply may reach another's.
#[derive(Clone, Default)]
pub struct Owners(Arc<RwLock<Arc<AddressOwners>>>);

impl Owners {
    /// Replaces what the tenants own, for every instance at once.
    pub fn replace(&self, owners: AddressOwners) {
        *self.0.writing() = Arc::new(owners);
    }

    fn current(&self) -> Arc<AddressOwners> {
        self.0.reading().clone()
    }
}

impl From<AddressOwners> for Owners {
    fn from(owners: AddressOwners) -> Owners {
        Owners(Arc::new(RwLock::new(Arc::new(owners))))
    }
}

/// One message a handler asked to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// Where it goes: a granted address, or the delivery's `reply-to`,
    /// checked as the broker reads it.
    pub address: Untrusted,
    /// What goes.
    pub message: OutputMessage,
}

/// What one call has sent so far, and what it may still send.
pub(crate) struct Outbox {
    outputs: Vec<Outgoing>,
    bytes: u64,
    reply_to: Option<Untrusted>,
    /// What a reply's `correlation-id` defaults to.
    correlation: Option<String>,
    /// The kind of broker the outputs go to, which decides how their
    /// addresses are read.
    broker: BrokerKind,
}

impl Default for Outbox {
    fn default() -> Outbox {
        Outbox {
            outputs: Vec::new(),
            bytes: 0,
            reply_to: None,
            correlation: None,
            broker: BrokerKind::Other,
        }
    }
}

impl Outbox {
    /// Empties the outbox for a call on `delivery`, from a broker of kind
    /// `broker`.
    pub(crate) fn begin(&mut self, delivery: &Delivery, broker: BrokerKind) {
        self.outputs.clear();
        self.bytes = 0;
        self.broker = broker;
        self.reply_to = delivery.reply_to.clone().map(Untrusted::from);
        self.correlation = delivery
            .correlation_id
            .clone()
            .or_else(|| delivery.message_id.clone());
    }

    /// The kind of broker the outputs go to.
    pub(crate) fn broker(&self) -> BrokerKind {
        self.broker
    }

    /// What the call sent, in order.
    pub(crate) fn take(&mut self) -> Vec<Outgoing> {
        self.bytes = 0;
        std::mem::take(&mut self.outputs)
    }
}

/// The bytes an output counts against `max_output_bytes`: its address, body,
/// strings and properties.
fn size(address: &Untrusted, message: &Message) -> u64 {
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let properties: usize = message
        .properties
        .iter()
        .map(|p| {
            p.key.len()
                + match &p.value {
                    Value::String(s) | Value::Other(s) => s.len(),
                    Value::Bytes(b) => b.len(),
                    _ => 8,
                }
        })
        .sum();
    (address.len()
        + message.body.len()
        + text(&message.content_type)
        + text(&message.subject)
        + text(&message.message_id)
        + text(&message.correlation_id)
        + text(&message.group_id)
        + text(&message.reply_to_group_id)
        + properties) as u64
}

/// The outbox of one call, and what checking a message against the
/// mount's grants needs: what the `outbox` import sees of the store.
pub(crate) struct OutboxView<'a> {
    /// What the call has sent.
    pub(crate) outbox: &'a mut Outbox,
    /// What the mount grants.
    pub(crate) grants: &'a Grants,
    /// What the host's tenants own.
    pub(crate) owners: &'a Owners,
    /// The tenant sending.
    pub(crate) tenant: &'a str,
    /// Its log allowance, which refusals are charged to.
    pub(crate) log: &'a GuestLog,
}

/// The `outbox` import's part of the store.
pub(crate) struct HasOutbox;

impl HasData for HasOutbox {
    type Data<'a> = OutboxView<'a>;
}

impl OutboxView<'_> {
    fn keep_output(&mut self, address: Untrusted, message: Message) -> Result<(), SendError> {
        if let Some(reserved) = message
            .properties
            .iter()
            .find(|p| reserved_property(&p.key))
        {
            return self.denied(
                "message",
                &address,
                &format!(
                    "it sets `{}`, a property the broker reserves",
                    shown(&reserved.key)
                ),
            );
        }
        let limits = self.grants.outputs;
        let outbox = &mut *self.outbox;
        if outbox.outputs.len() >= limits.max_outputs as usize {
            return Err(SendError::TooMany);
        }
        let bytes = outbox.bytes + size(&address, &message);
        if bytes > limits.max_output_bytes {
            return Err(SendError::TooLarge);
        }
        outbox.bytes = bytes;
        outbox.outputs.push(Outgoing {
            address,
            message: message.into(),
        });
        Ok(())
    }

    /// Logs why an output was refused, the address bounded and escaped,
    /// and tells the handler.
    fn refused(&self, what: &str, address: &Untrusted, refusal: Refusal) -> Result<(), SendError> {
        match refusal {
            Refusal::TooLarge => Err(SendError::TooLarge),
            Refusal::Denied(why) => self.denied(what, address, &why),
        }
    }

    fn denied(&self, what: &str, address: &Untrusted, why: &str) -> Result<(), SendError> {
        // Charged to the tenant's log_rate: a handler asking again and
        // again cannot flood the log.
        if self.log.take(why.len() + SHOWN_BYTES) {
            tracing::warn!(
                address = %address,
                "the handler's {what} was denied: {why}"
            );
        }
        Err(SendError::Denied)
    }
}

impl Host for OutboxView<'_> {
    fn send(&mut self, address: String, message: Message) -> Result<(), SendError> {
        let address = Untrusted::from(address);
        let checked = self.owners.current().check_send(
            self.outbox.broker,
            self.tenant,
            &self.grants.send,
            &address,
        );
        if let Err(refusal) = checked {
            return self.refused("send", &address, refusal);
        }
        self.keep_output(address, message)
    }

    fn reply(&mut self, mut message: Message) -> Result<(), SendError> {
        let grant = &self.grants.reply;
        let Some(address) = self.outbox.reply_to.clone().filter(|a| !a.is_empty()) else {
            if !grant.granted() {
                return self.denied(
                    "reply",
                    &Untrusted::default(),
                    "the mount does not grant `reply`",
                );
            }
            return Err(SendError::NoReplyTo);
        };
        let checked =
            self.owners
                .current()
                .check_reply(self.outbox.broker, self.tenant, grant, &address);
        if let Err(refusal) = checked {
            return self.refused("reply", &address, refusal);
        }
        if message.correlation_id.is_none() {
            message.correlation_id.clone_from(&self.outbox.correlation);
        }
        self.keep_output(address, message)
    }
}
