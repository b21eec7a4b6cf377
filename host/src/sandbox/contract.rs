//! Which version of the handler contract a component was built against,
//! and calls into it: components of 0.3.0 (`wit/handler.wit`) are called as
//! they are; those of 0.2.0 and 0.1.0 see a 0.2.0 delivery, and their
//! `log` and 0.2.0 `outbox` are served as today's.

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::bindings;
use super::bindings_0_1 as first;
use super::bindings_0_2 as earlier;
use super::bindings_0_2::wharf::handler::types as earlier_types;
use super::log::LogView;
use super::outbox::OutboxView;
use super::store::StoreState;
use super::{Delivery, OutboxMessage, Outcome, Property, SendError, Value};

/// A compiled component's instance template, for the contract it exports.
pub(super) enum HandlerPre {
    Current(bindings::HandlerPre<StoreState>),
    Earlier(earlier::HandlerPre<StoreState>),
}

/// An instantiated component.
pub(super) enum Handler {
    Current(bindings::Handler),
    Earlier(earlier::Handler),
}

impl HandlerPre {
    /// The template of a component exporting today's `handle`, or the
    /// earlier contracts' one; the error names what today's wants.
    pub(super) fn new(pre: InstancePre<StoreState>) -> wasmtime::Result<HandlerPre> {
        match bindings::HandlerPre::new(pre.clone()) {
            Ok(current) => Ok(HandlerPre::Current(current)),
            Err(current) => earlier::HandlerPre::new(pre)
                .map(HandlerPre::Earlier)
                .map_err(|_| current),
        }
    }

    pub(super) async fn instantiate_async(
        &self,
        store: &mut Store<StoreState>,
    ) -> wasmtime::Result<Handler> {
        Ok(match self {
            HandlerPre::Current(pre) => Handler::Current(pre.instantiate_async(store).await?),
            HandlerPre::Earlier(pre) => Handler::Earlier(pre.instantiate_async(store).await?),
        })
    }
}

impl Handler {
    /// Calls the component's `handle` with `delivery`, as much of it as its
    /// contract shows.
    pub(super) async fn call_handle(
        &self,
        store: &mut Store<StoreState>,
        delivery: &Delivery,
    ) -> wasmtime::Result<Outcome> {
        match self {
            Handler::Current(handler) => handler.call_handle(store, delivery).await,
            Handler::Earlier(handler) => {
                let outcome = handler
                    .call_handle(store, &earlier_delivery(delivery))
                    .await?;
                Ok(match outcome {
                    earlier_types::Outcome::Ack => Outcome::Ack,
                    earlier_types::Outcome::Retry => Outcome::Retry,
                    earlier_types::Outcome::RetryAfter(ms) => Outcome::RetryAfter(ms),
                    earlier_types::Outcome::Drop => Outcome::Drop,
                })
            }
        }
    }
}

fn earlier_delivery(delivery: &Delivery) -> earlier_types::Delivery {
    let properties = |list: &[Property]| {
        list.iter()
            .map(|p| earlier_types::Property {
                key: p.key.clone(),
                value: earlier_value(&p.value),
            })
            .collect()
    };
    earlier_types::Delivery {
        body: delivery.body.clone(),
        content_type: delivery.content_type.clone(),
        subject: delivery.subject.clone(),
        message_id: delivery.message_id.clone(),
        correlation_id: delivery.correlation_id.clone(),
        reply_to: delivery.reply_to.clone(),
        properties: properties(&delivery.properties),
        address: delivery.address.clone(),
        tenant: delivery.tenant.clone(),
        mount: delivery.mount.clone(),
        attempt: delivery.attempt,
        presettled: delivery.presettled,
    }
}

fn earlier_value(value: &Value) -> earlier_types::Value {
    use earlier_types::Value as E;
    match value.clone() {
        Value::String(s) => E::String(s),
        Value::Int(n) => E::Int(n),
        Value::Uint(n) => E::Uint(n),
        Value::Float(f) => E::Float(f),
        Value::Boolean(b) => E::Boolean(b),
        Value::Bytes(b) => E::Bytes(b),
        Value::Timestamp(ms) => E::Timestamp(ms),
        Value::Null => E::Null,
        Value::Other(text) => E::Other(text),
    }
}

fn current_value(value: earlier_types::Value) -> Value {
    use earlier_types::Value as E;
    match value {
        E::String(s) => Value::String(s),
        E::Int(n) => Value::Int(n),
        E::Uint(n) => Value::Uint(n),
        E::Float(f) => Value::Float(f),
        E::Boolean(b) => Value::Boolean(b),
        E::Bytes(b) => Value::Bytes(b),
        E::Timestamp(ms) => Value::Timestamp(ms),
        E::Null => Value::Null,
        E::Other(text) => Value::Other(text),
    }
}

/// A 0.2.0 message as today's, with none of the fields 0.3.0 added.
fn current_message(message: earlier::wharf::handler::outbox::Message) -> OutboxMessage {
    OutboxMessage {
        body: message.body,
        content_type: message.content_type,
        subject: message.subject,
        message_id: message.message_id,
        correlation_id: message.correlation_id,
        properties: message
            .properties
            .into_iter()
            .map(|p| Property {
                key: p.key,
                value: current_value(p.value),
            })
            .collect(),
        durable: message.durable,
        delay: message.delay,
        group_id: None,
        group_sequence: None,
        reply_to_group_id: None,
        priority: None,
        creation_time: None,
        absolute_expiry_time: None,
    }
}

fn earlier_error(error: SendError) -> earlier::wharf::handler::outbox::SendError {
    use earlier::wharf::handler::outbox::SendError as E;
    match error {
        SendError::Denied => E::Denied,
        SendError::TooMany => E::TooMany,
        SendError::TooLarge => E::TooLarge,
        SendError::NoReplyTo => E::NoReplyTo,
    }
}

impl earlier::wharf::handler::outbox::Host for OutboxView<'_> {
    fn send(
        &mut self,
        address: String,
        message: earlier::wharf::handler::outbox::Message,
    ) -> Result<(), earlier::wharf::handler::outbox::SendError> {
        bindings::wharf::handler::outbox::Host::send(self, address, current_message(message))
            .map_err(earlier_error)
    }

    fn reply(
        &mut self,
        message: earlier::wharf::handler::outbox::Message,
    ) -> Result<(), earlier::wharf::handler::outbox::SendError> {
        bindings::wharf::handler::outbox::Host::reply(self, current_message(message))
            .map_err(earlier_error)
    }
}

/// Each earlier version's `log` writes as today's does.
macro_rules! log_as_today {
    ($($module:ident)::+) => {
        impl $($module)::+::Host for LogView<'_> {
            fn log(&mut self, level: $($module)::+::Level, message: String) {
                use $($module)::+::Level as Earlier;
                use bindings::wharf::handler::log::Level;
                let level = match level {
                    Earlier::Trace => Level::Trace,
                    Earlier::Debug => Level::Debug,
                    Earlier::Info => Level::Info,
                    Earlier::Warn => Level::Warn,
                    Earlier::Error => Level::Error,
                };
                bindings::wharf::handler::log::Host::log(self, level, message);
            }
        }
    };
}

log_as_today!(earlier::wharf::handler::log);
log_as_today!(first::wharf::handler::log);
