//! One mount at work: attach its links, take deliveries, run the handler on
//! each, carry out the settlement plan; when its links go down, attach
//! them again; stop without losing anything.
//!
//! - [`attach`]: the links and what the broker offers on them;
//! - [`receive`]: the receive loop, draining, and what happens when the link
//!   dies;
//! - [`deliver`]: one delivery through the sandbox;
//! - [`settle`]: carrying out a plan on the link.

mod attach;
mod breaker;
mod context;
mod deliver;
mod order;
mod receive;
mod report;
mod settle;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::budget::{Buffered, TenantLimits};
use super::supervisor::{self, State, Supervised};
use crate::admin::{Health, MountMetrics};
use crate::broker::management::{self, QueueInfo};
use crate::broker::{BrokerError, BrokerOffers, BrokerPool};
use crate::events::Event;
use crate::logging::{Repeats, Tell, human};
use crate::sandbox::{CallLimits, InstanceSlots, Instances, LogTags, Module, Owners};
use crate::sync::{Locked, ReadWrite};
use crate::telemetry::Telemetry;
pub(crate) use attach::AttachedMount;
use attach::Links;
pub(crate) use order::KeysNow;
use wharf_core::backoff::{Backoff, BackoffPolicy};
use wharf_core::brokers::QueueKind;
use wharf_core::config::{Broker, Mount};
use wharf_core::message::{AmqpMessage, RetryKey};
use wharf_core::settlement::Counters;
use wharf_core::text::shown;

/// The module a mount runs, swapped whole when its file changes: deliveries
/// already running finish on the instances they started with.
pub(crate) struct ModuleSlot {
    current: RwLock<Arc<Instances>>,
}

impl ModuleSlot {
    pub(crate) fn new(instances: Arc<Instances>) -> ModuleSlot {
        ModuleSlot {
            current: RwLock::new(instances),
        }
    }

    /// The instances new deliveries use.
    pub(crate) fn current(&self) -> Arc<Instances> {
        self.current.reading().clone()
    }

    /// Makes `instances` the ones new deliveries use.
    pub(crate) fn replace(&self, instances: Arc<Instances>) {
        *self.current.writing() = instances;
    }
}

/// What a mount runs its module with; a reloaded module gets the same.
pub(crate) fn instances_for(
    mount: &Mount,
    module: Module,
    tags: &Arc<LogTags>,
    owners: &Owners,
    tenant: &TenantLimits,
    slots: &InstanceSlots,
) -> Arc<Instances> {
    let limits = CallLimits {
        timeout: mount.timeout,
        memory: mount.memory,
    };
    Arc::new(Instances::new(
        module,
        limits,
        mount.instance,
        mount.grants.clone(),
        tags.clone(),
        owners.clone(),
        tenant.share(),
        slots.clone(),
    ))
}

/// Everything about a mount that outlives its links: attaching again after
/// a failure reuses it.
pub(crate) struct MountSpec {
    pub(crate) tags: Arc<LogTags>,
    /// The span every line about the mount sits in ([`report::mount_span`]).
    pub(crate) span: tracing::Span,
    pub(crate) config: Mount,
    pub(crate) broker: Broker,
    pub(crate) module: Arc<ModuleSlot>,
    pub(crate) tenant: Arc<TenantLimits>,
    pub(crate) events: broadcast::Sender<Event>,
    pub(crate) metrics: MountMetrics,
    /// Where the spans of its deliveries go.
    pub(crate) telemetry: Telemetry,
    /// The waits after a failed copy or dead-letter publish, shared by the
    /// mount's deliveries so a broker refusing publishes slows them all.
    pub(crate) publish_backoff: Mutex<Backoff>,
    /// How long in-flight deliveries may still run when the mount stops.
    pub(crate) grace: Duration,
    /// Tells this attach of the mount from earlier ones, in link names.
    pub(crate) generation: u64,
    /// Bytes of deliveries the whole host holds.
    pub(crate) host_buffered: Buffered,
    /// The key copies' retry counts are sealed with, if any.
    pub(crate) retry_key: Option<RetryKey>,
    /// On while an operator (or the config) has the mount paused.
    pub(crate) paused: watch::Receiver<bool>,
    /// The circuit breaker, if the mount has one.
    pub(crate) breaker: Option<breaker::MountBreaker>,
    /// The queue behind the address, once asked: `Some(None)` when the
    /// broker has no such queue.
    queue: Mutex<Option<Option<QueueInfo>>>,
    /// Set once the broker was caught handing `modified` deliveries back
    /// uncounted: from then on retries are copies, across reattaches.
    count_by_copy: AtomicBool,
    /// Set when the mount is removed from the config: its durable topic
    /// subscription ends with it, where a stop or a crash leaves it for the
    /// next start.
    ends_subscription: AtomicBool,
    /// Deliveries settled `modified`, by a digest of their message id:
    /// which message it was (a digest of its identity, since publishers
    /// reuse ids), the attempt it was on and how often in a row it came
    /// back on it. Digests keep each entry small whatever ids publishers
    /// choose.
    returned: Mutex<HashMap<Digest, Returned>>,
}

