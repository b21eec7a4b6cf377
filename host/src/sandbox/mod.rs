//! The wasm side: one engine, compiled handler modules, and calls into them
//! under time and memory limits and capability grants.
//!
//! [`Sandbox`] owns the wasmtime engine (one epoch ticker thread) and the
//! linker with everything a handler may import. [`Sandbox::load`] compiles and
//! validates a component once; [`Instances`] runs a mount's deliveries in
//! fresh or reused instances and reports either the handler's outcome or why
//! it failed.

mod cpu;
mod engine;
mod grants;
mod http;
mod instances;
mod module;
mod outbox;
mod output;
mod store;

pub use cpu::CpuLane;
pub use engine::{PoolSize, Sandbox};
pub use grants::{AddressPattern, Denied, Grants, Output, OutputLimits};
pub use http::{BadHttpPattern, HttpGrants, HttpPattern};
pub use instances::{
    Call, CallLimits, InstancePolicy, InstanceSlots, Instances, MemoryBudget, MemoryHeld,
    PoolNeeds, Reserved,
};
pub use module::{Failure, LoadError, LogTags, Module};
pub use outbox::Outgoing;

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

/// Bindings of the first contract, `wit/v0.1.0`: the host still provides
/// its imports, so components built against it keep running. Its `handle`
/// has the same shape as today's, so they are called alike.
pub mod bindings_0_1 {
    #![allow(missing_docs)]
    wasmtime::component::bindgen!({
        path: "../wit/v0.1.0",
        world: "handler",
    });
}

pub use bindings::wharf::handler::outbox::{Message as OutboxMessage, SendError};
pub use bindings::wharf::handler::types::{Delivery, Outcome, Property, Value};
