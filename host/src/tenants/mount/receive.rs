//! The receive loop of an attached mount: deliveries in, one task each,
//! dispositions out (only the loop owns the receiver). It ends when asked
//! to stop (then it drains) or when a link dies (then whatever is in flight
//! is left to the broker, which redelivers it).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use std::pin::Pin;

use super::MountSpec;
use super::attach::AttachedMount;
use super::context::MountContext;
use super::deliver::Slot;
use super::order::Turns;
use super::settle::{self, Arrived, NotSettled, SettleRequest, Settler};
use super::{deliver, report};
use crate::broker::{BrokerError, Inbound, Received, Subscription, Unread};
use crate::tenants::budget::Room;
use wharf_core::breaker::BreakerState;
use wharf_core::config::Settle;
use wharf_core::message;
use wharf_core::settlement::{self, Counters, Disposition};

/// How often kept instances are checked for being idle too long.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// The part of the shutdown grace kept for detaching links, so a broker
/// that does not answer cannot stretch a stop past the grace period.
const DETACH_SHARE: u32 = 5;

impl AttachedMount {
    /// Runs the mount until `stop` is cancelled (then drains: in-flight
    /// handlers get the grace period to finish and be settled, delayed
    /// copies are published early) or until a link fails (returned).
    pub(crate) async fn run(self, stop: CancellationToken) -> Result<(), BrokerError> {
        let AttachedMount {
            context,
            mut subscription,
            mut publisher_task,
            session,
        } = self;
        let spec = context.spec.clone();
        let (requests, mut inbox) = mpsc::unbounded_channel();
        let settler = Settler::new(requests);
        let flush = CancellationToken::new();
        let handling = Handling {
            context: &context,
            settler: &settler,
            flush: &flush,
            handlers: Arc::new(Semaphore::new(spec.config.concurrency as usize)),
            unsettled: Arc::new(Semaphore::new(spec.credit() as usize)),
            turns: spec
                .config
                .order_by
                .clone()
                .map(|order_by| Turns::new(order_by, spec.config.max_keys)),
        };
        let mut tasks = JoinSet::new();
        let mut intake = Intake::default();
        let failure = receive(
            &handling,
            &mut intake,
            &mut subscription,
            &mut inbox,
            &mut tasks,
            publisher_task.failed(),
            stop,
        )
        .await;
        // Slots taken ahead for the next delivery: the deliveries handled
        // while stopping need them.
        let Intake {
            handler_slot,
            unsettled_slot,
            admitting,
        } = intake;
        drop((handler_slot, unsettled_slot));
        let detach_budget = spec.grace / DETACH_SHARE;
        let deadline = Instant::now() + spec.grace - detach_budget;
        wind_down(
            &mut subscription,
            &mut inbox,
            &mut tasks,
            &handling,
            admitting,
            failure.is_some(),
            deadline,
        )
        .await;
        // Detach the receiver and the senders together: the broker takes
        // back whatever is still unsettled.
        tokio::join!(
            subscription.close(detach_budget, spec.ends_subscription()),
            publisher_task.close()
        );
        drop(session);
        failure.map_or(Ok(()), Err)
    }
}

/// What the receive loop holds between turns: a delivery is taken off the
/// link only with a handler slot and a place among the mount's unsettled
/// ones, both taken ahead, and no other delivery still being admitted.
#[derive(Default)]
struct Intake {
    handler_slot: Option<OwnedSemaphorePermit>,
    unsettled_slot: Option<OwnedSemaphorePermit>,
    admitting: Option<Admitting>,
}

