//! The wasm side: one engine, compiled handler modules, and calls into them
//! under time and memory limits.
//!
//! [`Sandbox`] owns the wasmtime engine (one epoch ticker thread) and the
//! linker with everything a handler may import. [`Sandbox::load`] compiles and
//! validates a component once; [`Module::call`] runs one delivery in a fresh
//! instance and reports either the handler's outcome or why it failed.

mod engine;
mod module;
mod output;
mod store;

pub use engine::Sandbox;
pub use module::{CallLimits, Failure, LoadError, LogTags, Module};

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
