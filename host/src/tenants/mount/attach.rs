//! Attaching a mount's links, and choosing from what the broker offers on
//! them how retries and delays are carried out.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::context::{MountContext, Peer};
use super::{MountSpec, report};
use crate::broker::management::QueueInfo;
use crate::broker::{
    AttachFailure, BrokerError, BrokerPool, CLOSE_TIMEOUT, Offered, OutputsOn, PooledSession,
    Publisher, PublisherTask, ReceiverOptions, SenderTarget, Subscription, TransactionsOn,
};
use wharf_core::brokers::BrokerKind;
use wharf_core::brokers::QueueKind;
use wharf_core::config::{
    DelayChoice, Mount, Node, RetryChoice, RetryCopiesTo, SubscriptionKind, TopicSubscription,
};
use wharf_core::settlement::Policy;
use wharf_core::settlement::{LinkOffers, outputs_in_transactions, policy_for};

/// A mount's links, attached, before it is known how to use them.
pub(crate) struct Links {
    spec: Arc<MountSpec>,
    subscription: Subscription,
    publisher: Publisher,
    publisher_task: PublisherTask,
    session: PooledSession,
    offered: LinkOffers,
}

/// A mount whose links are attached, ready to run.
pub(crate) struct AttachedMount {
    pub(super) context: Arc<MountContext>,
    pub(super) subscription: Subscription,
    pub(super) publisher_task: PublisherTask,
    /// Kept for the links' lifetime: dropping it ends the session.
    pub(super) session: PooledSession,
}

/// The receiver's link name. On a durable subscription it is the
/// subscription's name, which the broker names its queue after. A shared
/// one's link names carry `|<attach>` (dropped by the broker, as for Qpid
/// JMS's), so a replaced mount attaches beside its predecessor on the same
/// connection.
fn receiver_name(spec: &MountSpec, link_name: &str) -> String {
    match &spec.config.subscription {
        Some(topic) if topic.kind == SubscriptionKind::DurableShared => {
            format!("{}|{}", topic.name, spec.generation)
        }
        Some(topic) if topic.kind == SubscriptionKind::Durable => topic.name.clone(),
        _ => link_name.to_owned(),
    }
}

/// Where the mount's own senders go: copies to its address (or to its
/// subscription's queue, `own_queue`), dead letters to its dead-letter
/// address, a queue whenever the mount says what its nodes are.
fn sender_targets<'a>(mount: &'a Mount, own_queue: Option<&'a str>) -> Vec<SenderTarget<'a>> {
    let mut targets = vec![match own_queue {
        Some(queue) => SenderTarget {
            address: queue,
            capability: None,
        },
        None => SenderTarget {
            address: &mount.address,
            capability: mount.node.map(Node::capability),
        },
    }];
    if let Some(dead_letter) = &mount.dead_letter {
        targets.push(SenderTarget {
            address: dead_letter,
            capability: mount.node.map(|_| Node::Queue.capability()),
        });
    }
    targets
}

impl Links {
    /// Attaches the mount's receiver, and senders for its own address and
    /// its dead-letter address, all on `session`, within the broker's
    /// attach time-out. Outputs go out on sessions of their own from
    /// `pool`.
    pub(crate) async fn attach(
        spec: Arc<MountSpec>,
        mut session: PooledSession,
        pool: BrokerPool,
    ) -> Result<Links, BrokerError> {
        let link_name = format!(
            "wharf/{}/{}/{}",
            spec.tags.tenant, spec.tags.mount, spec.generation
        );
        let subscription = attach_receiver(&spec, &mut session, &link_name).await?;
        let senders = attach_senders(&spec, &mut session, &subscription, pool, &link_name);
        let (publisher, publisher_task, offered) =
            match tokio::time::timeout(spec.broker.attach_timeout, senders).await {
                Ok(Ok(attached)) => attached,
                Ok(Err(e)) => {
                    subscription.close(CLOSE_TIMEOUT, false).await;
                    return Err(e);
                }
                Err(_) => {
                    subscription.close(CLOSE_TIMEOUT, false).await;
                    return Err(attach_timed_out(&spec));
                }
            };
        // A broker may offer scheduling on the connection or on the link.
        let offered = LinkOffers {
            modified_supported: subscription.modified_supported(),
            delayed_delivery: offered.delayed_delivery || session.offers.delayed_delivery,
        };
        Ok(Links {
            spec,
            subscription,
            publisher,
            publisher_task,
            session,
            offered,
        })
    }

    /// The mount, ready to run on these links, its retries and delays
    /// chosen from what the broker offered and what `queue` is.
    pub(crate) fn on_queue(self, queue: Option<QueueInfo>) -> AttachedMount {
        let Links {
            spec,
            subscription,
            publisher,
            publisher_task,
            session,
            offered,
        } = self;
        let kind = session.offers.kind();
        let policy = policy(&spec, kind, offered, queue.as_ref());
        warn_of_delivery_limit(&spec, queue.as_ref());
        let context = MountContext {
            spec,
            policy,
            duplicate_ids: kind.drops_duplicate_ids() && publisher.transactions().is_none(),
            publisher,
            unsupported_warned: AtomicBool::new(false),
            peer: Peer {
                system: kind.messaging_system(),
                address: session.endpoint.host.clone(),
                port: session.endpoint.port,
            },
            kind,
        };
        report::attached(&context, policy, &session, queue);
        AttachedMount {
            context: Arc::new(context),
            subscription,
            publisher_task,
            session,
        }
    }
}