/// Takes deliveries and answers settle requests until `stop` is cancelled
/// (`None`) or the receiver or a sender fails (its error).
async fn receive(
    handling: &Handling<'_>,
    intake: &mut Intake,
    subscription: &mut Subscription,
    inbox: &mut Inbox,
    tasks: &mut JoinSet<()>,
    sender_failed: impl Future<Output = BrokerError>,
    stop: CancellationToken,
) -> Option<BrokerError> {
    let (handlers, unsettled) = (&handling.handlers, &handling.unsettled);
    let turns = handling.turns.as_deref();
    // An ordered mount's deliveries take their handler slot once their
    // key's turn comes: one waiting for its turn must not hold one.
    let slots_ahead = turns.is_none();
    let mut prune = tokio::time::interval(PRUNE_EVERY);
    // Made once: a cancellation future registers itself when polled.
    let stopped = stop.cancelled();
    tokio::pin!(stopped, sender_failed);
    let mut gate = Gate::new(handling.context, subscription);
    if let Err(e) = gate.follow(subscription, handling.context).await {
        return Some(e);
    }
    // Unsettled deliveries that arrive while paused go straight back; at
    // most once, what arrives came settled and waits in the link's buffer
    // for the resume (or the stop, which handles it).
    let releases = handling.context.spec.config.settle != Settle::AtMostOnce;
    let breaker = handling.context.spec.breaker.as_ref();
    loop {
        // The common case needs no wait: the slots are free.
        if slots_ahead && intake.handler_slot.is_none() {
            intake.handler_slot = handlers.clone().try_acquire_owned().ok();
        }
        if intake.unsettled_slot.is_none() {
            intake.unsettled_slot = unsettled.clone().try_acquire_owned().ok();
        }
        let keys_full = turns.is_some_and(Turns::full);
        let (holding, open_until) = (gate.holding(), gate.open_until);
        let ready = !holding
            && (intake.handler_slot.is_some() || !slots_ahead)
            && !keys_full
            && intake.unsettled_slot.is_some()
            && intake.admitting.is_none();
        tokio::select! {
            biased;
            Some(request) = inbox.recv() => answer(subscription, request, inbox).await,
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => report::panicked(joined),
            () = &mut stopped => return None,
            failed = &mut sender_failed => return Some(failed),
            _ = prune.tick() => {
                handling.context.spec.module.current().prune_idle();
                if let Some(turns) = turns {
                    handling.context.spec.metrics.keys(&turns.now());
                }
            }
            changed = gate.switch.changed(), if gate.watching => {
                gate.watching = changed.is_ok();
                if let Err(e) = gate.follow(subscription, handling.context).await {
                    return Some(e);
                }
            }
            () = async { breaker.expect("guarded").changed().await }, if breaker.is_some() => {
                if let Err(e) = gate.follow(subscription, handling.context).await {
                    return Some(e);
                }
            }
            () = async move { tokio::time::sleep_until(open_until.expect("guarded")).await }, if open_until.is_some() => {
                handling.context.spec.breaker_tick();
            }
            () = async { turns.expect("guarded").freed().await }, if keys_full => {}
            permit = handlers.clone().acquire_owned(), if slots_ahead && intake.handler_slot.is_none() => {
                intake.handler_slot = permit.ok();
            }
            permit = unsettled.clone().acquire_owned(), if intake.unsettled_slot.is_none() => {
                intake.unsettled_slot = permit.ok();
            }
            (inbound, room) = async { intake.admitting.as_mut().expect("guarded").await }, if intake.admitting.is_some() => {
                intake.admitting = None;
                handling.start(tasks, inbound, intake.handler_slot.take(), room);
            }
            received = subscription.recv(), if ready || (holding && releases) => match received {
                Ok(received) if holding => {
                    if let Err(e) = gate.release(subscription, received, handling, tasks).await {
                        return Some(e);
                    }
                }
                Ok(Received::Delivery(inbound)) => {
                    gate.took();
                    let unsettled = intake.unsettled_slot.take().expect("guarded");
                    intake.admitting = Some(admit(&handling.context.spec, inbound, unsettled));
                }
                Ok(Received::Unhandled(unread)) => {
                    handling.refuse(tasks, unread, intake.unsettled_slot.take());
                }
                Err(e) => return Some(e),
            },
        }
    }
}

/// How much the link is let in: what the pause switch and the circuit
/// breaker together ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkCredit {
    /// The mount's credit.
    Full,
    /// None: paused, or the breaker is open.
    Withheld,
    /// The breaker is half-open: one delivery, to try.
    One,
}

/// The mount's pause switch and circuit breaker, as the receive loop
/// follows them.
struct Gate {
    switch: tokio::sync::watch::Receiver<bool>,
    /// False once the switch is gone (the mount left the config and is
    /// stopping).
    watching: bool,
    /// The switch as last followed.
    switched: bool,
    /// What the link is given now.
    credit: LinkCredit,
    /// Half-open, the delivery let through has been taken.
    probe_taken: bool,
    /// When an open breaker lets one through.
    open_until: Option<Instant>,
    /// Deliveries released since the switch paused the mount.
    released: u64,
}

