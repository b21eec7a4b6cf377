//! Attaching a mount's links, and choosing from what the broker offers on
//! them how retries and delays are carried out.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::MountSpec;
use crate::broker::{
    AttachFailure, BrokerError, CLOSE_TIMEOUT, Offered, PooledSession, Publisher, PublisherTask,
    ReceiverOptions, SenderTarget, Subscription,
};
use crate::config::{DelayChoice, Node, RetryAfterOriginal, RetryChoice};
use crate::events::Event;
use crate::settlement::{DelayPath, Disposition, Policy, RetryPath};

/// Everything a mount's delivery tasks share while its links are up.
pub(crate) struct MountContext {
    pub(crate) spec: Arc<MountSpec>,
    pub(crate) policy: Policy,
    pub(crate) publisher: Publisher,
    /// Whether an at-most-once outcome that cannot act has been logged at
    /// warn level yet; later ones go to debug.
    pub(crate) unsupported_warned: AtomicBool,
}

/// A mount whose links are attached, ready to run.
pub(crate) struct AttachedMount {
    pub(super) context: Arc<MountContext>,
    pub(super) subscription: Subscription,
    pub(super) publisher_task: PublisherTask,
    /// Kept for the links' lifetime: dropping it ends the session.
    pub(super) session: PooledSession,
}

impl AttachedMount {
    /// Attaches the mount's receiver, and senders for its own address and
    /// its dead-letter address, all on `session`, within the broker's
    /// attach time-out.
    pub(crate) async fn attach(
        spec: Arc<MountSpec>,
        mut session: PooledSession,
    ) -> Result<AttachedMount, BrokerError> {
        let timeout = spec.broker.attach_timeout;
        let mount = &spec.config;
        let timed_out = || BrokerError::Attach {
            address: mount.address.clone(),
            role: "receiver",
            source: AttachFailure::TimedOut(timeout),
        };
        let link_name = format!(
            "wharf/{}/{}/{}",
            spec.tags.tenant, spec.tags.mount, spec.generation
        );
        let capability = mount.node.map(Node::capability);
        let options = ReceiverOptions {
            link_name: &link_name,
            address: &mount.address,
            capability,
            settle: mount.settle,
            credit: mount.credit,
            max_message_size: mount.max_message_size,
        };
        let subscription =
            tokio::time::timeout(timeout, Subscription::attach(&mut session.session, options))
                .await
                .map_err(|_| timed_out())??;
        // Copies go to the subscription's own node; a dead-letter address is
        // a queue whenever the mount says what its nodes are.
        let mut targets = vec![SenderTarget {
            address: &mount.address,
            capability,
        }];
        if let Some(dead_letter) = &mount.dead_letter {
            targets.push(SenderTarget {
                address: dead_letter,
                capability: mount.node.map(|_| Node::Queue.capability()),
            });
        }
        let attached = Publisher::attach(
            &mut session.session,
            &link_name,
            &targets,
            spec.broker.publish_timeout,
            CLOSE_TIMEOUT,
        );
        let (publisher, publisher_task, offered) =
            match tokio::time::timeout(timeout, attached).await {
                Ok(Ok(attached)) => attached,
                Ok(Err(e)) => {
                    subscription.close(CLOSE_TIMEOUT).await;
                    return Err(e);
                }
                Err(_) => {
                    subscription.close(CLOSE_TIMEOUT).await;
                    return Err(timed_out());
                }
            };
        // A broker may offer scheduling on the connection or on the link.
        let offered = Offered {
            delayed_delivery: offered.delayed_delivery || session.offers.delayed_delivery,
        };
        let policy = policy(&spec, subscription.modified_supported(), offered);
        tracing::info!(
            tenant = &*spec.tags.tenant,
            mount = &*spec.tags.mount,
            address = mount.address,
            broker = %session.endpoint,
            settle = %mount.settle,
            retry_path = ?policy.retry,
            delay_path = ?policy.delay,
            "mount attached"
        );
        let _ = spec.events.send(Event::MountReady {
            tenant: spec.tags.tenant.clone(),
            mount: spec.tags.mount.clone(),
            modified_supported: policy.modified_supported,
            retry: policy.retry,
            delay: policy.delay,
        });
        let context = MountContext {
            spec,
            policy,
            publisher,
            unsupported_warned: AtomicBool::new(false),
        };
        Ok(AttachedMount {
            context: Arc::new(context),
            subscription,
            publisher_task,
            session,
        })
    }
}

/// The settlement policy of a mount on links where the broker offered what
/// `modified_supported` and `offered` say; the mount's config overrides.
fn policy(spec: &MountSpec, modified_supported: bool, offered: Offered) -> Policy {
    let mount = &spec.config;
    let retry = match (mount.retry, modified_supported) {
        (_, false) => RetryPath::Copy,
        (Some(RetryChoice::Copy), true) => RetryPath::Copy,
        (Some(RetryChoice::Modified) | None, true) => RetryPath::Modified,
    };
    if mount.retry == Some(RetryChoice::Modified) && !modified_supported {
        tracing::warn!(
            tenant = &*spec.tags.tenant,
            mount = &*spec.tags.mount,
            "`retry = \"modified\"`, but the broker does not offer `modified` here: retries are copies"
        );
    }
    let delay = match (mount.delay, offered.delayed_delivery) {
        (Some(DelayChoice::Scheduled), offered) => {
            if !offered {
                tracing::warn!(
                    tenant = &*spec.tags.tenant,
                    mount = &*spec.tags.mount,
                    "`delay = \"scheduled\"`, but the broker does not offer DELAYED_DELIVERY: copies may arrive early"
                );
            }
            DelayPath::Scheduled
        }
        (Some(DelayChoice::Held), _) => DelayPath::Held,
        (None, true) => DelayPath::Scheduled,
        (None, false) => DelayPath::Held,
    };
    Policy {
        settle: mount.settle,
        max_attempts: mount.max_attempts,
        dead_letter: mount.dead_letter.is_some(),
        retry,
        modified_supported,
        delay,
        retry_after_original: match mount.retry_after_original {
            RetryAfterOriginal::Rejected => Disposition::Rejected,
            RetryAfterOriginal::Accepted => Disposition::Accepted,
        },
    }
}
