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
mod instances;
mod module;
mod output;
mod store;

pub use cpu::CpuLane;
pub use engine::{PoolSize, Sandbox};
pub use grants::{Denied, Grants, Output};
pub use instances::{
    CallLimits, InstancePolicy, InstanceSlots, Instances, MemoryBudget, MemoryHeld, PoolNeeds,
    Reserved,
};
pub use module::{Failure, LoadError, LogTags, Module};

/// Bindings generated from `wit/handler.wit`.
pub mod bindings {
    #![allow(missing_docs)]
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler",
        exports: { default: async },
    });
}

pub use bindings::wharf::handler::types::{Delivery, Outcome, Property, Value};
