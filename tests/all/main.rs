//! wharf end to end: real brokers, real compiled components.
//!
//! The shared helpers live in the `wharf_tests` library (`tests/src`).

mod artemis;
mod brokers;
mod container;
mod errors;
mod faults;
mod fields;
mod hostile;
mod hostile_handlers;
mod http;
mod kubernetes;
mod languages;
mod limits;
mod oci;
mod operating;
mod ordering;
mod outbox;
mod poison;
mod rabbitmq;
mod rabbitmq4;
mod reload;
mod scale;
mod security;
mod shutdown;
mod spans;
mod tenants;
mod tls;
mod topics;
mod trace_context;
mod untrusted;

pub(crate) use wharf_tests::*;