/// The queue Artemis keeps a durable subscription in, as `address::queue`
/// reaches it: shared subscriptions of no one container get `:global`.
pub(crate) fn subscription_queue(topic: &TopicSubscription) -> String {
    match topic.kind {
        SubscriptionKind::DurableShared => format!("{}:global", topic.name),
        SubscriptionKind::Durable | SubscriptionKind::Volatile => topic.name.clone(),
    }
}

/// The settlement policy of a mount on links where the broker offered
/// `links`, on `queue` where the broker said what it is, with a warning
/// where the config asks for what the broker does not offer.
fn policy(
    spec: &MountSpec,
    kind: BrokerKind,
    links: LinkOffers,
    queue: Option<&QueueInfo>,
) -> Policy {
    let mount = &spec.config;
    if kind.requeues_rejected() && mount.dead_letter.is_none() {
        tracing::warn!(
            "the broker puts `rejected` deliveries back on the queue: without a `dead_letter` address, dropped and exhausted messages are accepted and gone"
        );
    }
    if mount.retry == Some(RetryChoice::Modified) && !links.modified_supported {
        tracing::warn!(
            "`retry = \"modified\"`, but the broker does not offer `modified` here: retries are copies"
        );
    }
    if mount.delay == Some(DelayChoice::Scheduled) && !links.delayed_delivery {
        tracing::warn!(
            "`delay = \"scheduled\"`, but the broker does not offer DELAYED_DELIVERY: copies may arrive early"
        );
    }
    policy_for(mount, kind, links, queue.map(|q| &q.kind))
}

/// A quorum queue dead-letters on its own once a message was delivered
/// `delivery-limit` times: a higher `max_attempts` is never reached.
fn warn_of_delivery_limit(spec: &MountSpec, queue: Option<&QueueInfo>) {
    let Some(QueueInfo {
        name,
        kind: QueueKind::Quorum { delivery_limit },
        ..
    }) = queue
    else {
        return;
    };
    let limit = delivery_limit.unwrap_or(QUORUM_DEFAULT_DELIVERY_LIMIT);
    if let Some(max_attempts) = spec.config.max_attempts
        && u64::from(max_attempts) > limit
    {
        tracing::warn!(
            queue = name,
            max_attempts,
            delivery_limit = limit,
            "the quorum queue's delivery-limit dead-letters a message before max_attempts is reached"
        );
    }
}

/// RabbitMQ's default `delivery-limit` of quorum queues since 4.0 (a
/// policy may set another, which the management node does not show).
const QUORUM_DEFAULT_DELIVERY_LIMIT: u64 = 20;

/// The receiver did not attach within the broker's attach time-out.
fn attach_timed_out(spec: &MountSpec) -> BrokerError {
    BrokerError::Attach {
        address: spec.config.address.clone(),
        role: "receiver",
        source: AttachFailure::TimedOut(spec.broker.attach_timeout),
    }
}

/// Attaches the mount's receiver on `session`, within the attach time-out.
async fn attach_receiver(
    spec: &MountSpec,
    session: &mut PooledSession,
    link_name: &str,
) -> Result<Subscription, BrokerError> {
    let mount = &spec.config;
    let topic = mount.subscription.as_ref();
    if topic.is_some() && session.offers.is_rabbitmq() {
        return Err(BrokerError::Attach {
            address: mount.address.clone(),
            role: "receiver",
            source: AttachFailure::Unsupported(crate::broker::RABBITMQ_HAS_NO_TOPICS),
        });
    }
    let receiver_name = receiver_name(spec, link_name);
    let options = ReceiverOptions {
        link_name: &receiver_name,
        address: &mount.address,
        capability: mount.node.map(Node::capability),
        subscription: topic.map(|topic| topic.kind),
        settle: mount.settle,
        credit: spec.credit(),
        // Paused, the link attaches without credit: nothing arrives to be
        // released.
        paused: *spec.paused.borrow(),
        max_message_size: mount.max_message_size,
    };
    tokio::time::timeout(
        spec.broker.attach_timeout,
        Subscription::attach(&mut session.session, options),
    )
    .await
    .map_err(|_| attach_timed_out(spec))?
}

/// Attaches the senders for copies and dead letters on `session`, and
/// readies outputs (in transactions on the receiver's connection where
/// the mount asks for them).
async fn attach_senders(
    spec: &MountSpec,
    session: &mut PooledSession,
    subscription: &Subscription,
    pool: BrokerPool,
    link_name: &str,
) -> Result<(Publisher, PublisherTask, Offered), BrokerError> {
    let mount = &spec.config;
    // Copies go to the subscription's own node (on a topic, to every
    // subscription, unless the mount sends them to its own subscription's
    // queue); a dead-letter address is a queue whenever the mount says
    // what its nodes are.
    let own_queue = mount
        .subscription
        .as_ref()
        .filter(|topic| topic.retry_copies_to == RetryCopiesTo::Subscription)
        .map(|topic| format!("{}::{}", mount.address, subscription_queue(topic)));
    let targets = sender_targets(mount, own_queue.as_deref());
    // Outputs, like dead letters, go to queues whenever the mount says
    // what its nodes are.
    let output_capability = mount.node.map(|_| Node::Queue.capability());
    let in_transactions = outputs_in_transactions(mount, session.offers.kind());
    let transactions = in_transactions.then(|| TransactionsOn {
        pool: pool.clone(),
        connection: session.connection,
        disposer: subscription.disposer(),
        capability: output_capability,
        link_prefix: link_name,
        publish_timeout: spec.broker.publish_timeout,
    });
    let outputs = OutputsOn {
        pool,
        capability: output_capability,
    };
    Publisher::attach(
        &mut session.session,
        link_name,
        &targets,
        outputs,
        transactions,
        spec.broker.publish_timeout,
        CLOSE_TIMEOUT,
    )
    .await
}
