//! What the host tells of a mount's deliveries: log lines, tracing and
//! exported spans, metrics and events, all made here from what the
//! delivery path hands over. The path itself only tells the story.
//!
//! Every line about a mount sits in its [`mount_span`], so its tenant and
//! mount are written once, there.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::field;

use super::context::MountContext;
use crate::broker::PooledSession;
use crate::broker::management::QueueInfo;
use crate::events::{Event, Handled};
use crate::sandbox::{Failure, LogTags, Module, Outcome as HandlerOutcome};
use crate::telemetry::Span;
use wharf_core::message::AmqpMessage;
use wharf_core::ordering::{OrderBy, shown_key};
use wharf_core::settlement::{Counters, DelayPath, Disposition, Outcome, Plan, Policy, Publish};
use wharf_core::text::{self, shown, shown_up_to};
use wharf_core::trace::{Hex, Malformed, TraceContext};

/// The span every line about a mount sits in, with its tenant and mount.
/// At error level, so it is on whenever any line is.
pub(crate) fn mount_span(tags: &LogTags) -> tracing::Span {
    tracing::error_span!("mount", tenant = &*tags.tenant, mount = &*tags.mount)
}

/// Tells that the mount is attached, and how it settles (by the broker's
/// `policy`, before any reload changes its counting) and publishes there.
pub(super) fn attached(
    context: &MountContext,
    policy: Policy,
    session: &PooledSession,
    queue: Option<QueueInfo>,
) {
    let spec = &context.spec;
    let mount = &spec.config;
    tracing::info!(
        address = mount.address,
        subscription = mount
            .subscription
            .as_ref()
            .map(|s| format!("{} ({})", s.name, s.kind.as_str())),
        broker = %session.endpoint,
        product = session.offers.product.as_deref(),
        queue = queue.as_ref().map(|q| q.kind.to_string()),
        settle = %mount.settle,
        credit = spec.credit(),
        retry_path = if policy.ordered { "in place" } else { policy.retry.as_str() },
        delay_path = if policy.ordered { "in place" } else { policy.delay.as_str() },
        ordered_by = mount.order_by.as_ref().map(|o| {
            format!("{o}, {}", wharf_core::ordering::across_replicas(o, context.kind))
        }),
        retry_after_original = policy.retry_after_original.as_str(),
        outputs = outputs_path(context),
        "mount attached"
    );
    let _ = spec.events.send(Event::MountReady {
        tenant: spec.tags.tenant.clone(),
        mount: spec.tags.mount.clone(),
        modified_supported: policy.modified_supported,
        retry: policy.retry,
        delay: policy.delay,
        transactions: context.publisher.transactions().is_some(),
        queue: queue.map(|q| q.kind),
    });
}

/// Tells that the mount's credit was withdrawn or given back: one line per
/// change, not per delivery.
pub(super) fn paused(context: &MountContext, paused: bool, released: u64) {
    let spec = &context.spec;
    spec.metrics.paused(paused);
    if paused {
        tracing::info!(
            "mount paused: no credit on its link; handlers running finish, deliveries already on their way are released"
        );
    } else {
        tracing::info!(released, "mount resumed");
    }
    let _ = spec.events.send(Event::MountPaused {
        tenant: spec.tags.tenant.clone(),
        mount: spec.tags.mount.clone(),
        paused,
        released,
    });
}

/// How the mount's outputs are committed, for the attach log.
fn outputs_path(context: &MountContext) -> &'static str {
    let grants = &context.spec.config.grants;
    if grants.send.is_empty() && !grants.reply.granted() {
        "none granted"
    } else if context.publisher.transactions().is_some() {
        "in one transaction with the ack: all or nothing"
    } else if context.kind.drops_duplicate_ids() {
        "confirmed before the ack, duplicates dropped by _AMQ_DUPL_ID"
    } else {
        "confirmed before the ack, at least once"
    }
}

/// What a handler call gave, as the report needs it.
pub(super) type HandlerResult = Result<HandlerOutcome, Failure>;

/// One delivery's report, from arrival to settlement.
pub(super) struct DeliveryReport {
    context: Arc<MountContext>,
    /// `properties.message-id`, bounded and escaped: the publisher chose
    /// it.
    message_id: Option<String>,
    counters: Counters,
    /// The exported span of this attempt, when spans are exported.
    process: Option<Span>,
    module_version: Option<Arc<str>>,
    /// The circuit breaker's epoch when the handler started, if the mount
    /// has a breaker: the attempt counts there.
    breaker_epoch: Option<u64>,
}

