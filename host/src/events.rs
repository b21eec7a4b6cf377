//! What the host did, as a stream anyone in the process can watch: the
//! `wharf run` console, tests, and metrics.

use std::sync::Arc;
use std::time::Duration;

use wharf_core::brokers::QueueKind;
use wharf_core::settlement::{Counters, DelayPath, Disposition, Outcome, Plan, RetryPath};

/// Where a mount's links stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// Asking the broker for it.
    Attaching,
    /// Attached and working.
    Up,
    /// It failed or ended; the next attempt comes after `wait`.
    BackingOff {
        /// Why.
        error: String,
        /// Until the next attempt.
        wait: Duration,
    },
    /// Asked to stop; it will not come back.
    Stopped,
}

/// One thing that happened on a mount.
#[derive(Debug, Clone)]
pub enum Event {
    /// The mount's links are attached and it is taking deliveries.
    MountReady {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
        /// Whether the broker takes `modified`.
        modified_supported: bool,
        /// How `retry` asks for another attempt on these links.
        retry: RetryPath,
        /// Where `retry-after` copies wait on these links.
        delay: DelayPath,
        /// Whether outputs commit with their inputs in transactions on
        /// these links (else they are confirmed before the input is
        /// accepted).
        transactions: bool,
        /// The kind of queue behind the address, where the broker said.
        queue: Option<QueueKind>,
    },
    /// The mount's links went down (the connection was lost, the broker
    /// detached a link, an attach failed); it attaches again after a wait.
    MountDown {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
        /// Why.
        error: String,
    },
    /// The mount's link credit was withdrawn (`paused`) or given back, as
    /// its pause switch asked.
    MountPaused {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
        /// Paused now, or running again.
        paused: bool,
        /// On resume: deliveries the broker sent during the pause, released
        /// back to it unhandled.
        released: u64,
    },
    /// The mount's circuit breaker changed state.
    Breaker {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
        /// `closed`, `open` or `half-open`.
        state: &'static str,
    },
    /// A delivery was settled without running the handler: it is not a
    /// readable message, or it is larger than the mount takes.
    Refused {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
        /// `properties.message-id`, shown bounded and escaped, where its
        /// section could be read.
        message_id: Option<String>,
        /// Why.
        reason: String,
    },
    /// A handler started on a delivery.
    Started {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
        /// `properties.message-id`, as text.
        message_id: Option<String>,
        /// The attempt number the handler sees.
        attempt: u32,
    },
    /// A delivery's outcome has been carried out: its copy or dead letter
    /// (if any) published and its disposition sent.
    Handled(Handled),
    /// A copy (for `retry`, `retry-after`, or an at-most-once retry) was
    /// published, or failed to be.
    CopyPublished {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
        /// `properties.message-id` of the copy.
        message_id: Option<String>,
        /// The copy's retry count.
        retry_count: u32,
        /// Why the broker did not take it, if it did not.
        error: Option<String>,
    },
    /// A mount's module file changed and was reloaded, or refused (then
    /// the previous version keeps serving).
    ModuleReloaded {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
        /// The version now serving.
        version: Arc<str>,
        /// Why the new file was refused, if it was.
        error: Option<String>,
    },
    /// The config file was read again and applied, or refused (then the
    /// running config stays).
    ConfigReloaded(ConfigChange),
    /// The mount stopped taking deliveries.
    MountStopped {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
    },
}

/// The record of one handled delivery.
#[derive(Debug, Clone)]
pub struct Handled {
    /// The tenant.
    pub tenant: Arc<str>,
    /// The mount.
    pub mount: Arc<str>,
    /// `properties.message-id`, as text.
    pub message_id: Option<String>,
    /// The attempt number the handler saw.
    pub attempt: u32,
    /// The counters the delivery carried.
    pub counters: Counters,
    /// The version (content digest) of the module that handled it.
    pub module_version: Arc<str>,
    /// The outcome the plan was made from (a failed handler counts as retry).
    pub outcome: Outcome,
    /// Why the handler failed, when it did.
    pub failure: Option<String>,
    /// What the settlement rules decided.
    pub plan: Plan,
    /// The plan carried out instead: the handler acknowledged, but its
    /// outputs were not delivered, so the attempt failed (the reason is in
    /// `error`).
    pub instead: Option<Plan>,
    /// The disposition actually sent, if any.
    pub disposition: Option<Disposition>,
    /// A publish or settlement that went wrong.
    pub error: Option<String>,
}

/// What a config reload changed, as `tenant/mount` names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigChange {
    /// Mounts attached.
    pub added: Vec<String>,
    /// Mounts drained and detached.
    pub removed: Vec<String>,
    /// Mounts drained and attached again with their new settings.
    pub replaced: Vec<String>,
    /// Why the new config was refused, if it was.
    pub error: Option<String>,
}

/// Capacity of the event stream; slower watchers miss events (and are told
/// so) rather than slowing the host down.
pub(crate) const EVENT_CAPACITY: usize = 4096;