/// The first bytes of a SHA-256 digest: enough to tell messages apart.
type Digest = [u8; 16];

fn digest(text: &str) -> Digest {
    use sha2::Digest as _;
    let full = sha2::Sha256::digest(text.as_bytes());
    let mut short = [0; 16];
    short.copy_from_slice(&full[..16]);
    short
}

/// A delivery settled `modified`, remembered to see whether it comes back
/// counted.
struct Returned {
    identity: Digest,
    attempt: u32,
    times: u32,
}

/// How often in a row a delivery may come back on the same attempt before
/// the mount stops trusting the broker's count.
const UNCOUNTED_RETURNS: u32 = 3;

/// Deliveries remembered for the uncounted-return check; older ones are
/// forgotten.
const RETURNS_REMEMBERED: usize = 10_000;

/// RabbitMQ 4 and later, which can say what kind of queue an address is.
fn is_rabbitmq_4(offers: &BrokerOffers) -> bool {
    let major = offers
        .version
        .as_deref()
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok());
    offers.product.as_deref() == Some("RabbitMQ") && major.is_some_and(|major| major >= 4)
}

impl MountSpec {
    #[allow(
        clippy::too_many_arguments,
        reason = "every part is needed, and named at the one call"
    )]
    pub(crate) fn new(
        tags: Arc<LogTags>,
        config: Mount,
        broker: Broker,
        module: Arc<ModuleSlot>,
        tenant: Arc<TenantLimits>,
        events: broadcast::Sender<Event>,
        metrics: MountMetrics,
        telemetry: Telemetry,
        grace: Duration,
        generation: u64,
        host_buffered: Buffered,
        retry_key: Option<RetryKey>,
        paused: watch::Receiver<bool>,
    ) -> MountSpec {
        MountSpec {
            publish_backoff: Mutex::new(Backoff::new(BackoffPolicy {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(30),
            })),
            span: report::mount_span(&tags),
            tags,
            breaker: config.breaker.map(breaker::MountBreaker::new),
            config,
            broker,
            module,
            tenant,
            events,
            metrics,
            telemetry,
            grace,
            generation,
            host_buffered,
            retry_key,
            paused,
            queue: Mutex::new(None),
            count_by_copy: AtomicBool::new(false),
            ends_subscription: AtomicBool::new(false),
            returned: Mutex::new(HashMap::new()),
        }
    }

    /// Makes the mount's next stop end its durable topic subscription.
    pub(crate) fn end_subscription_on_stop(&self) {
        self.ends_subscription.store(true, Ordering::Relaxed);
    }

    /// Whether stopping ends the durable topic subscription.
    pub(crate) fn ends_subscription(&self) -> bool {
        self.ends_subscription.load(Ordering::Relaxed)
    }

    /// The link credit the mount attaches with: its `credit`, lowered
    /// where that many deliveries of `max_message_size` would not fit its
    /// share of the tenant's `max_buffered` (the budget divided among the
    /// tenant's mounts), so what the broker may send ahead of the host's
    /// asking stays within the budget too.
    pub(crate) fn credit(&self) -> u32 {
        let fits = self.tenant.buffered_share() / self.config.max_message_size.max(1);
        self.config
            .credit
            .min(u32::try_from(fits).unwrap_or(u32::MAX))
            .max(1)
    }

    /// Whether retries are copies because the broker counts nothing.
    pub(crate) fn counts_by_copy(&self) -> bool {
        self.count_by_copy.load(Ordering::Relaxed)
    }

    /// Notes a delivery about to be planned: one that comes back on the
    /// attempt it was settled `modified` on, again and again, shows a
    /// broker that counts nothing, and switches the mount to copies.
    pub(crate) fn note_attempt(&self, message: &AmqpMessage, counters: &Counters) {
        let Some(id) = message.message_id() else {
            return;
        };
        if counters.is_copy() || self.counts_by_copy() {
            return;
        }
        let attempt = counters.attempt();
        let mut returned = self.returned.locked();
        let key = digest(&id);
        let Some(last) = returned.get_mut(&key) else {
            return;
        };
        // Another message under the same id proves nothing.
        if last.identity != digest(&message.identity()) {
            return;
        }
        if last.attempt != attempt {
            returned.remove(&key);
            return;
        }
        last.times += 1;
        if last.times >= UNCOUNTED_RETURNS {
            returned.clear();
            self.count_by_copy.store(true, Ordering::Relaxed);
            tracing::warn!(
                message_id = %shown(&id),
                attempt,
                "the broker hands `modified` deliveries back without counting them; retries are copies from now on"
            );
        }
    }

    /// Remembers a delivery settled `modified` on `attempt`.
    pub(crate) fn note_modified(&self, message: &AmqpMessage, attempt: u32) {
        let Some(id) = message.message_id() else {
            return;
        };
        let identity = digest(&message.identity());
        let mut returned = self.returned.locked();
        if returned.len() >= RETURNS_REMEMBERED {
            returned.clear();
        }
        let entry = returned.entry(digest(&id)).or_insert(Returned {
            identity,
            attempt,
            times: 0,
        });
        if entry.identity != identity {
            *entry = Returned {
                identity,
                attempt,
                times: 0,
            };
        }
        entry.attempt = attempt;
    }

    /// The pause after a failed copy or dead-letter publish.
    pub(crate) fn publish_backoff_next(&self) -> Duration {
        self.backoff().next_wait()
    }

    /// A publish went through: the next failure pauses briefly again.
    pub(crate) fn publish_backoff_reset(&self) {
        self.backoff().reset();
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.publish_backoff.locked()
    }

    /// Attaches the mount's links on a new session from `pool`.
    pub(crate) async fn attach(
        self: &Arc<Self>,
        pool: &BrokerPool,
    ) -> Result<AttachedMount, Arc<BrokerError>> {
        let attach = async {
            let session = pool.session().await?;
            let offers = session.offers.clone();
            let links = Links::attach(self.clone(), session, pool.clone())
                .await
                .map_err(Arc::new)?;
            // Asked once the receiver is attached: a v1 address declares
            // its queue on attach.
            let queue = self.queue(pool, &offers).await;
            Ok(links.on_queue(queue))
        };
        attach.instrument(self.span.clone()).await
    }

    /// What kind of queue the mount consumes from, where the broker can
    /// say (RabbitMQ 4's management node) and the config leaves the retry
    /// path open; asked once per mount.
    async fn queue(&self, pool: &BrokerPool, offers: &BrokerOffers) -> Option<QueueInfo> {
        if self.config.retry.is_some() || !is_rabbitmq_4(offers) {
            return None;
        }
        if let Some(known) = self.queue.locked().clone() {
            return known;
        }
        let queue = management::queue_of(&self.config.address)?;
        let asked = match pool.session().await {
            Ok(session) => {
                management::queue_info(session, &queue, self.broker.attach_timeout).await
            }
            Err(e) => Err(e.to_string()),
        };
        let known = match asked {
            Ok(Some(info)) => Some(info),
            Ok(None) => {
                tracing::warn!(queue, "the broker knows no such queue; retries are copies");
                Some(QueueInfo {
                    name: queue,
                    kind: QueueKind::Other("missing".to_owned()),
                    dead_letter_exchange: None,
                })
            }
            Err(error) => {
                tracing::warn!(
                    queue,
                    "cannot ask the broker what kind of queue this is ({error}); retries are copies"
                );
                Some(QueueInfo {
                    name: queue,
                    kind: QueueKind::Other("unknown".to_owned()),
                    dead_letter_exchange: None,
                })
            }
        };
        *self.queue.locked() = Some(known.clone());
        known
    }
}

