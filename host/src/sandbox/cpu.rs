//! Sharing the cores between tenants.
//!
//! Wasm runs only while its call holds one of the host's CPU turns, one per
//! core: a call takes a turn each time it is polled and gives it back when
//! it yields (at every epoch tick, or while it waits on a host call). When
//! calls wait for a turn, a freed turn goes to the tenant that has used the
//! least CPU time so far (stride scheduling: each tenant's use is counted
//! from the moment it starts waiting). A tenant whose handlers used more
//! than [`HEAVY_SHARE`] of a core lately is also held to an equal share of
//! the turns among the tenants active lately, so many short handlers of one
//! tenant leave cores to the others' handlers and to the host's own work
//! (their waiting calls are not even runnable), while a tenant alone gets
//! every core.
//!
//! A tenant with `max_cpu` is also held to that much CPU time: each call's
//! time on a turn is taken from an allowance that refills at `max_cpu`
//! cores and holds at most [`ALLOWANCE_SPAN`] of it, and while the
//! allowance is spent the tenant gets no turn (its waiting calls sleep
//! until it is back), however idle the host. That bounds a tenant on a
//! host that shares its cores with the broker, where an equal share of the
//! turns still takes what the broker needs for the others' deliveries.
//!
//! On top of that, a handler that keeps running past
//! [`LONG_RUNNING_AFTER_SLICES`] epoch ticks is deprioritised: from then on
//! each of its slices needs its tenant's long-running slot (one slice of the
//! tenant's long-running handlers at a time) and is followed by a pause. A
//! tenant whose handlers all spin therefore gets at most
//! `slice / (slice + pause)` of one core even on an idle host. Short
//! handlers never meet the slot.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::sync::Locked;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Epoch ticks a call may run before it counts as long-running (about
/// 50 ms of running at the 10 ms tick).
pub(crate) const LONG_RUNNING_AFTER_SLICES: u32 = 5;

/// The pause after each slice of a long-running call: with 10 ms slices a
/// tenant's long-running handlers together get at most a tenth of a core.
pub(crate) const PAUSE: Duration = Duration::from_millis(90);

/// One tenant's place in the CPU: its claim on the host's turns and the
/// right to run one slice of a long-running handler, shared by its mounts.
#[derive(Clone)]
pub struct CpuLane {
    slot: Arc<Semaphore>,
    turns: Arc<Lane>,
}

impl CpuLane {
    /// A lane of its own, held to `max_cpu` thousandths of a core if set.
    pub fn new(max_cpu: Option<u32>) -> CpuLane {
        CpuLane {
            slot: Arc::new(Semaphore::new(1)),
            turns: Arc::new(Lane::new(max_cpu)),
        }
    }
}

