//! What the host did, as a stream anyone in the process can watch: the
//! `wharf run` console, tests, and metrics.

use std::sync::Arc;

use crate::settlement::{Counters, Disposition, Outcome, Plan};

/// One thing that happened on a mount.
#[derive(Debug, Clone)]
pub enum Event {
    /// The mount's links are attached and it is taking deliveries.
    MountReady {
        /// The tenant.
        tenant: Arc<str>,
        /// The mount.
        mount: Arc<str>,
        /// Whether the broker takes `modified`; without it `retry` publishes
        /// copies.
        modified_supported: bool,
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
    /// A delivery's outcome has been carried out (a delayed copy, if any, is
    /// still pending and reported by [`Event::CopyPublished`]).
    Handled(Handled),
    /// A copy scheduled by `retry-after` (or an at-most-once retry) was
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
        /// Why, when it was not asked to.
        error: Option<String>,
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
