//! What a mount's delivery tasks share while its links are up.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::MountSpec;
use crate::broker::Publisher;
use wharf_core::brokers::BrokerKind;
use wharf_core::settlement::{Policy, RetryPath};

/// Everything a mount's delivery tasks share while its links are up.
pub(crate) struct MountContext {
    pub(crate) spec: Arc<MountSpec>,
    /// The policy the broker's offers gave, before any reload changes
    /// its counting (see [`MountContext::policy`]).
    pub(super) policy: Policy,
    pub(crate) publisher: Publisher,
    /// Whether outputs carry Artemis's duplicate-detection property: the
    /// broker is Artemis, which then drops an output published twice, and
    /// outputs are confirmed rather than committed in transactions.
    pub(crate) duplicate_ids: bool,
    /// Whether an at-most-once outcome that cannot act has been logged at
    /// warn level yet; later ones go to debug.
    pub(crate) unsupported_warned: AtomicBool,
    /// The broker, as spans name it.
    pub(crate) peer: Peer,
    /// Which broker it is: it decides how output addresses are read.
    pub(crate) kind: BrokerKind,
}

/// The broker a mount's links are on, in the OpenTelemetry messaging
/// conventions' terms.
pub(crate) struct Peer {
    /// `messaging.system`: `activemq`, `rabbitmq`, `qpid`, or `amqp` for
    /// a broker wharf does not know.
    pub(crate) system: &'static str,
    /// `server.address`.
    pub(crate) address: String,
    /// `server.port`.
    pub(crate) port: u16,
}

impl Peer {
    /// Puts the peer's attributes on `span`.
    pub(crate) fn describe(&self, span: &mut crate::telemetry::Span) {
        span.set("messaging.system", self.system);
        span.set("server.address", &self.address);
        span.set("server.port", i64::from(self.port));
    }
}

impl MountContext {
    /// The settlement policy for the next plan.
    pub(crate) fn policy(&self) -> Policy {
        let mut policy = self.policy;
        if self.spec.counts_by_copy() {
            policy.retry = RetryPath::Copy;
        }
        policy
    }
}
