//! Running deliveries: a fresh instance per delivery, or instances kept for
//! reuse by one mount's module.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use wasmtime::{Store, Trap, UpdateDeadline};

use super::contract::{Handler, HandlerPre};
use super::cpu::{CpuLane, OnCpu};
use super::http::HttpConnections;
use super::http::HttpTrace;
use super::module::{Failure, Module, PoolNeeds};
use super::outbox::{Outgoing, Owners};
use super::output::GuestLog;
use super::store::{InstanceSetup, StoreState};
use super::tags::LogTags;
use super::{Delivery, Outcome};
use crate::sync::Locked;
use crate::telemetry::Telemetry;
use wharf_core::brokers::BrokerKind;
use wharf_core::config::{InstancePolicy, TenantBudget};
use wharf_core::grants::Grants;
use wharf_core::trace::TraceContext;

/// The budget of one handler call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Wall-clock time for instantiation and the call together.
    pub timeout: Duration,
    /// Linear memory of the instance, in bytes.
    pub memory: u64,
}

/// One tenant's share of the host, as its instances see it.
#[derive(Clone)]
pub struct TenantShare {
    /// Instance memory, if the tenant sets `max_memory`.
    pub memory: Option<MemoryBudget>,
    /// Where its handlers take turns on the cores.
    pub lane: CpuLane,
    /// Its outbound HTTP connections.
    pub http_connections: HttpConnections,
    /// What its handlers may log.
    pub log: GuestLog,
}

impl TenantShare {
    /// The share `budget` gives.
    pub fn new(budget: &TenantBudget) -> TenantShare {
        TenantShare {
            memory: budget.max_memory.map(MemoryBudget::new),
            lane: CpuLane::new(budget.max_cpu),
            http_connections: HttpConnections::new(budget.max_http_connections),
            log: GuestLog::new(budget.log_rate, budget.log_level),
        }
    }
}

/// Memory shared by several mounts' instances (a tenant's `max_memory`).
/// Every instance, running or kept for reuse, holds its mount's `memory`
/// from it; a mount waits for room before it takes a delivery, and kept
/// instances are dropped to make that room.
#[derive(Clone)]
pub struct MemoryBudget {
    pages: Arc<Semaphore>,
    kept: Kept,
}

/// The unit memory is counted in: one wasm page.
const PAGE: u64 = 64 * 1024;

impl MemoryBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> MemoryBudget {
        let pages = usize::try_from(bytes / PAGE).unwrap_or(usize::MAX);
        MemoryBudget {
            pages: Arc::new(Semaphore::new(pages.min(Semaphore::MAX_PERMITS))),
            kept: Kept::default(),
        }
    }

    async fn reserve(&self, bytes: u64) -> OwnedSemaphorePermit {
        let pages = u32::try_from(bytes.div_ceil(PAGE)).unwrap_or(u32::MAX);
        self.kept.take(&self.pages, pages).await
    }
}

/// Instances kept for reuse, as a shared limit sees them: room they hold
/// that a running instance needs is taken back from them, longest idle
/// first, so a kept instance never makes a delivery wait.
#[derive(Clone, Default)]
struct Kept {
    inner: Arc<KeptInner>,
}

#[derive(Default)]
struct KeptInner {
    lists: Mutex<Vec<Weak<IdleList>>>,
    /// Reservations waiting for room: while any waits, nothing more is kept.
    waiting: AtomicUsize,
}

/// One mount's instances kept for reuse.
type IdleList = Mutex<Vec<Instance>>;

impl Kept {
    fn register(&self, list: &Arc<IdleList>) {
        let mut lists = self.inner.lists.locked();
        lists.retain(|list| list.strong_count() > 0);
        lists.push(Arc::downgrade(list));
    }

    /// Whether a reservation waits for room that kept instances would hold.
    fn wanted(&self) -> bool {
        self.inner.waiting.load(Ordering::SeqCst) > 0
    }

