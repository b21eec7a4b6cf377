//! The wasm side: one engine, compiled handler modules, and calls into them
//! under time and memory limits and capability grants.
//!
//! [`Sandbox`] owns the wasmtime engine (one epoch ticker thread) and the
//! linker with everything a handler may import. [`Sandbox::load`] compiles and
//! validates a component once; [`Instances`] runs a mount's deliveries in
//! fresh or reused instances and reports either the handler's outcome or why
//! it failed.

mod contract;
mod cpu;
mod disk_cache;
mod engine;
mod grants;
mod http;
mod instances;
mod log;
mod module;
mod outbox;
mod output;
mod store;
mod tags;
pub use http::MAX_BODY_CHUNK;
pub use store::{MAX_HEADER_BYTES, MAX_RESOURCES};

pub use cpu::CpuLane;
pub use engine::Sandbox;
pub use grants::Denied;
pub use http::{HttpConnections, MAX_CONNECTIONS_PER_INSTANCE};
pub use instances::{
    Call, CallLimits, InstanceSlots, Instances, MemoryBudget, MemoryHeld, Reserved, TenantShare,
};
pub use module::{Failure, LoadError, Module, PoolNeeds};
pub use outbox::{Outgoing, Owners};
pub use output::GuestLog;
pub use tags::LogTags;

/// Bindings generated from `wit/handler.wit`.
pub mod bindings {
    #![allow(missing_docs)]
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler",
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

/// Bindings of the second contract, `wit/v0.2.0`: the host still provides
/// its imports and calls its `handle`, so components built against it keep
/// running. A 0.1.0 `handle` has the same shape, so those are called alike.
pub mod bindings_0_2 {
    #![allow(missing_docs)]
    wasmtime::component::bindgen!({
        path: "../wit/v0.2.0",
        world: "handler",
        exports: { default: async },
    });
}

/// Bindings of the first contract, `wit/v0.1.0`: the host still provides
/// its `log`.
pub mod bindings_0_1 {
    #![allow(missing_docs)]
    wasmtime::component::bindgen!({
        path: "../wit/v0.1.0",
        world: "handler",
    });
}

pub use bindings::wharf::handler::outbox::{Message as OutboxMessage, SendError};
pub use bindings::wharf::handler::types::{Delivery, Outcome, Property, Value};

impl From<wharf_core::message::Delivery> for Delivery {
    fn from(delivery: wharf_core::message::Delivery) -> Delivery {
        Delivery {
            body: delivery.body,
            content_type: delivery.content_type,
            subject: delivery.subject,
            message_id: delivery.message_id,
            correlation_id: delivery.correlation_id,
            reply_to: delivery.reply_to,
            to: delivery.fields.to,
            user_id: delivery.fields.user_id,
            group_id: delivery.fields.group_id,
            group_sequence: delivery.fields.group_sequence,
            reply_to_group_id: delivery.fields.reply_to_group_id,
            creation_time: delivery.fields.creation_time,
            absolute_expiry_time: delivery.fields.absolute_expiry_time,
            priority: delivery
                .fields
                .priority
                .unwrap_or(wharf_core::message::Fields::DEFAULT_PRIORITY),
            durable: delivery.fields.durable,
            first_acquirer: delivery.fields.first_acquirer,
            properties: properties(delivery.properties),
            annotations: properties(delivery.annotations),
            address: delivery.address,
            tenant: delivery.tenant,
            mount: delivery.mount,
            attempt: delivery.attempt,
            presettled: delivery.presettled,
        }
    }
}

impl From<OutboxMessage> for wharf_core::message::OutputMessage {
    fn from(message: OutboxMessage) -> wharf_core::message::OutputMessage {
        wharf_core::message::OutputMessage {
            body: message.body,
            content_type: message.content_type,
            subject: message.subject,
            message_id: message.message_id,
            correlation_id: message.correlation_id,
            properties: message
                .properties
                .into_iter()
                .map(|p| wharf_core::message::Property {
                    key: p.key,
                    value: p.value.into(),
                })
                .collect(),
            durable: message.durable,
            delay: message.delay,
            group_id: message.group_id,
            group_sequence: message.group_sequence,
            reply_to_group_id: message.reply_to_group_id,
            priority: message.priority,
            creation_time: message.creation_time,
            absolute_expiry_time: message.absolute_expiry_time,
        }
    }
}

fn properties(properties: Vec<wharf_core::message::Property>) -> Vec<Property> {
    properties
        .into_iter()
        .map(|p| Property {
            key: p.key,
            value: p.value.into(),
        })
        .collect()
}

impl From<Value> for wharf_core::message::PropertyValue {
    fn from(value: Value) -> wharf_core::message::PropertyValue {
        use wharf_core::message::PropertyValue as V;
        match value {
            Value::String(s) => V::String(s),
            Value::Int(n) => V::Int(n),
            Value::Uint(n) => V::Uint(n),
            Value::Float(f) => V::Float(f),
            Value::Boolean(b) => V::Boolean(b),
            Value::Bytes(b) => V::Bytes(b),
            Value::Timestamp(ms) => V::Timestamp(ms),
            Value::Null => V::Null,
            Value::Other(text) => V::Other(text),
        }
    }
}

impl From<wharf_core::message::PropertyValue> for Value {
    fn from(value: wharf_core::message::PropertyValue) -> Value {
        use wharf_core::message::PropertyValue as V;
        match value {
            V::String(s) => Value::String(s),
            V::Int(n) => Value::Int(n),
            V::Uint(n) => Value::Uint(n),
            V::Float(f) => Value::Float(f),
            V::Boolean(b) => Value::Boolean(b),
            V::Bytes(b) => Value::Bytes(b),
            V::Timestamp(ms) => Value::Timestamp(ms),
            V::Null => Value::Null,
            V::Other(text) => Value::Other(text),
        }
    }
}