/// Keeps a mount attached until `stop` is cancelled: attaches (starting
/// with `first`, if the caller attached it already), runs, and after a
/// failure backs off and attaches again. Its state goes to `health`.
pub(crate) async fn supervise(
    spec: Arc<MountSpec>,
    pool: BrokerPool,
    first: Option<AttachedMount>,
    stop: CancellationToken,
    health: Arc<Health>,
) {
    let policy = spec.broker.reconnect;
    let span = spec.span.clone();
    let mut mount = SupervisedMount {
        spec,
        pool,
        first,
        stop: stop.clone(),
        health,
        permanent: false,
        repeats: Repeats::default(),
    };
    supervisor::supervise(&mut mount, policy, &stop)
        .instrument(span)
        .await;
}

struct SupervisedMount {
    spec: Arc<MountSpec>,
    pool: BrokerPool,
    first: Option<AttachedMount>,
    stop: CancellationToken,
    health: Arc<Health>,
    /// The last attach failed in a way retrying cannot mend.
    permanent: bool,
    repeats: Repeats,
}

impl Supervised for SupervisedMount {
    type Up = AttachedMount;
    type Error = Arc<BrokerError>;

    async fn attach(&mut self) -> Result<AttachedMount, Arc<BrokerError>> {
        match self.first.take() {
            Some(attached) => Ok(attached),
            None => Box::pin(self.spec.attach(&self.pool)).await,
        }
    }