    /// Drops the longest-idle kept instance; false when none is kept.
    fn drop_one(&self) -> bool {
        let lists: Vec<Arc<IdleList>> = self
            .inner
            .lists
            .locked()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let oldest = lists
            .iter()
            .filter_map(|list| {
                let since = list.locked().first().map(|instance| instance.idle_since)?;
                Some((since, list))
            })
            .min_by_key(|(since, _)| *since);
        let Some((_, list)) = oldest else {
            return false;
        };
        let dropped = {
            let mut idle = list.locked();
            (!idle.is_empty()).then(|| idle.remove(0))
        };
        // A list emptied since it was looked at still made progress.
        drop(dropped);
        true
    }

    /// `n` permits of `semaphore`, dropping kept instances while it has too
    /// few, then waiting for running ones to finish.
    async fn take(&self, semaphore: &Arc<Semaphore>, n: u32) -> OwnedSemaphorePermit {
        let closed = "budget semaphores are never closed";
        if let Ok(permit) = semaphore.clone().try_acquire_many_owned(n) {
            return permit;
        }
        // Counted before looking at the kept instances, and `keep` looks at
        // the count under the idle list's lock: an instance is either seen
        // here or not kept at all.
        self.inner.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.inner.waiting);
        loop {
            match semaphore.clone().try_acquire_many_owned(n) {
                Ok(permit) => return permit,
                Err(TryAcquireError::Closed) => unreachable!("{closed}"),
                Err(TryAcquireError::NoPermits) if self.drop_one() => {}
                Err(TryAcquireError::NoPermits) => break,
            }
        }
        semaphore.clone().acquire_many_owned(n).await.expect(closed)
    }
}

/// Counts a reservation as waiting until dropped (also when cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Room in the host's instance pool, shared by every mount: a delivery
/// waits here for an instance (back-pressure), so the pool itself never
/// runs out and no delivery fails for want of one.
#[derive(Clone)]
pub struct InstanceSlots {
    instances: Arc<Semaphore>,
    memories: Arc<Semaphore>,
    tables: Arc<Semaphore>,
    /// Instances for trying a module out before it is swapped in; the pool
    /// holds room for them beyond the mounts' share.
    probes: Arc<Semaphore>,
    totals: (u32, u32),
    kept: Kept,
}

/// An instance's room in the pool, given back when dropped.
struct SlotPermit {
    _permits: Vec<OwnedSemaphorePermit>,
}

impl InstanceSlots {
    pub(crate) fn new(instances: u32, memories: u32, tables: u32) -> InstanceSlots {
        let semaphore = |n: u32| Arc::new(Semaphore::new(n as usize));
        InstanceSlots {
            instances: semaphore(instances),
            memories: semaphore(memories),
            tables: semaphore(tables),
            probes: semaphore(2),
            totals: (memories, tables),
            kept: Kept::default(),
        }
    }

    /// The memories and tables the mounts' instances may hold together.
    pub(crate) fn totals(&self) -> (u32, u32) {
        self.totals
    }

    async fn acquire(&self, needs: PoolNeeds) -> SlotPermit {
        let mut permits = vec![self.kept.take(&self.instances, 1).await];
        for (semaphore, n) in [
            (&self.memories, needs.memories),
            (&self.tables, needs.tables),
        ] {
            if n > 0 {
                permits.push(self.kept.take(semaphore, n).await);
            }
        }
        SlotPermit { _permits: permits }
    }

    async fn acquire_probe(&self) -> SlotPermit {
        let permit = self.probes.clone().acquire_owned().await;
        SlotPermit {
            _permits: vec![permit.expect("instance slot semaphores are never closed")],
        }
    }
}