impl DeliveryReport {
    /// Opens the report of a delivery as it arrived: its exported span,
    /// below the publisher's when it sent a trace context, and the tracing
    /// span every line about it sits in (below the mount's). `unsealed`: a
    /// retry count without a valid seal was dropped from it.
    pub(super) fn open(
        context: &Arc<MountContext>,
        message: &AmqpMessage,
        counters: Counters,
        publisher: Result<Option<TraceContext>, Malformed>,
        unsealed: bool,
    ) -> (DeliveryReport, Option<TraceContext>, tracing::Span) {
        let spec = &context.spec;
        let message_id = message.message_id().map(|id| shown(&id).to_string());
        let (publisher, malformed) = match publisher {
            Ok(publisher) => (publisher, None),
            Err(malformed) => (None, Some(malformed)),
        };
        let (trace, mut process) = spec.telemetry.process(
            publisher.as_ref(),
            format_args!("process {}", spec.config.address),
        );
        if let Some(span) = &mut process {
            context.peer.describe(span);
            span.set("messaging.operation.type", "process");
            span.set("messaging.destination.name", &spec.config.address);
            if let Some(id) = &message_id {
                span.set("messaging.message.id", id);
            }
            if let Some(id) = message.correlation_id() {
                span.set("messaging.message.conversation_id", shown(&id).to_string());
            }
            if let Some(size) = message.body_size() {
                span.set("messaging.message.body.size", size as i64);
            }
            span.set("wharf.tenant", &*spec.tags.tenant);
            span.set("wharf.mount", &*spec.tags.mount);
            span.set("wharf.attempt", i64::from(counters.attempt()));
        }
        // At info level, as a delivery's own lines are: a host logging only
        // warnings makes no span per delivery, and its lines sit in the
        // mount's span alone.
        let handle = tracing::info_span!(
            parent: &spec.span,
            "handle",
            messaging.system = context.peer.system,
            messaging.operation = "process",
            messaging.destination.name = spec.config.address,
            messaging.message.id = message_id,
            attempt = counters.attempt(),
            trace_id = trace.as_ref().map(|t| field::display(Hex(&t.trace_id))),
            span_id = trace.as_ref().map(|t| field::display(Hex(&t.span_id))),
        );
        let span = if handle.is_disabled() {
            spec.span.clone()
        } else {
            handle
        };
        span.in_scope(|| {
            if unsealed {
                tracing::warn!(
                    "a retry count without a valid seal is not believed: the delivery counts as a first one"
                );
            }
            if let Some(malformed) = malformed {
                spec.metrics.trace_context_malformed();
                tracing::debug!(
                    "an unreadable trace context in the {} is ignored",
                    malformed.place
                );
            }
        });
        let report = DeliveryReport {
            context: context.clone(),
            message_id,
            counters,
            process,
            module_version: None,
            breaker_epoch: None,
        };
        (report, trace, span)
    }

    /// The handler is about to run, in `module`.
    pub(super) fn started(&mut self, module: &Module) {
        let spec = &self.context.spec;
        self.module_version = Some(module.version().clone());
        self.breaker_epoch = spec.breaker.as_ref().map(|breaker| breaker.epoch());
        let _ = spec.events.send(Event::Started {
            tenant: spec.tags.tenant.clone(),
            mount: spec.tags.mount.clone(),
            message_id: self.message_id.clone(),
            attempt: self.counters.attempt(),
        });
    }

    /// The handler returned (or failed); `dropped` bytes of its output were
    /// over its allowance.
    pub(super) fn ran(&self, module: &Module, result: &HandlerResult, dropped: u64) {
        let spec = &self.context.spec;
        spec.metrics.output_dropped(dropped);
        let Err(failure) = result else {
            return;
        };
        spec.metrics.failed(failure.kind());
        // The failure's words may quote the guest (a trap's message, its
        // frames' names): bounded, escaped, and charged to the tenant.
        let words = failure.to_string();
        let words = shown_up_to(&words, text::DESCRIPTION_BYTES);
        if spec.tenant.may_tell(text::DESCRIPTION_BYTES) {
            tracing::warn!(
                kind = failure.kind(),
                module = %module.path().display(),
                version = &**module.version(),
                "handler failed, treating it as retry: {words}"
            );
        } else {
            tracing::debug!(
                kind = failure.kind(),
                "handler failed, treating it as retry (over the tenant's log_rate): {words}"
            );
        }
    }