impl Gate {
    /// Starts from the credit the link was attached with, and from the
    /// switch off: if it is on, the first [`Gate::follow`] tells this
    /// link's pause (its line, metric and event).
    fn new(context: &MountContext, subscription: &Subscription) -> Gate {
        Gate {
            switch: context.spec.paused.clone(),
            watching: true,
            switched: false,
            credit: if subscription.attached_without_credit() {
                LinkCredit::Withheld
            } else {
                LinkCredit::Full
            },
            probe_taken: false,
            open_until: None,
            released: 0,
        }
    }

    /// No delivery is to be handled now: the ones that arrive go back.
    fn holding(&self) -> bool {
        match self.credit {
            LinkCredit::Full => false,
            LinkCredit::Withheld => true,
            LinkCredit::One => self.probe_taken,
        }
    }

    /// A delivery was taken to be handled.
    fn took(&mut self) {
        if self.credit == LinkCredit::One {
            self.probe_taken = true;
        }
    }

    /// Gives the link the credit the switch and the breaker ask for now.
    async fn follow(
        &mut self,
        subscription: &mut Subscription,
        context: &MountContext,
    ) -> Result<(), BrokerError> {
        let spec = &context.spec;
        let switched = *self.switch.borrow_and_update();
        let breaker = spec.breaker.as_ref().map(|breaker| breaker.state());
        self.open_until = match breaker {
            Some(BreakerState::Open { until }) => Some(until.into()),
            _ => None,
        };
        let credit = match breaker {
            _ if switched => LinkCredit::Withheld,
            Some(BreakerState::Open { .. }) => LinkCredit::Withheld,
            Some(BreakerState::HalfOpen) => LinkCredit::One,
            Some(BreakerState::Closed) | None => LinkCredit::Full,
        };
        if credit != self.credit {
            match credit {
                LinkCredit::Withheld => subscription.withdraw_credit().await?,
                LinkCredit::Full => subscription.restore_credit(false).await?,
                LinkCredit::One => subscription.restore_credit(true).await?,
            }
            self.credit = credit;
            self.probe_taken = false;
        }
        if switched != self.switched {
            self.switched = switched;
            report::paused(context, switched, std::mem::take(&mut self.released));
        }
        Ok(())
    }

    /// Gives a delivery that arrived while holding back to the broker
    /// unhandled: `released` counts no attempt.
    async fn release(
        &mut self,
        subscription: &Subscription,
        received: Received,
        handling: &Handling<'_>,
        tasks: &mut JoinSet<()>,
    ) -> Result<(), BrokerError> {
        let info = match received {
            Received::Delivery(inbound) => inbound.info,
            Received::Unhandled(Unread {
                info: Some(info), ..
            }) => info,
            // Came settled: nothing to give back, so it is handled.
            Received::Unhandled(unread) => {
                handling.refuse(tasks, unread, None);
                return Ok(());
            }
        };
        subscription
            .settle_all(vec![info], Disposition::Released, None)
            .await?;
        self.released += 1;
        handling.context.spec.metrics.released_on_pause();
        Ok(())
    }
}

/// Once the loop ends: when stopping, what is in flight finishes until
/// `deadline` (at most once, after what the broker already sent is taken);
/// when the link failed, it is abandoned.
async fn wind_down(
    subscription: &mut Subscription,
    inbox: &mut Inbox,
    tasks: &mut JoinSet<()>,
    handling: &Handling<'_>,
    admitting: Option<Admitting>,
    failed: bool,
    deadline: Instant,
) {
    if failed {
        return abandon(tasks, handling.context);
    }
    if handling.context.spec.config.settle == Settle::AtMostOnce {
        take_the_rest(subscription, tasks, handling, admitting, deadline).await;
    }
    drain(subscription, inbox, tasks, handling.flush, deadline).await;
}

/// The settle requests of the mount's delivery tasks.
type Inbox = mpsc::UnboundedReceiver<SettleRequest>;

