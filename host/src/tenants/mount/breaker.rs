//! A mount's circuit breaker at work: its delivery tasks count their
//! attempts into it, its receive loop follows its state (no credit while
//! open, one delivery half-open). The rules are
//! [`wharf_core::breaker`]'s; here they are shared, told and woken on.

use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::Notify;

use super::MountSpec;
use crate::events::Event;
use crate::sync::Locked;
use wharf_core::breaker::{Breaker, BreakerPolicy, BreakerState, Transition};

/// The breaker of one mount, shared by its delivery tasks and its receive
/// loop, across reattaches.
pub(crate) struct MountBreaker {
    breaker: Mutex<Breaker>,
    /// Woken on every transition: the receive loop follows it.
    changed: Notify,
}

impl MountBreaker {
    pub(crate) fn new(policy: BreakerPolicy) -> MountBreaker {
        MountBreaker {
            breaker: Mutex::new(Breaker::new(policy)),
            changed: Notify::new(),
        }
    }

    /// What an attempt starting now counts in.
    pub(crate) fn epoch(&self) -> u64 {
        self.breaker.locked().epoch()
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.breaker.locked().state()
    }

    /// Resolves once the state changed since the last time it did.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }
}

impl MountSpec {
    /// An attempt that began in `epoch` ended; `failed`: it is to be tried
    /// again (retry, retry-after, a trap, a time-out, outputs not taken).
    pub(crate) fn attempt_ended(&self, epoch: u64, failed: bool) {
        let Some(breaker) = &self.breaker else {
            return;
        };
        let transition = breaker
            .breaker
            .locked()
            .record(epoch, failed, Instant::now());
        if let Some(transition) = transition {
            self.breaker_moved(breaker, transition);
        }
    }

    /// An open breaker whose time is over lets one delivery through.
    pub(crate) fn breaker_tick(&self) {
        let Some(breaker) = &self.breaker else {
            return;
        };
        let transition = breaker.breaker.locked().tick(Instant::now());
        if let Some(transition) = transition {
            self.breaker_moved(breaker, transition);
        }
    }

    /// One line, the metrics and an event per transition; then the
    /// receive loop is woken to follow it.
    fn breaker_moved(&self, breaker: &MountBreaker, transition: Transition) {
        let state = breaker.state();
        match transition {
            Transition::Opened { failed, ended } => tracing::warn!(
                failed,
                ended,
                "circuit breaker open: {failed} of the last {ended} attempts failed; no deliveries are taken for {}",
                humantime::format_duration(self.open_for())
            ),
            Transition::HalfOpened => {
                tracing::info!("circuit breaker half-open: one delivery goes through to try");
            }
            Transition::Closed => {
                tracing::info!("circuit breaker closed: the delivery let through succeeded");
            }
            Transition::Reopened => tracing::warn!(
                "circuit breaker open again: the delivery let through failed; no deliveries are taken for {}",
                humantime::format_duration(self.open_for())
            ),
        }
        self.metrics.breaker(state);
        let _ = self.events.send(Event::Breaker {
            tenant: self.tags.tenant.clone(),
            mount: self.tags.mount.clone(),
            state: state.as_str(),
        });
        breaker.changed.notify_one();
    }

    fn open_for(&self) -> std::time::Duration {
        self.config.breaker.map(|b| b.open_for).unwrap_or_default()
    }
}