    /// The key `message` is ordered by, on its exported span.
    pub(super) fn keyed(&mut self, order_by: &OrderBy, message: &AmqpMessage) {
        if let Some(span) = &mut self.process
            && let Some(key) = shown_key(order_by, message)
        {
            span.set("wharf.order.key", key);
        }
    }

    /// The delivery runs again in place (an ordered mount), with
    /// `counters`.
    pub(super) fn again(&mut self, counters: Counters) {
        self.counters = counters;
        tracing::Span::current().record("attempt", counters.attempt());
        if let Some(span) = &mut self.process {
            span.set("wharf.attempt", i64::from(counters.attempt()));
        }
    }

    /// The delivery's plan was carried out (or, on an ordered mount, says
    /// to run it again): everything about this attempt is told.
    pub(super) fn handled(&mut self, handled: Handling) {
        let Handling {
            result,
            outcome,
            plan,
            instead,
            disposition,
            error,
            took,
        } = handled;
        let context = self.context.clone();
        let spec = &context.spec;
        if let Ok(HandlerOutcome::RetryAfter(ms)) = result
            && outcome != Outcome::RetryAfter(Duration::from_millis(ms))
        {
            tracing::warn!(
                asked_ms = ms,
                max_retry_delay = %humantime::format_duration(spec.config.max_retry_delay),
                "retry-after delay shortened to the mount's max_retry_delay"
            );
        }
        if plan.unsupported() {
            let first = !context.unsupported_warned.swap(true, Ordering::Relaxed);
            let note = "AckError::Unsupported: the mount is at-most-once, the delivery was settled on receipt";
            if first {
                tracing::warn!(
                    %outcome,
                    "{note} (logged once per mount; later ones at debug level)"
                );
            } else {
                tracing::debug!(%outcome, "{note}");
            }
        }
        spec.metrics.handled(outcome, disposition, took);
        let failed =
            instead.is_some() || matches!(outcome, Outcome::Retry | Outcome::RetryAfter(_));
        // The last attempt's report gives its parts away; one run again in
        // place keeps them for the next.
        let last = instead.unwrap_or(plan).runs_again().is_none();
        let module_version = self.module_version.clone().unwrap_or_default();
        if let Some(span) = &mut self.process {
            span.set("wharf.module.version", module_version.to_string());
            span.set("wharf.outcome", outcome.to_string());
            span.set(
                "wharf.disposition",
                disposition.map_or("none", Disposition::as_str),
            );
            if let Err(failure) = &result {
                span.fail(failure.kind(), failure.to_string());
            } else if let Some(error) = &error {
                span.fail("settlement", error);
            }
        }
        // Put in words only when logged: the debug line is off by default.
        let fate = || {
            let carried_out = instead.as_ref().unwrap_or(&plan);
            fate(outcome, result.as_ref().err(), carried_out, disposition)
        };
        match &error {
            Some(error) => tracing::error!("{}; but the settlement is incomplete: {error}", fate()),
            None => tracing::debug!(
                %outcome,
                disposition = disposition.map(Disposition::as_str),
                fate = fate(),
                "handled"
            ),
        }
        let _ = spec.events.send(Event::Handled(Handled {
            tenant: spec.tags.tenant.clone(),
            mount: spec.tags.mount.clone(),
            message_id: if last {
                self.message_id.take()
            } else {
                self.message_id.clone()
            },
            attempt: self.counters.attempt(),
            counters: self.counters,
            module_version,
            outcome,
            failure: result.err().map(|failure| failure.to_string()),
            plan,
            instead,
            disposition,
            error,
        }));
        // Told after the attempt itself: a transition it causes follows it.
        if let Some(epoch) = self.breaker_epoch.take() {
            spec.attempt_ended(epoch, failed);
        }
    }
}

