//! One delivery through the sandbox: room in the tenant's budgets, an
//! instance, the handler's outcome, the plan, and its settlement. What is
//! told of it is made in `report`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::context::MountContext;
use super::order::WaitTurn;
use super::report::{DeliveryReport, HandlerResult, Handling};
use super::settle::{self, Arrived, Settled, Settler};
use crate::broker::Inbound;
use crate::sandbox::{Call, Reserved};
use crate::tenants::budget::Room;
use wharf_core::config::Settle;
use wharf_core::message::{self, DeliveryContext};
use wharf_core::settlement::{self, Counters, Disposition, Outcome, Plan, Publish};
use wharf_core::trace::TraceContext;

/// How a delivery gets one of the mount's `concurrency` handler slots.
pub(super) enum Slot {
    /// Taken ahead by the receive loop.
    Taken(Option<OwnedSemaphorePermit>),
    /// Taken by the delivery itself once its key's turn comes (an ordered
    /// mount; no turn for a message without a key), and again for each
    /// attempt it runs in place.
    InTurn {
        /// Its place in its key's line.
        turn: Option<WaitTurn>,
        handlers: Arc<Semaphore>,
    },
}

/// Runs the handler on one delivery and carries out the plan for its
/// outcome; on an ordered mount, runs it again in place while the plan
/// says so. The handler slot is given back as soon as the handler has
/// returned; a key's turn once the delivery is settled.
pub(super) async fn handle(
    context: Arc<MountContext>,
    settler: Settler,
    inbound: Inbound,
    slot: Slot,
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
    let unsealed = spec
        .retry_key
        .as_ref()
        .is_some_and(|key| message.unsealed_count_dropped(key));
    let mut counters = message.counters();
    let publisher = TraceContext::of(&message);
    let (mut report, trace, span) =
        DeliveryReport::open(&context, &message, counters, publisher, unsealed);
    async move {
        let (mut handler_slot, handlers, _turn) = match slot {
            Slot::Taken(permit) => (permit, None, None),
            Slot::InTurn { turn, handlers } => {
                let turn = match turn {
                    Some(wait) => {
                        if let Some(order_by) = &spec.config.order_by {
                            report.keyed(order_by, &message);
                        }
                        // A stop leaves what has not run to the broker.
                        let Some(turn) = flush.run_until_cancelled(wait.wait()).await else {
                            return;
                        };
                        Some(turn)
                    }
                    None => None,
                };
                let Some(permit) = flush
                    .run_until_cancelled(handlers.clone().acquire_owned())
                    .await
                else {
                    return;
                };
                (permit.ok(), Some(handlers), turn)
            }
        };
        let mut arrived = Arrived {
            info,
            message: Some(&message),
            payload: &payload,
            counters,
            trace: trace.as_ref(),
            unread: None,
        };
        loop {
            // Room in the tenant's budgets first, then an instance of the
            // module current at that moment (it may be replaced while this
            // one waits). Waiting for either is back-pressure: it never
            // costs an attempt.
            let mut admission = spec.tenant.admit().await;
            let instance = spec.module.current().reserve().await;
            let instances = instance.instances().clone();
            report.started(instances.module());
            let started = Instant::now();
            // The instance's memory stays counted in the tenant's budget
            // until the delivery is settled.
            let instance = instance.traced(trace.as_ref(), &spec.telemetry);
            let call = run_handler(
                &context,
                instance,
                &message,
                counters.attempt(),
                trace.as_ref(),
            );
            let Call {
                result,
                outputs,
                memory: _memory,
            } = call.await;
            let took = started.elapsed();
            drop(handler_slot.take());
            report.ran(instances.module(), &result, instances.take_output_dropped());
            let outcome = outcome_of(&result, spec.config.max_retry_delay);
            spec.note_attempt(&message, &counters);
            let plan = plan_for(&context, &counters, outcome, !outputs.is_empty());
            if matches!(plan.publish(), Some(Publish::Copy { delay, .. }) if !delay.is_zero()) {
                admission.release_running();
            }
            arrived.counters = counters;
            let settled = if plan.runs_again().is_some() {
                Settled::default()
            } else {
                settle::carry_out(&context, &settler, &arrived, plan, &outputs, &flush).await
            };
            if settled.disposition == Some(Disposition::Modified) {
                spec.note_modified(&message, counters.attempt());
            }
            let again = settled.instead.unwrap_or(plan).runs_again();
            report.handled(Handling {
                result,
                outcome,
                plan,
                instead: settled.instead,
                disposition: settled.disposition,
                error: settled.error,
                took,
            });
            drop(admission);
            let (Some(delay), Some(handlers)) = (again, &handlers) else {
                break;
            };
            // The key waits out the delay with the delivery unsettled; a
            // stop meanwhile hands it back, counted where the broker counts.
            counters.in_place += 1;
            report.again(counters);
            let waited = flush
                .run_until_cancelled(async {
                    tokio::time::sleep(delay).await;
                    handlers.clone().acquire_owned().await
                })
                .await;
            match waited {
                Some(permit) => handler_slot = permit.ok(),
                None => {
                    let keep = Plan::Settle(context.policy().keep());
                    settle::carry_out(&context, &settler, &arrived, keep, &[], &flush).await;
                    break;
                }
            }
        }
        drop(room);
    }
    .instrument(span)
    .await
}

/// The plan for `outcome`. Outputs go out with an acknowledgement and only
/// with one.
fn plan_for(context: &MountContext, counters: &Counters, outcome: Outcome, outputs: bool) -> Plan {
    let policy = context.policy();
    let plan = settlement::plan(&policy, counters, outcome);
    if outcome == Outcome::Ack && outputs {
        plan.with_outputs(&policy)
    } else {
        plan
    }
}

/// Calls the handler with what it sees of `message`.
async fn run_handler(
    context: &MountContext,
    instance: Reserved,
    message: &message::AmqpMessage,
    attempt: u32,
    trace: Option<&TraceContext>,
) -> Call {
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
    instance.call(&delivery, context.kind).await
}

/// The outcome a plan is made from. A handler that failed (trapped, ran out
/// of time or memory, returned garbage) is retried, so the attempt counter
/// moves and a poison message reaches its limit. A `retry-after` delay is cut
/// to the mount's `max_retry_delay`.
fn outcome_of(result: &HandlerResult, max_retry_delay: Duration) -> Outcome {
    match result {
        Ok(crate::sandbox::Outcome::Ack) => Outcome::Ack,
        Ok(crate::sandbox::Outcome::Retry) | Err(_) => Outcome::Retry,
        Ok(crate::sandbox::Outcome::Drop) => Outcome::Drop,
        Ok(crate::sandbox::Outcome::RetryAfter(ms)) => {
            Outcome::RetryAfter(Duration::from_millis(*ms).min(max_retry_delay))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Failure;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_failed_handler_is_a_retry() {
        let failed = Err(Failure::Trap("unreachable".into()));
        assert_eq!(outcome_of(&failed, HOUR), Outcome::Retry);
    }

    #[test]
    fn delays_are_cut_to_the_ceiling() {
        let asked = Ok(crate::sandbox::Outcome::RetryAfter(2 * 3600 * 1000));
        assert_eq!(outcome_of(&asked, HOUR), Outcome::RetryAfter(HOUR));
        let short = Ok(crate::sandbox::Outcome::RetryAfter(250));
        assert_eq!(
            outcome_of(&short, HOUR),
            Outcome::RetryAfter(Duration::from_millis(250))
        );
    }
}