/// One call's use of its lane.
pub(crate) struct CpuUse {
    lane: CpuLane,
    slices: u32,
    held: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl CpuUse {
    pub(crate) fn new(lane: CpuLane) -> CpuUse {
        CpuUse {
            lane,
            slices: 0,
            held: Arc::default(),
        }
    }

    /// A new call starts with a clean record.
    pub(crate) fn reset(&mut self) {
        self.slices = 0;
        self.release();
    }

    /// Called at every epoch tick the call runs through: `None` while it is
    /// short, else what to wait for before its next slice.
    pub(crate) fn tick(&mut self) -> Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> {
        self.slices += 1;
        if self.slices < LONG_RUNNING_AFTER_SLICES {
            return None;
        }
        self.release();
        let slot = self.lane.slot.clone();
        let held = self.held.clone();
        Some(Box::pin(async move {
            tokio::time::sleep(PAUSE).await;
            let permit = slot
                .acquire_owned()
                .await
                .expect("lane semaphores are never closed");
            *held.locked() = Some(permit);
        }))
    }

    fn release(&mut self) {
        self.held.locked().take();
    }
}

/// A tenant as the turns see it. Its fields change only under the turns'
/// lock.
struct Lane {
    id: u64,
    /// CPU time used, in nanoseconds, since the host started or since the
    /// tenant last started waiting behind others (whichever is later).
    used: AtomicU64,
    /// Turns it holds now.
    holding: AtomicUsize,
    /// When it last asked for a turn, in microseconds since [`EPOCH`].
    asked: AtomicU64,
    /// Whether it is in the active list.
    active: AtomicBool,
    /// CPU time used in the current and the previous [`ACTIVE_FOR`]
    /// window, in nanoseconds, and when the current one started (in
    /// microseconds since [`EPOCH`]).
    window_used: AtomicU64,
    last_window_used: AtomicU64,
    window_start: AtomicU64,
    /// Nanoseconds of CPU time it may use per second (`max_cpu`).
    rate: Option<u64>,
    /// What is left of its allowance, in nanoseconds; below zero while a
    /// slice that started within it ran past it.
    allowance: AtomicI64,
    /// When `allowance` was last refilled, in microseconds since [`EPOCH`].
    refilled: AtomicU64,
}

impl Lane {
    fn new(max_cpu: Option<u32>) -> Lane {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let rate = max_cpu.map(|millis| u64::from(millis) * 1_000_000);
        Lane {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            used: AtomicU64::new(0),
            holding: AtomicUsize::new(0),
            asked: AtomicU64::new(0),
            active: AtomicBool::new(false),
            window_used: AtomicU64::new(0),
            last_window_used: AtomicU64::new(0),
            window_start: AtomicU64::new(0),
            rate,
            allowance: AtomicI64::new(rate.map_or(0, Lane::allowance_cap)),
            refilled: AtomicU64::new(0),
        }
    }

    /// The most its allowance holds: [`ALLOWANCE_SPAN`] at its rate.
    fn allowance_cap(rate: u64) -> i64 {
        i64::try_from(u128::from(rate) * ALLOWANCE_SPAN.as_micros() / 1_000_000).unwrap_or(i64::MAX)
    }

    /// Whether its allowance is spent at `now`, after refilling it for the
    /// time since the last refill.
    fn spent(&self, now: u64) -> bool {
        let Some(rate) = self.rate else {
            return false;
        };
        let since = now.saturating_sub(self.refilled.fetch_max(now, Ordering::Relaxed));
        let refill =
            i64::try_from(u128::from(since) * u128::from(rate) / 1_000_000).unwrap_or(i64::MAX);
        let allowance = self
            .allowance
            .load(Ordering::Relaxed)
            .saturating_add(refill)
            .min(Lane::allowance_cap(rate));
        self.allowance.store(allowance, Ordering::Relaxed);
        allowance <= 0
    }

    /// When its spent allowance is back above zero, in microseconds since
    /// [`EPOCH`]; `None` while some is left.
    fn allowance_back_at(&self) -> Option<u64> {
        let rate = self.rate?;
        let owed = self.allowance.load(Ordering::Relaxed);
        if owed > 0 {
            return None;
        }
        let wait = u128::from(owed.unsigned_abs() + 1) * 1_000_000 / u128::from(rate);
        Some(
            self.refilled
                .load(Ordering::Relaxed)
                .saturating_add(u64::try_from(wait + 1).unwrap_or(u64::MAX)),
        )
    }

    /// Whether it used more than [`HEAVY_SHARE`] of a core lately: only
    /// such a tenant is held to its share of the turns, so one whose
    /// handlers are light keeps running them side by side.
    fn heavy(&self) -> bool {
        let window = ACTIVE_FOR.as_nanos() as u64;
        let used = self
            .window_used
            .load(Ordering::Relaxed)
            .max(self.last_window_used.load(Ordering::Relaxed));
        used as f64 > window as f64 * HEAVY_SHARE
    }

