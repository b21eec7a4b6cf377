//! One delivery through the sandbox: room in the tenant's budgets, an
//! instance, the handler's outcome, the plan, and its settlement.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, field};

use super::attach::MountContext;
use super::settle::{self, Arrived, Settler};
use crate::broker::Inbound;
use crate::broker::message::{self, DeliveryContext};
use crate::config::Settle;
use crate::events::{Event, Handled};
use crate::sandbox::{Call, MemoryHeld, Outgoing, Reserved};
use crate::settlement::{self, Disposition, HandlerResult, Outcome, Plan, Publish};
use crate::tenants::budget::Room;
use wharf_core::text::{self, shown, shown_up_to};
use wharf_core::trace::{Hex, TraceContext};

/// Runs the handler on one delivery and carries out the plan for its
/// outcome. `handler_slot`, one of the mount's `concurrency`, is given
/// back as soon as the handler has returned.
pub(super) async fn handle(
    context: Arc<MountContext>,
    settler: Settler,
    inbound: Inbound,
    handler_slot: Option<OwnedSemaphorePermit>,
    room: Room,
    flush: CancellationToken,
) {
    let spec = context.spec.clone();
    let Inbound {
        info,
        mut message,
        payload,
        ..
    } = inbound;
    if let Some(key) = &spec.retry_key
        && message.unsealed_count_dropped(key)
    {
        tracing::warn!(
            tenant = &*spec.tags.tenant,
            mount = &*spec.tags.mount,
            message_id = message
                .message_id()
                .as_deref()
                .map(shown)
                .map(field::display),
            "a retry count without a valid seal is not believed: the delivery counts as a first one"
        );
    }
    let counters = message.counters();
    let attempt = counters.attempt();
    // Shown bounded and escaped wherever it is reported: the publisher
    // chose it.
    let message_id = message.message_id().map(|id| shown(&id).to_string());
    let publisher = match TraceContext::of(&message) {
        Ok(publisher) => publisher,
        Err(malformed) => {
            spec.metrics.trace_context_malformed();
            tracing::debug!(
                tenant = &*spec.tags.tenant,
                mount = &*spec.tags.mount,
                "an unreadable trace context in the {} is ignored",
                malformed.place
            );
            None
        }
    };
    // This attempt's span, below the publisher's when it sent a context.
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
        span.set("wharf.attempt", i64::from(attempt));
    }
    let span = tracing::info_span!(
        "handle",
        messaging.system = context.peer.system,
        messaging.operation = "process",
        messaging.destination.name = spec.config.address,
        messaging.message.id = message_id,
        tenant = &*spec.tags.tenant,
        mount = &*spec.tags.mount,
        attempt,
        trace_id = trace.as_ref().map(|t| field::display(Hex(&t.trace_id))),
        span_id = trace.as_ref().map(|t| field::display(Hex(&t.span_id))),
    );
    async move {
        // Room in the tenant's budgets first, then an instance of the module
        // current at that moment (it may be replaced while this one waits).
        // Waiting for either is back-pressure: it never costs an attempt.
        let mut admission = spec.tenant.admit().await;
        let instance = spec.module.current().reserve().await;
        let module_version = instance.instances().module().version().clone();
        let _ = spec.events.send(Event::Started {
            tenant: spec.tags.tenant.clone(),
            mount: spec.tags.mount.clone(),
            message_id: message_id.clone(),
            attempt,
        });
        let started = Instant::now();
        // The instance's memory stays counted in the tenant's budget until
        // the delivery is settled.
        let instance = instance.traced(trace.as_ref(), &spec.telemetry);
        let (result, outputs, _memory) =
            run_handler(&context, instance, &message, attempt, trace.as_ref()).await;
        let took = started.elapsed();
        drop(handler_slot);
        let outcome = settlement::outcome_of(&result, spec.config.max_retry_delay);
        if let Ok(crate::sandbox::Outcome::RetryAfter(ms)) = result
            && outcome != Outcome::RetryAfter(std::time::Duration::from_millis(ms))
        {
            tracing::warn!(
                asked_ms = ms,
                max_retry_delay = %humantime::format_duration(spec.config.max_retry_delay),
                "retry-after delay shortened to the mount's max_retry_delay"
            );
        }
        spec.note_attempt(&message, &counters);
        let policy = context.policy();
        let mut plan = settlement::plan(&policy, &counters, outcome);
        // Outputs go out with an acknowledgement and only with one.
        if outcome == Outcome::Ack && !outputs.is_empty() {
            plan = plan.with_outputs(&policy);
        }
        if plan.unsupported() {
            log_unsupported(&context, outcome);
        }
        if matches!(plan.publish(), Some(Publish::Copy { delay, .. }) if !delay.is_zero()) {
            admission.release_running();
        }
        let arrived = Arrived {
            info,
            message: &message,
            payload: &payload,
            counters,
            trace: trace.as_ref(),
        };
        let settled = settle::carry_out(&context, &settler, &arrived, plan, &outputs, &flush).await;
        if settled.disposition == Some(Disposition::Modified) {
            spec.note_modified(&message, attempt);
        }
        spec.metrics.handled(outcome, settled.disposition, took);
        if let Some(span) = &mut process {
            span.set("wharf.module.version", module_version.to_string());
            span.set("wharf.outcome", outcome.to_string());
            span.set(
                "wharf.disposition",
                settled.disposition.map_or("none", Disposition::as_str),
            );
            if let Err(failure) = &result {
                span.fail(failure.kind(), failure.to_string());
            } else if let Some(error) = &settled.error {
                span.fail("settlement", error);
            }
        }
        // Put in words only when logged: the debug line is off by default.
        let fate = || {
            let carried_out = settled.instead.as_ref().unwrap_or(&plan);
            fate(
                outcome,
                result.as_ref().err(),
                carried_out,
                settled.disposition,
            )
        };
        match &settled.error {
            Some(error) => tracing::error!("{}; but the settlement is incomplete: {error}", fate()),
            None => tracing::debug!(
                %outcome,
                disposition = settled.disposition.map(Disposition::as_str),
                fate = fate(),
                "handled"
            ),
        }
        let _ = spec.events.send(Event::Handled(Handled {
            tenant: spec.tags.tenant.clone(),
            mount: spec.tags.mount.clone(),
            message_id,
            attempt,
            counters,
            module_version,
            outcome,
            failure: result.err().map(|failure| failure.to_string()),
            plan,
            instead: settled.instead,
            disposition: settled.disposition,
            error: settled.error,
        }));
        drop(admission);
        drop(room);
    }
    .instrument(span)
    .await
}