/// How one mount runs its module: limits, grants, reuse, and the instances
/// kept for reuse. A new module version gets a new `Instances`.
pub struct Instances {
    module: Module,
    limits: CallLimits,
    policy: InstancePolicy,
    setup: Arc<InstanceSetup>,
    budget: Option<MemoryBudget>,
    lane: CpuLane,
    slots: InstanceSlots,
    idle: Arc<IdleList>,
    /// When these instances were set up: what a fresh instance's idle time
    /// starts from, so making one reads no clock.
    created: Instant,
}

/// An instance ready for one delivery of the mount whose [`Instances`] it
/// came from.
pub struct Reserved {
    instances: Arc<Instances>,
    instance: Instance,
}

impl Reserved {
    /// The instances this one belongs to.
    pub fn instances(&self) -> &Arc<Instances> {
        &self.instances
    }

    /// The trace context of the delivery it will handle: its HTTP
    /// requests are spans below it (recorded in `telemetry`), each
    /// carrying its own context.
    pub fn traced(mut self, trace: Option<&TraceContext>, telemetry: &Telemetry) -> Reserved {
        self.instance.store.data_mut().http_gate.trace = HttpTrace {
            context: trace.cloned(),
            telemetry: telemetry.clone(),
        };
        self
    }

    /// Runs one delivery from a broker of kind `broker` (which reads the
    /// addresses its outputs go to) and reports the handler's outcome or
    /// why it failed, and what it sent. Instantiation counts against the
    /// call's timeout.
    pub async fn call(self, delivery: &Delivery, broker: BrokerKind) -> Call {
        self.instances.call(self.instance, delivery, broker).await
    }
}

/// What one handler call came to.
pub struct Call {
    /// The handler's outcome, or why it has none.
    pub result: Result<Outcome, Failure>,
    /// The messages it sent through the outbox, in order; none when it
    /// failed.
    pub outputs: Vec<Outgoing>,
    /// Keeps the instance's memory counted in its budget until dropped, so
    /// a delivery holds it until it is settled.
    pub memory: MemoryHeld,
}

/// Memory of a finished instance still counted in its budget.
pub struct MemoryHeld(
    #[allow(dead_code, reason = "held for its drop")] Option<OwnedSemaphorePermit>,
);

/// A kept instance, or a fresh store with its memory reserved.
struct Instance {
    store: Store<StoreState>,
    /// `None` until instantiated: a fresh store is instantiated inside the
    /// call, under the call's deadline.
    handler: Option<Handler>,
    uses: u32,
    idle_since: Instant,
    memory: Option<OwnedSemaphorePermit>,
    _slot: SlotPermit,
}

impl Instances {
    /// The module's instance template for this mount's grants.
    fn pre(&self) -> &HandlerPre {
        let http = !self.setup.grants.http.allowed.is_empty();
        self.module.compiled.pre(http)
    }