    fn charge(&self, ran: u64, now: u64) {
        self.used.fetch_add(ran, Ordering::Relaxed);
        if self.rate.is_some() {
            self.spent(now);
            self.allowance
                .fetch_sub(i64::try_from(ran).unwrap_or(i64::MAX), Ordering::Relaxed);
        }
        let window = ACTIVE_FOR.as_micros() as u64;
        let start = self.window_start.load(Ordering::Relaxed);
        if now.saturating_sub(start) >= window {
            let last = if now.saturating_sub(start) >= 2 * window {
                0
            } else {
                self.window_used.load(Ordering::Relaxed)
            };
            self.last_window_used.store(last, Ordering::Relaxed);
            self.window_used.store(0, Ordering::Relaxed);
            self.window_start.store(now, Ordering::Relaxed);
        }
        self.window_used.fetch_add(ran, Ordering::Relaxed);
    }
}

/// The share of one core a tenant's handlers may use before the tenant is
/// held to its share of the turns.
const HEAVY_SHARE: f64 = 0.25;

/// How recently a tenant must have asked for a turn to count as active:
/// the cores are shared among the active tenants.
const ACTIVE_FOR: Duration = Duration::from_millis(100);

/// The time over which `max_cpu` is averaged: after a quiet spell a
/// tenant may use this span's worth of its rate at once.
const ALLOWANCE_SPAN: Duration = Duration::from_millis(100);

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn micros(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*EPOCH).as_micros()).unwrap_or(u64::MAX)
}