async fn run_handler(
    context: &MountContext,
    instance: Reserved,
    message: &message::AmqpMessage,
    attempt: u32,
    trace: Option<&TraceContext>,
) -> (HandlerResult, Vec<Outgoing>, MemoryHeld) {
    let spec = &context.spec;
    let mut seen = message::to_delivery(
        message,
        DeliveryContext {
            address: &spec.config.address,
            tenant: &spec.tags.tenant,
            mount: &spec.tags.mount,
            attempt,
            presettled: spec.config.settle == Settle::AtMostOnce,
        },
    );
    if let Some(trace) = trace {
        wharf_core::trace::show_to_handler(&mut seen.properties, trace);
    }
    let delivery: crate::sandbox::Delivery = seen.into();
    let instances = instance.instances().clone();
    let module = instances.module();
    let Call {
        result,
        outputs,
        memory,
    } = instance.call(&delivery, context.kind).await;
    spec.metrics.output_dropped(instances.take_output_dropped());
    if let Err(failure) = &result {
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
        spec.metrics.failed(failure.kind());
    }
    (result, outputs, memory)
}

fn log_unsupported(context: &MountContext, outcome: Outcome) {
    let first = !context.unsupported_warned.swap(true, Ordering::Relaxed);
    let note =
        "AckError::Unsupported: the mount is at-most-once, the delivery was settled on receipt";
    if first {
        tracing::warn!(
            %outcome,
            "{note} (logged once per mount; later ones at debug level)"
        );
    } else {
        tracing::debug!(%outcome, "{note}");
    }
}

/// What became of a delivery, as a sentence: what the handler said, and
/// what the host did about it on the broker.
fn fate(
    outcome: Outcome,
    failure: Option<&crate::sandbox::Failure>,
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
                crate::settlement::DelayPath::Scheduled => "scheduled on the broker",
                crate::settlement::DelayPath::Held => "held by the host",
            };
            format!("a copy is due then ({waits}) and the original was {settled}")
        }
        None => format!("it was {settled}"),
    };
    format!("{said}; {did}")
}
