//! Watching a running host from outside: Prometheus metrics and a health
//! check on an optional HTTP listener (`[admin] listen = "127.0.0.1:9090"`),
//! which also pauses and resumes mounts.

pub mod client;
mod http;
mod metrics;

pub use http::{AdminServer, Health, MAX_CONNECTIONS};
pub use metrics::{Metrics, MountMetrics};