/// What starting a delivery's task takes.
struct Handling<'a> {
    context: &'a Arc<MountContext>,
    settler: &'a Settler,
    flush: &'a CancellationToken,
    /// At most `concurrency` handlers run at once; each delivery then waits
    /// for room in its tenant's budgets. While they wait the link's credit
    /// is not renewed, so the broker holds back.
    handlers: Arc<Semaphore>,
    /// At most `credit` deliveries are unsettled (a held `retry-after`
    /// original keeps its place); once a delivery's size is known it also
    /// waits for room for its bytes in the tenant's and the host's budgets.
    unsettled: Arc<Semaphore>,
    /// An ordered mount's keys.
    turns: Option<Arc<Turns>>,
}

impl Handling<'_> {
    /// Starts the task that runs the handler on `inbound`.
    fn start(
        &self,
        tasks: &mut JoinSet<()>,
        inbound: Box<Inbound>,
        handler_slot: Option<OwnedSemaphorePermit>,
        room: Room,
    ) {
        let slot = match &self.turns {
            Some(turns) => Slot::InTurn {
                turn: turns.arrive(&inbound.message),
                handlers: self.handlers.clone(),
            },
            None => Slot::Taken(handler_slot),
        };
        let handle = deliver::handle(
            self.context.clone(),
            self.settler.clone(),
            *inbound,
            slot,
            room,
            self.flush.clone(),
        );
        // Boxed: the task then moves a pointer, not the whole state of a
        // delivery, as it starts and ends. It makes its own span, below the
        // mount's.
        tasks.spawn(Box::pin(handle));
    }

    /// Starts the task that settles a delivery no handler sees.
    fn refuse(
        &self,
        tasks: &mut JoinSet<()>,
        unread: Unread,
        unsettled: Option<OwnedSemaphorePermit>,
    ) {
        let settle = settle_unhandled(
            self.context.clone(),
            self.settler.clone(),
            unread,
            unsettled,
            self.flush.clone(),
        );
        tasks.spawn(settle.in_current_span());
    }
}

/// How long the link must stay quiet, once its credit is withdrawn, before
/// no more deliveries the broker already sent are expected.
const QUIET: Duration = Duration::from_millis(200);

/// At most once, every delivery the broker sent was settled on arrival:
/// left in the link's buffer at a stop, it would be lost. So the credit is
/// no longer renewed, and whatever the broker already sent, which arrives
/// until the link stays quiet for [`QUIET`] (or `deadline`), is handled
/// like any other delivery. (The link's credit is not withdrawn: fe2o3
/// would then refuse the transfers already on their way.)
async fn take_the_rest(
    subscription: &mut Subscription,
    tasks: &mut JoinSet<()>,
    handling: &Handling<'_>,
    admitting: Option<Admitting>,
    deadline: Instant,
) {
    subscription.stop_renewing_credit();
    let start = async |tasks: &mut JoinSet<()>, inbound: Box<Inbound>, room: Room| {
        let slot =
            tokio::time::timeout_at(deadline, handling.handlers.clone().acquire_owned()).await;
        handling.start(tasks, inbound, slot.ok().and_then(Result::ok), room);
    };
    if let Some(admitting) = admitting
        && let Ok((inbound, room)) = tokio::time::timeout_at(deadline, admitting).await
    {
        start(tasks, inbound, room).await;
    }
    let mut taken = 0;
    loop {
        let quiet = (Instant::now() + QUIET).min(deadline);
        let Ok(Ok(unsettled)) =
            tokio::time::timeout_at(quiet, handling.unsettled.clone().acquire_owned()).await
        else {
            break;
        };
        match tokio::time::timeout_at(quiet, subscription.recv()).await {
            Ok(Ok(Received::Delivery(inbound))) => {
                let admitted = admit(&handling.context.spec, inbound, unsettled);
                let Ok((inbound, room)) = tokio::time::timeout_at(deadline, admitted).await else {
                    break;
                };
                start(tasks, inbound, room).await;
                taken += 1;
            }
            Ok(Ok(Received::Unhandled(unread))) => {
                handling.refuse(tasks, unread, Some(unsettled));
            }
            Ok(Err(_)) | Err(_) => break,
        }
    }
    if taken > 0 {
        tracing::debug!(
            taken,
            "handled deliveries the broker had already sent (at most once) before stopping"
        );
    }
}

/// A delivery taken off the link, waiting for room for its bytes.
type Admitting = Pin<Box<dyn Future<Output = (Box<Inbound>, Room)> + Send>>;