    async fn run(&mut self, attached: AttachedMount) -> Option<Arc<BrokerError>> {
        // Boxed, as is the attach: the mount's task then holds only the
        // state it is in, not room for both.
        Box::pin(attached.run(self.stop.clone()))
            .await
            .err()
            .map(Arc::new)
    }

    fn report(&mut self, state: State, failure: Option<&Arc<BrokerError>>) {
        let spec = self.spec.clone();
        let tags = &spec.tags;
        match failure {
            Some(failure) => self.permanent = failure.is_permanent(),
            None if state == State::Up => self.permanent = false,
            None => {}
        }
        match &state {
            State::BackingOff { error, wait } => {
                spec.metrics.link_down();
                self.tell_down(error, *wait);
                let _ = spec.events.send(Event::MountDown {
                    tenant: tags.tenant.clone(),
                    mount: tags.mount.clone(),
                    error: error.clone(),
                });
            }
            State::Up => {
                spec.metrics.link_up(true);
                if let Some(lasted) = self.repeats.ended() {
                    tracing::info!("mount up again after {}", human(lasted));
                }
            }
            State::Attaching | State::Stopped => spec.metrics.link_up(false),
        }
        self.health
            .set_mount(&tags.tenant, &tags.mount, &state, self.permanent);
    }
}

impl SupervisedMount {
    /// Logs the mount going down: in full the first time, at `error` level
    /// when retrying cannot mend it, then a reminder at most once a minute
    /// while the same failure repeats.
    fn tell_down(&mut self, error: &str, wait: Duration) {
        let retry_in = human(wait);
        match (self.repeats.happened(error), self.permanent) {
            (Tell::First, true) => tracing::error!(
                "mount down: {error}. Retrying will not mend this until the config or the broker changes; wharf keeps retrying (next in {retry_in}) and reminds once a minute"
            ),
            (Tell::First, false) => {
                tracing::warn!("mount down: {error} (retrying in {retry_in})");
            }
            (Tell::Again { times, lasting }, permanent) => {
                let lasting = human(lasting);
                if permanent {
                    tracing::error!(
                        "mount still down for {lasting} ({times} more attempts): {error}"
                    );
                } else {
                    tracing::warn!(
                        "mount still down for {lasting} ({times} more attempts): {error}"
                    );
                }
            }
            (Tell::Quiet, _) => {
                tracing::debug!("mount down: {error} (retrying in {retry_in})");
            }
        }
    }
}