/// How a delivery went, for [`DeliveryReport::handled`].
pub(super) struct Handling {
    /// What the handler gave.
    pub(super) result: HandlerResult,
    /// The outcome the plan was made from.
    pub(super) outcome: Outcome,
    /// The plan.
    pub(super) plan: Plan,
    /// The plan carried out instead, when the planner replaced it.
    pub(super) instead: Option<Plan>,
    /// The disposition sent, if any.
    pub(super) disposition: Option<Disposition>,
    /// The first thing that went wrong.
    pub(super) error: Option<String>,
    /// How long the handler ran.
    pub(super) took: Duration,
}

/// A plan the planner replaced: why.
pub(super) fn replaced(context: &MountContext, plan: Plan, reason: &str) {
    if plan.publish() == Some(Publish::Outputs) {
        tracing::warn!(
            "the handler acknowledged, but its outputs were not delivered ({reason}): a failed attempt"
        );
        context.spec.metrics.outputs_undeliverable();
    } else {
        tracing::warn!(
            "the retry's copy cannot be made ({reason}): the delivery is given up as at its limit"
        );
    }
}

/// What a host log line takes beside its message: time, level, target,
/// tenant, mount and ids, about.
const LINE_OVERHEAD: usize = 160;

/// A delivery the host settled without running the handler.
pub(super) fn refused(
    context: &MountContext,
    message_id: Option<String>,
    reason: String,
    error: Option<String>,
) {
    let spec = &context.spec;
    spec.metrics.refused();
    let line = reason.len() + error.as_ref().map_or(0, String::len) + LINE_OVERHEAD;
    if !spec.tenant.may_tell(line) {
        tracing::debug!(
            message_id,
            "delivery rejected without running the handler (over the tenant's log_rate): {reason}"
        );
    } else {
        match &error {
            None => tracing::warn!(
                message_id,
                "delivery rejected without running the handler: {reason}"
            ),
            Some(e) => {
                tracing::error!(message_id, "delivery could not be rejected ({e}): {reason}")
            }
        }
    }
    let _ = spec.events.send(Event::Refused {
        tenant: spec.tags.tenant.clone(),
        mount: spec.tags.mount.clone(),
        message_id,
        reason,
    });
}

/// A delivery task that panicked is a bug in the host, not in the handler:
/// its delivery stays unsettled and returns to the broker when the link
/// detaches.
pub(super) fn panicked(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined
        && e.is_panic()
    {
        tracing::error!("delivery task panicked; the delivery is left to the broker: {e}");
    }
}

/// What became of a delivery, as a sentence: what the handler said, and
/// what the host did about it on the broker.
fn fate(
    outcome: Outcome,
    failure: Option<&Failure>,
    plan: &Plan,
    disposition: Option<Disposition>,
) -> String {
    let said = match (failure, outcome) {
        (Some(failure), _) => format!(
            "the handler failed ({}), which counts as a retry",
            failure.kind()
        ),
        (None, Outcome::Ack) => "acked".to_owned(),
        (None, Outcome::Retry) => "asked for a retry".to_owned(),
        (None, Outcome::RetryAfter(delay)) => {
            format!(
                "asked for a retry after {}",
                humantime::format_duration(delay)
            )
        }
        (None, Outcome::Drop) => "dropped it".to_owned(),
    };
    if let Some(delay) = plan.runs_again() {
        let when = if delay.is_zero() {
            "at once".to_owned()
        } else {
            format!("after {}", humantime::format_duration(delay))
        };
        return format!("{said}; it runs again {when}, in place, holding its key");
    }
    let settled = match disposition {
        Some(Disposition::Accepted) => "accepted",
        Some(Disposition::Modified) => "handed back for redelivery (modified)",
        Some(Disposition::Rejected) => "rejected",
        Some(Disposition::Released) => "released",
        None => "settled on receipt (at most once)",
    };
    let did = match plan.publish() {
        Some(Publish::DeadLetter) => {
            format!("attempts used up: it went to the dead-letter address and was {settled}")
        }
        Some(Publish::Outputs) => format!("its outputs were published and it was {settled}"),
        Some(Publish::Copy { delay, .. }) if delay.is_zero() => {
            format!("a copy went back to the queue and the original was {settled}")
        }
        Some(Publish::Copy { path, .. }) => {
            let waits = match path {
                DelayPath::Scheduled => "scheduled on the broker",
                DelayPath::Held => "held by the host",
            };
            format!("a copy is due then ({waits}) and the original was {settled}")
        }
        None => format!("it was {settled}"),
    };
    format!("{said}; {did}")
}
