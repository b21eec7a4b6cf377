//! wharf: runs WebAssembly component handlers on AMQP 1.0 deliveries.

pub mod config;
pub mod settlement;