/// The host's CPU turns, one per core.
static TURNS: LazyLock<Turns> = LazyLock::new(|| {
    Turns::new(std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
});

/// Turns and the calls waiting for one, by tenant.
struct Turns {
    state: Mutex<TurnState>,
}

struct TurnState {
    cores: usize,
    free: usize,
    /// The `used` of the tenant last given a turn: a tenant that starts
    /// waiting is counted from here, so time it spent idle (while others
    /// ran) is no credit.
    clock: u64,
    waiting: Vec<(Arc<Lane>, VecDeque<Arc<Ticket>>)>,
    /// Tenants that asked for a turn within [`ACTIVE_FOR`] (some may have
    /// gone quiet since the last sweep).
    active: Vec<Arc<Lane>>,
    swept: u64,
}

/// A call's place in line for a turn.
#[derive(Default)]
struct Ticket {
    state: Mutex<TicketState>,
}

#[derive(Default)]
enum TicketState {
    #[default]
    Waiting,
    Parked(Waker),
    Granted,
    /// Its call was dropped while it waited.
    Gone,
}

impl TurnState {
    /// The most turns `lane` may hold at `now`: none while its `max_cpu`
    /// allowance is spent; for a tenant whose handlers use much CPU, an
    /// equal share of the cores among the active tenants, so its handlers,
    /// however short, leave cores to the others' handlers and to the host's
    /// own work.
    fn cap(&self, lane: &Lane, now: u64) -> usize {
        if lane.spent(now) {
            0
        } else if lane.heavy() {
            self.cores.div_ceil(self.active.len().max(1))
        } else {
            self.cores
        }
    }

    /// Forgets tenants that have not asked for a turn lately.
    fn sweep(&mut self, now: u64) {
        let window = ACTIVE_FOR.as_micros() as u64;
        if now.saturating_sub(self.swept) >= window / 2 {
            self.swept = now;
            self.active.retain(|lane| {
                let active = now.saturating_sub(lane.asked.load(Ordering::Relaxed)) < window;
                lane.active.store(active, Ordering::Relaxed);
                active
            });
        }
    }

    fn note_asked(&mut self, lane: &Arc<Lane>, now: u64) {
        lane.asked.store(now, Ordering::Relaxed);
        if !lane.active.swap(true, Ordering::Relaxed) {
            self.active.push(lane.clone());
        }
    }

    fn hand_out(&mut self, lane: &Lane) {
        self.free -= 1;
        lane.holding.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives free turns to waiting tenants under their cap, the one that
    /// has used least first; returns the wakers of the calls granted.
    fn dispatch(&mut self, now: u64) -> Vec<Waker> {
        let mut wakers = Vec::new();
        while self.free > 0 {
            let Some(next) = (0..self.waiting.len())
                .filter(|&i| {
                    let lane = &self.waiting[i].0;
                    lane.holding.load(Ordering::Relaxed) < self.cap(lane, now)
                })
                .min_by_key(|&i| self.waiting[i].0.used.load(Ordering::Relaxed))
            else {
                break;
            };
            let lane = self.waiting[next].0.clone();
            let ticket = self.waiting[next]
                .1
                .pop_front()
                .expect("waiting queues are never empty");
            if self.waiting[next].1.is_empty() {
                self.waiting.swap_remove(next);
            }
            let mut ticket_state = ticket.state.locked();
            match std::mem::replace(&mut *ticket_state, TicketState::Granted) {
                TicketState::Gone => *ticket_state = TicketState::Gone,
                TicketState::Waiting => {}
                TicketState::Parked(waker) => wakers.push(waker),
                TicketState::Granted => unreachable!("a ticket is granted once"),
            }
            if matches!(*ticket_state, TicketState::Granted) {
                self.clock = lane.used.load(Ordering::Relaxed);
                self.hand_out(&lane);
            }
        }
        wakers
    }
}

impl Turns {
    fn new(cores: usize) -> Turns {
        Turns {
            state: Mutex::new(TurnState {
                cores,
                free: cores,
                clock: 0,
                waiting: Vec::new(),
                active: Vec::new(),
                swept: 0,
            }),
        }
    }

    /// A turn at once, or a ticket to wait with.
    fn take(&self, lane: &Arc<Lane>, now: Instant) -> Result<(), Arc<Ticket>> {
        let now = micros(now);
        let mut state = self.state.locked();
        state.sweep(now);
        state.note_asked(lane, now);
        let result =
            if state.free > 0 && lane.holding.load(Ordering::Relaxed) < state.cap(lane, now) {
                state.hand_out(lane);
                state.clock = state.clock.max(lane.used.load(Ordering::Relaxed));
                Ok(())
            } else {
                let ticket = Arc::new(Ticket::default());
                match state.waiting.iter_mut().find(|(l, _)| l.id == lane.id) {
                    Some((_, queue)) => queue.push_back(ticket.clone()),
                    None => {
                        lane.used.fetch_max(state.clock, Ordering::Relaxed);
                        state
                            .waiting
                            .push((lane.clone(), VecDeque::from([ticket.clone()])));
                    }
                }
                Err(ticket)
            };
        // A sweep may have raised the cap of tenants already waiting.
        let wakers = state.dispatch(now);
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
        result
    }

    /// Gives a turn back after `ran`.
    fn give_back(&self, lane: &Lane, ran: Duration, now: Instant) {
        let ran = u64::try_from(ran.as_nanos()).unwrap_or(u64::MAX);
        let now = micros(now);
        let mut state = self.state.locked();
        lane.charge(ran, now);
        lane.holding.fetch_sub(1, Ordering::Relaxed);
        state.free += 1;
        let wakers = state.dispatch(now);
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Hands out free turns again once `lane`'s allowance has come back:
    /// no turn given back may come to do it.
    fn allowance_back(&self, lane: &Lane, now: Instant) {
        let now = micros(now);
        let mut state = self.state.locked();
        lane.spent(now);
        let wakers = state.dispatch(now);
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// A call's future, run only while it holds a CPU turn.
pub(crate) struct OnCpu<F> {
    call: Pin<Box<F>>,
    lane: Arc<Lane>,
    ticket: Option<Arc<Ticket>>,
    /// While it waits behind its tenant's spent allowance: until when.
    allowance_back: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<F: Future> OnCpu<F> {
    pub(crate) fn new(lane: &CpuLane, call: F) -> OnCpu<F> {
        OnCpu {
            call: Box::pin(call),
            lane: lane.turns.clone(),
            ticket: None,
            allowance_back: None,
        }
    }

    /// While its tenant's allowance is spent, sleeps until it is back and
    /// then has the turns handed out again.
    fn wait_for_allowance(&mut self, cx: &mut Context<'_>) {
        let Some(back) = self.lane.allowance_back_at() else {
            self.allowance_back = None;
            return;
        };
        let at = tokio::time::Instant::from_std(*EPOCH + Duration::from_micros(back));
        let sleep = self
            .allowance_back
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if sleep.deadline() != at {
            sleep.as_mut().reset(at);
        }
        if sleep.as_mut().poll(cx).is_ready() {
            self.allowance_back = None;
            TURNS.allowance_back(&self.lane, Instant::now());
            cx.waker().wake_by_ref();
        }
    }
}

impl<F: Future> Future for OnCpu<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        if this.ticket.is_none()
            && let Err(ticket) = TURNS.take(&this.lane, Instant::now())
        {
            this.ticket = Some(ticket);
        }
        if let Some(ticket) = &this.ticket {
            let mut state = ticket.state.locked();
            if !matches!(*state, TicketState::Granted) {
                *state = TicketState::Parked(cx.waker().clone());
                drop(state);
                this.wait_for_allowance(cx);
                return Poll::Pending;
            }
            drop(state);
            this.ticket = None;
            this.allowance_back = None;
        }
        let started = Instant::now();
        let polled = this.call.as_mut().poll(cx);
        let now = Instant::now();
        TURNS.give_back(&this.lane, now - started, now);
        polled
    }
}

impl<F> Drop for OnCpu<F> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            let mut state = ticket.state.locked();
            if matches!(*state, TicketState::Granted) {
                drop(state);
                TURNS.give_back(&self.lane, Duration::ZERO, Instant::now());
            } else {
                *state = TicketState::Gone;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane() -> Arc<Lane> {
        CpuLane::new(None).turns
    }

    impl std::fmt::Debug for Ticket {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Ticket")
        }
    }

    fn granted(ticket: &Ticket) -> bool {
        matches!(*ticket.state.locked(), TicketState::Granted)
    }

    const MS: Duration = Duration::from_millis(1);

    fn at(ms: u64) -> Instant {
        *EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn a_tenant_alone_takes_every_turn() {
        let turns = Turns::new(2);
        let a = lane();
        assert!(turns.take(&a, at(0)).is_ok());
        assert!(turns.take(&a, at(0)).is_ok());
        let third = turns
            .take(&a, at(0))
            .expect_err("a third turn on two cores");
        turns.give_back(&a, MS, at(0));
        assert!(granted(&third));
    }

    #[test]
    fn a_freed_turn_goes_to_the_tenant_that_used_least() {
        let turns = Turns::new(1);
        let (busy, quiet) = (lane(), lane());
        turns.take(&busy, at(0)).expect("a free turn");
        let busy_next: Vec<_> = (0..3)
            .map(|_| turns.take(&busy, at(0)).expect_err("no free turn"))
            .collect();
        let quiet_next = turns.take(&quiet, at(0)).expect_err("no free turn");
        turns.give_back(&busy, MS, at(0));
        assert!(granted(&quiet_next), "the busy tenant went first again");
        assert!(!busy_next.iter().any(|t| granted(t)));
        turns.give_back(&quiet, MS / 10, at(0));
        assert!(granted(&busy_next[0]));
    }

    #[test]
    fn time_a_tenant_spent_idle_is_no_credit() {
        let turns = Turns::new(1);
        let (a, b) = (lane(), lane());
        // A runs alone for a second.
        for _ in 0..10 {
            turns.take(&a, at(0)).expect("a free turn");
            turns.give_back(&a, 100 * MS, at(0));
        }
        turns.take(&a, at(0)).expect("a free turn");
        let a_next = turns.take(&a, at(0)).expect_err("no free turn");
        let b_next = turns.take(&b, at(0)).expect_err("no free turn");
        turns.give_back(&a, MS, at(0));
        assert!(granted(&b_next));
        turns.give_back(&b, 2 * MS, at(0));
        assert!(granted(&a_next), "B was owed the second it did not want");
    }

    #[test]
    fn a_waiter_that_went_away_passes_its_turn_on() {
        let turns = Turns::new(1);
        let (a, b) = (lane(), lane());
        turns.take(&a, at(0)).expect("a free turn");
        let gone = turns.take(&b, at(0)).expect_err("no free turn");
        let next = turns.take(&a, at(0)).expect_err("no free turn");
        *gone.state.locked() = TicketState::Gone;
        turns.give_back(&a, MS, at(0));
        assert!(granted(&next));
        turns.give_back(&a, MS, at(0));
        assert!(turns.take(&b, at(0)).is_ok(), "the turn was not given back");
    }

    #[test]
    fn a_busy_tenant_leaves_a_core_to_an_active_neighbour_until_it_goes_quiet() {
        let turns = Turns::new(2);
        let (busy, quiet) = (lane(), lane());
        // Half a core over the last window.
        turns.take(&busy, at(0)).expect("a free turn");
        turns.give_back(&busy, 50 * MS, at(50));
        turns.take(&busy, at(50)).expect("a free turn");
        turns.take(&quiet, at(50)).expect("a free turn");
        turns.give_back(&quiet, MS, at(51));
        let capped = turns
            .take(&busy, at(51))
            .expect_err("a second core while the neighbour is active");
        turns.give_back(&busy, MS, at(52));
        assert!(granted(&capped), "the busy tenant's own turn came back");
        // A hundred milliseconds without a word from the neighbour: both
        // cores are the busy tenant's again.
        assert!(turns.take(&busy, at(200)).is_ok());
    }

    #[test]
    fn a_tenant_past_its_max_cpu_waits_for_its_allowance_on_an_idle_host() {
        let turns = Turns::new(2);
        // A tenth of a core: 10 ms of allowance, refilled at 1 ms per 10 ms.
        let limited = CpuLane::new(Some(100)).turns;
        turns.take(&limited, at(0)).expect("a free turn");
        // A slice runs 15 ms: 5 ms owed, though both cores are free.
        turns.give_back(&limited, 15 * MS, at(15));
        let waiting = turns
            .take(&limited, at(15))
            .expect_err("a turn past the allowance");
        assert_eq!(
            limited.allowance_back_at(),
            Some(micros(at(15)) + 50_001),
            "5 ms come back at a tenth of a core in 50 ms"
        );
        turns.allowance_back(&limited, at(60));
        assert!(!granted(&waiting), "granted before the allowance was back");
        turns.allowance_back(&limited, at(66));
        assert!(granted(&waiting), "not granted once it was back");
        // Another tenant is not held by it.
        let other = lane();
        assert!(turns.take(&other, at(23)).is_ok());
    }

    #[test]
    fn an_allowance_holds_at_most_its_span() {
        let limited = CpuLane::new(Some(500)).turns;
        assert!(!limited.spent(micros(at(0))));
        // A second idle: still only 50 ms (100 ms at half a core) to spend.
        limited.charge(50_000_000, micros(at(1000)));
        assert!(limited.spent(micros(at(1000))));
        assert!(!limited.spent(micros(at(1001))));
    }

    #[test]
    fn a_tenant_whose_handlers_use_little_is_not_held_to_a_share() {
        let turns = Turns::new(2);
        let (light, other) = (lane(), lane());
        turns.take(&other, at(0)).expect("a free turn");
        turns.give_back(&other, MS, at(1));
        turns.take(&light, at(1)).expect("a free turn");
        assert!(
            turns.take(&light, at(1)).is_ok(),
            "a light tenant was held to one core"
        );
    }
}
