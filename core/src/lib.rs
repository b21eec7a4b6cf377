//! wharf's pure core: what the host decides without a socket or a wasm
//! engine, so it can be tested, fuzzed and read on its own.
//!
//! - [`config`]: the `wharf.toml` file, checked with line numbers;
//! - [`settlement`]: the contract, a pure function from outcome to plan;
//! - [`message`]: AMQP messages section by section, decoded within limits,
//!   and what a handler sees of them;
//! - [`grants`]: what a mount's handlers may reach (addresses, origins);
//! - [`endpoint`], [`tls`]: where a broker is and how to trust it;
//! - [`retry_key`]: the key copies' retry counts are sealed with;
//! - [`backoff`]: waits between attempts;
//! - [`oci`]: modules named by their place in an OCI registry;
//! - [`ordering`]: ordered mounts, one delivery of a key at a time;
//! - [`words`]: AMQP conditions and outcomes as a person reads them.

pub mod address;
pub mod backoff;
pub mod breaker;
pub mod brokers;
pub mod config;
pub mod endpoint;
pub mod grants;
pub mod message;
pub mod oci;
pub mod ordering;
pub mod retry_key;
pub mod sampler;
pub mod settlement;
pub mod text;
pub mod tls;
pub mod trace;
pub mod words;