    /// Runs `module` for a mount under `limits` and `grants` (its replies
    /// kept from what `owners` says other tenants own), within its tenant's
    /// `share` (memory, CPU lane, HTTP connections, log), their room in the
    /// pool taken from `slots`.
    #[allow(
        clippy::too_many_arguments,
        reason = "each is a separate limit, named at the call"
    )]
    pub fn new(
        module: Module,
        limits: CallLimits,
        policy: InstancePolicy,
        grants: Grants,
        tags: Arc<LogTags>,
        owners: Owners,
        share: TenantShare,
        slots: InstanceSlots,
    ) -> Instances {
        let TenantShare {
            memory,
            lane,
            http_connections,
            log,
        } = share;
        let idle = Arc::new(IdleList::default());
        slots.kept.register(&idle);
        if let Some(budget) = &memory {
            budget.kept.register(&idle);
        }
        Instances {
            module,
            limits,
            policy,
            setup: Arc::new(InstanceSetup::new(
                tags,
                grants,
                owners,
                http_connections,
                log,
            )),
            budget: memory,
            lane,
            slots,
            idle,
            created: Instant::now(),
        }
    }

    /// Instantiates the module once, as a delivery would, and throws the
    /// instance away: a module whose start-up traps, or calls something the
    /// mount does not grant, is refused before it serves a delivery.
    pub async fn probe(&self) -> Result<(), Failure> {
        let slot = self.slots.acquire_probe().await;
        let mut instance = self.fresh(None, slot);
        let timeout = self.limits.timeout;
        instance
            .store
            .data_mut()
            .begin_call(Instant::now() + timeout);
        instance.store.set_epoch_deadline(1);
        let instantiate = self.pre().instantiate_async(&mut instance.store);
        let instantiated = tokio::time::timeout(timeout, OnCpu::new(&self.lane, instantiate)).await;
        instance.store.data_mut().end_call();
        match instantiated {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(match Failure::classify(&e, timeout, Failure::Instantiate) {
                Failure::Instantiate(_) | Failure::Trap(_)
                    if instance.store.data().memory.refused =>
                {
                    Failure::OutOfMemory(self.limits.memory)
                }
                other => other,
            }),
            Err(_) => Err(Failure::Timeout(timeout)),
        }
    }

    /// The module these instances run.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// An instance for the next delivery: a kept one, or a fresh one once
    /// the memory budget and the pool have room for it.
    pub async fn reserve(self: &Arc<Self>) -> Reserved {
        let instance = match self.take_idle() {
            Some(instance) => instance,
            None => {
                let memory = match &self.budget {
                    Some(budget) => Some(budget.reserve(self.limits.memory).await),
                    None => None,
                };
                let slot = self.slots.acquire(self.module.pool_needs()).await;
                self.fresh(memory, slot)
            }
        };
        Reserved {
            instances: self.clone(),
            instance,
        }
    }

    /// Runs a delivery on the CPU turns of the mount's tenant: the call,
    /// and throwing away a failed instance (a store holding a thousand
    /// header maps takes a while to free), count as the tenant's CPU.
    async fn call(&self, instance: Instance, delivery: &Delivery, broker: BrokerKind) -> Call {
        OnCpu::new(&self.lane, self.call_on_cpu(instance, delivery, broker)).await
    }

    async fn call_on_cpu(
        &self,
        mut instance: Instance,
        delivery: &Delivery,
        broker: BrokerKind,
    ) -> Call {
        let timeout = self.limits.timeout;
        let deadline = Instant::now() + timeout;
        let store = &mut instance.store;
        store.data_mut().begin_call(deadline);
        store.data_mut().outbox.begin(delivery, broker);
        store.set_epoch_deadline(1);
        // The epoch check only fires while wasm runs; a guest parked in a
        // host call (a WASI sleep) is caught by this outer timer.
        let run = self.run(&mut instance, delivery);
        let result = tokio::time::timeout_at(deadline.into(), run)
            .await
            .unwrap_or(Err(Failure::Timeout(timeout)));
        instance.store.data_mut().end_call();
        let mut outputs = instance.store.data_mut().outbox.take();
        let result = match result {
            Err(Failure::Trap(_) | Failure::Instantiate(_))
                if instance.store.data().memory.refused =>
            {
                Err(Failure::OutOfMemory(self.limits.memory))
            }
            other => other,
        };
        instance.uses += 1;
        // An instance that failed may be in any state: never reuse it.
        let held = if result.is_ok() {
            self.keep(instance)
        } else {
            outputs.clear();
            instance.memory.take()
        };
        Call {
            result,
            outputs,
            memory: MemoryHeld(held),
        }
    }

    async fn run(&self, instance: &mut Instance, delivery: &Delivery) -> Result<Outcome, Failure> {
        let kept = instance.handler.is_some();
        let result = match self.run_once(instance, delivery).await {
            // A kept instance whose runtime called out while its arguments
            // were being lowered (Go's collector reads the clock inside
            // `cabi_realloc`, which the component model forbids) failed
            // through no fault of the handler: once more on a fresh one.
            Err(e)
                if kept && matches!(e.downcast_ref::<Trap>(), Some(Trap::CannotLeaveComponent)) =>
            {
                tracing::debug!(error = ?e, "a kept instance could not take its delivery; trying a fresh one");
                let deadline = instance.store.data().deadline;
                let broker = instance.store.data().outbox.broker();
                let trace = std::mem::take(&mut instance.store.data_mut().http_gate.trace);
                instance.store = self.store();
                instance.store.data_mut().http_gate.trace = trace;
                instance.handler = None;
                instance.uses = 0;
                instance.store.data_mut().begin_call(deadline);
                instance.store.data_mut().outbox.begin(delivery, broker);
                instance.store.set_epoch_deadline(1);
                self.run_once(instance, delivery).await
            }
            other => other,
        };
        result.map_err(|e| match instance.handler {
            None => Failure::classify(&e, self.limits.timeout, Failure::Instantiate),
            Some(_) => Failure::classify(&e, self.limits.timeout, Failure::Trap),
        })
    }

    /// Instantiates the instance if it is fresh, then calls its handler.
    async fn run_once(
        &self,
        instance: &mut Instance,
        delivery: &Delivery,
    ) -> wasmtime::Result<Outcome> {
        let Instance { store, handler, .. } = instance;
        let handler = match handler {
            Some(handler) => handler,
            None => handler.insert(self.pre().instantiate_async(&mut *store).await?),
        };
        handler.call_handle(&mut *store, delivery).await
    }

    /// Drops instances unused for longer than the policy's `max_idle`.
    pub fn prune_idle(&self) {
        if let InstancePolicy::Reuse { max_idle, .. } = self.policy {
            self.idle_list()
                .retain(|instance| instance.idle_since.elapsed() < max_idle);
        }
    }

    /// Bytes of handler output dropped over the per-delivery allowance since
    /// the last time this was asked.
    pub fn take_output_dropped(&self) -> u64 {
        self.setup.take_output_dropped()
    }

    fn take_idle(&self) -> Option<Instance> {
        self.prune_idle();
        self.idle_list().pop()
    }

    /// Keeps `instance` for reuse if the policy allows and no other
    /// instance waits for the room it holds; else gives back its memory
    /// reservation.
    fn keep(&self, mut instance: Instance) -> Option<OwnedSemaphorePermit> {
        if let InstancePolicy::Reuse { max_uses, .. } = self.policy
            && instance.uses < max_uses
        {
            let mut idle = self.idle_list();
            let wanted = self.slots.kept.wanted()
                || self
                    .budget
                    .as_ref()
                    .is_some_and(|budget| budget.kept.wanted());
            if !wanted {
                instance.idle_since = Instant::now();
                idle.push(instance);
                return None;
            }
        }
        instance.memory.take()
    }

    fn fresh(&self, memory: Option<OwnedSemaphorePermit>, slot: SlotPermit) -> Instance {
        Instance {
            store: self.store(),
            handler: None,
            uses: 0,
            // Set when the instance is kept; a fresh one has not idled.
            idle_since: self.created,
            memory,
            _slot: slot,
        }
    }

    /// A store for a fresh instance, under the mount's limits.
    fn store(&self) -> Store<StoreState> {
        let compiled = &self.module.compiled;
        let state = StoreState::new(self.setup.clone(), self.limits.memory, self.lane.clone());
        let mut store = Store::new(&compiled.engine, state);
        store.limiter(|state| &mut state.memory);
        // At every tick: stop a call past its deadline, let a short one
        // yield to the runtime, and make a long one wait its turn.
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            if Instant::now() >= state.deadline {
                return Ok(UpdateDeadline::Interrupt);
            }
            Ok(match state.cpu.tick() {
                None => UpdateDeadline::Yield(1),
                Some(turn) => UpdateDeadline::YieldCustom(1, turn),
            })
        });
        store
    }

    fn idle_list(&self) -> std::sync::MutexGuard<'_, Vec<Instance>> {
        self.idle.locked()
    }
}