fn admit(
    spec: &Arc<MountSpec>,
    inbound: Box<Inbound>,
    unsettled: OwnedSemaphorePermit,
) -> Admitting {
    let spec = spec.clone();
    Box::pin(async move {
        let tenant = spec.tenant.buffered().hold(inbound.size).await;
        let host = spec.host_buffered.hold(inbound.size).await;
        (inbound, Room::new(unsettled, tenant, host))
    })
}

/// The most settle requests answered with one batch of dispositions.
const SETTLE_BATCH: usize = 256;

/// Sends the disposition `first` asks for, and those of every other request
/// already waiting, grouped by kind: deliveries finishing together are
/// settled with a few frames rather than one each.
async fn answer(subscription: &Subscription, first: SettleRequest, inbox: &mut Inbox) {
    let mut requests = vec![first];
    while requests.len() < SETTLE_BATCH
        && let Ok(request) = inbox.try_recv()
    {
        requests.push(request);
    }
    // A refused delivery's `rejected` says why: sent alone.
    let (unread, mut requests): (Vec<_>, Vec<_>) =
        requests.into_iter().partition(|r| r.unread.is_some());
    for request in unread {
        let SettleRequest {
            info,
            disposition,
            unread,
            done,
        } = request;
        let why = unread.as_ref().map(|(u, reason)| (*u, reason.as_str()));
        let result = subscription
            .settle_all(vec![info], disposition, why)
            .await
            .map_err(|e| NotSettled::Link(Arc::new(e)));
        let _ = done.send(result);
    }
    for disposition in [
        Disposition::Accepted,
        Disposition::Rejected,
        Disposition::Modified,
        Disposition::Released,
    ] {
        let (these, others): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .partition(|r| r.disposition == disposition);
        requests = others;
        if these.is_empty() {
            continue;
        }
        let infos = these.iter().map(|r| r.info.clone()).collect();
        let result = subscription
            .settle_all(infos, disposition, None)
            .await
            .map_err(|e| NotSettled::Link(Arc::new(e)));
        for request in these {
            let _ = request.done.send(result.clone());
        }
    }
}

/// Lets in-flight deliveries finish and be settled until `deadline`; waiting
/// copies are published at once. What is left then stays unsettled.
async fn drain(
    subscription: &Subscription,
    inbox: &mut Inbox,
    tasks: &mut JoinSet<()>,
    flush: &CancellationToken,
    deadline: Instant,
) {
    flush.cancel();
    let expired = tokio::time::sleep_until(deadline);
    tokio::pin!(expired);
    while !tasks.is_empty() {
        tokio::select! {
            biased;
            Some(request) = inbox.recv() => answer(subscription, request, inbox).await,
            Some(joined) = tasks.join_next() => report::panicked(joined),
            () = &mut expired => {
                tracing::warn!(
                    unfinished = tasks.len(),
                    "shutdown grace period over; unfinished deliveries are left to the broker"
                );
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
        }
    }
    while let Ok(request) = inbox.try_recv() {
        answer(subscription, request, inbox).await;
    }
}

/// The link died: nothing in flight can be settled any more. The broker
/// redelivers those deliveries; count them.
fn abandon(tasks: &mut JoinSet<()>, context: &MountContext) {
    let abandoned = tasks.len();
    tasks.abort_all();
    if abandoned > 0 {
        context.spec.metrics.abandoned(abandoned as u64);
        tracing::warn!(
            abandoned,
            "link lost with deliveries in flight; the broker redelivers them"
        );
    }
}

/// Settles a delivery no handler sees as the planner says, then reports
/// it.
async fn settle_unhandled(
    context: Arc<MountContext>,
    settler: Settler,
    unread: Unread,
    unsettled: Option<OwnedSemaphorePermit>,
    flush: CancellationToken,
) {
    let Unread {
        unhandled,
        info,
        reason,
        payload,
    } = unread;
    let message_id = message::message_id_of(&payload);
    let plan = settlement::plan_unhandled(&context.policy(), unhandled);
    // One that came settled has nothing left to settle or publish.
    let error = match info {
        Some(info) => {
            let arrived = Arrived {
                info,
                message: None,
                payload: &payload,
                counters: Counters::default(),
                trace: None,
                unread: Some((unhandled, &reason)),
            };
            settle::carry_out(&context, &settler, &arrived, plan, &[], &flush)
                .await
                .error
        }
        None => None,
    };
    report::refused(&context, message_id, reason, error);
    drop(unsettled);
}
