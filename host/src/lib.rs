//! wharf: runs WebAssembly component handlers on AMQP 1.0 deliveries.
//!
//! The pieces, each knowing as little of the others as it can:
//! - [`wharf_core`] (config, settlement, grants, messages, addresses):
//!   what decides without sockets or wasm, used by its own paths;
//! - [`sandbox`]: the wasm engine, modules and limits;
//! - [`broker`]: AMQP connections, links and publishing;
//! - [`tenants`]: mounts at work, joining the three above;
//! - [`events`]: what the host did, for anyone watching;
//! - [`logging`]: the log writer, which never blocks the runtime;
//! - [`telemetry`]: spans exported over OTLP;
//! - [`admin`]: metrics and health over HTTP;
//! - [`authoring`]: tools for handler authors (`wharf new`, `invoke`,
//!   `componentize`);
//! - [`kube`]: KEDA objects made from the config;
//! - [`registry`]: modules pulled from and pushed to OCI registries.

pub mod admin;
pub mod authoring;
pub mod broker;
pub mod events;
pub mod kube;
pub mod logging;
pub mod registry;
pub mod sandbox;
mod sync;
pub mod telemetry;
pub mod tenants;

pub use tenants::{Host, HostError, ModulesLoaded, RunningHost};
