//! One mount's receiver link: deliveries in, dispositions out.

use fe2o3_amqp::Receiver;
use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::link::{ErrorRecovery, RecvError};
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::{self, AmqpError, LinkError, SenderSettleMode};
use fe2o3_amqp::types::messaging::{
    Body, Modified, Source, TerminusDurability, TerminusExpiryPolicy,
};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use wharf_core::text;

use super::error::{AttachFailure, BrokerError};
use wharf_core::config::{Settle, SubscriptionKind};
use wharf_core::message::AmqpMessage;
use wharf_core::settlement::{Disposition, Unhandled};

const MODIFIED_OUTCOME: &str = "amqp:modified:list";

/// The error a `rejected` of a delivery no handler read carries. The
/// description reaches the broker in a frame of its own: cut to a length
/// any broker takes.
fn rejection(unhandled: Unhandled, reason: &str) -> definitions::Error {
    let condition: definitions::ErrorCondition = match unhandled {
        Unhandled::Unreadable => AmqpError::DecodeError.into(),
        Unhandled::Oversized => LinkError::MessageSizeExceeded.into(),
    };
    let description = text::bounded(reason.to_owned(), text::DESCRIPTION_BYTES);
    definitions::Error::new(condition, Some(description), None)
}

/// What the link gave: a delivery, or one the host must settle without
/// running a handler.
pub enum Received {
    /// A delivery for the handler.
    Delivery(Box<Inbound>),
    /// A delivery no handler can see.
    Unhandled(Unread),
}

/// A delivery the host settles without running a handler, as the planner
/// says ([`wharf_core::settlement::plan_unhandled`]).
pub struct Unread {
    /// What is wrong with it.
    pub unhandled: Unhandled,
    /// What settling it needs; none when it came settled.
    pub info: Option<DeliveryInfo>,
    /// Why, in words: for the log, the dead letter's annotation and the
    /// `rejected`'s description.
    pub reason: String,
    /// The message exactly as it arrived; empty when it was discarded
    /// unread.
    pub payload: bytes::Bytes,
}

/// A delivery taken off the link.
pub struct Inbound {
    /// What settling it needs.
    pub info: DeliveryInfo,
    /// The message, decoded.
    pub message: AmqpMessage,
    /// The message exactly as it arrived: dead letters are published so,
    /// and copies are made from it.
    pub payload: bytes::Bytes,
    /// The memory it takes in bytes: as it arrived plus about as much as
    /// its decoded values take, which for many small values is many times
    /// its size on the wire.
    pub size: usize,
}

/// How a receiver is attached.
#[derive(Debug, Clone, Copy)]
pub struct ReceiverOptions<'a> {
    /// The link's name.
    pub link_name: &'a str,
    /// The address to consume from.
    pub address: &'a str,
    /// The terminus capability naming the kind of node, if any.
    pub capability: Option<&'static str>,
    /// On a topic, the kind of subscription; the link's name is the
    /// subscription's.
    pub subscription: Option<SubscriptionKind>,
    /// How deliveries are settled.
    pub settle: Settle,
    /// Link credit.
    pub credit: u32,
    /// Attach without credit: the mount is paused.
    pub paused: bool,
    /// Deliveries larger than this are rejected unread.
    pub max_message_size: u64,
}

/// A receiver attached to one address.
pub struct Subscription {
    receiver: Receiver,
    address: String,
    /// A durable subscription outlives the link unless it is ended.
    durable: bool,
    modified_supported: bool,
    /// The credit the link is given while it runs.
    credit: u32,
    /// It was attached without credit (the mount was paused then).
    attached_without_credit: bool,
    /// Deliveries arrive settled (at most once).
    presettled: bool,
    /// At most once, the host renews the credit itself: fe2o3 renews it as
    /// deliveries are settled, and settled deliveries never are. Off while
    /// paused and once stopping.
    renews_presettled: bool,
    /// Deliveries received since the credit was last renewed.
    since_renewed: u32,
}

impl Subscription {
    /// Attaches a receiver on `session`. At-most-once asks the broker to
    /// send every delivery settled.
    pub async fn attach(
        session: &mut SessionHandle<()>,
        options: ReceiverOptions<'_>,
    ) -> Result<Subscription, BrokerError> {
        let mut source = Source::builder().address(options.address);
        let mut capabilities: Vec<Symbol> =
            options.capability.map(Symbol::from).into_iter().collect();
        let durable = matches!(
            options.subscription,
            Some(SubscriptionKind::Durable | SubscriptionKind::DurableShared)
        );
        if durable {
            // The JMS mapping's durable subscription: kept while detached,
            // named by the link, the same for every container (`global`),
            // and with `shared` consumed by every replica's link at once.
            source = source
                .durable(TerminusDurability::UnsettledState)
                .expiry_policy(TerminusExpiryPolicy::Never);
            if options.subscription == Some(SubscriptionKind::DurableShared) {
                capabilities.push(Symbol::from("shared"));
            }
            capabilities.push(Symbol::from("global"));
        }
        if !capabilities.is_empty() {
            source = source.capabilities(capabilities);
        }
        let mut builder = Receiver::builder()
            .name(options.link_name)
            .source(source.build())
            .max_message_size(options.max_message_size)
            .decode_messages(false)
            .credit_mode(CreditMode::Auto(if options.paused {
                0
            } else {
                options.credit
            }));
        if options.settle == Settle::AtMostOnce {
            builder = builder.sender_settle_mode(SenderSettleMode::Settled);
        }
        let receiver = builder
            .attach(session)
            .await
            .map_err(|e| BrokerError::Attach {
                address: options.address.to_owned(),
                role: "receiver",
                source: AttachFailure::Receiver(e),
            })?;
        // After attach the source is the broker's: its `outcomes` say
        // whether `modified` may be sent. No list means no restriction.
        let modified_supported = receiver
            .source()
            .as_ref()
            .and_then(|s| s.outcomes.as_ref())
            .is_none_or(|outcomes| outcomes.0.iter().any(|o| o.0 == MODIFIED_OUTCOME));
        Ok(Subscription {
            receiver,
            address: options.address.to_owned(),
            durable,
            modified_supported,
            credit: options.credit,
            attached_without_credit: options.paused,
            presettled: options.settle == Settle::AtMostOnce,
            renews_presettled: options.settle == Settle::AtMostOnce && !options.paused,
            since_renewed: 0,
        })
    }

    /// Whether the link was attached without credit: what its receive
    /// loop starts from, whatever the pause switch says by then.
    pub fn attached_without_credit(&self) -> bool {
        self.attached_without_credit
    }

    /// Whether the broker takes `modified` on this link.
    pub fn modified_supported(&self) -> bool {
        self.modified_supported
    }

    /// The next delivery. Cancel-safe. An error means the link is gone.
    pub async fn recv(&mut self) -> Result<Received, BrokerError> {
        loop {
            // The link hands every payload over undecoded: wharf checks it
            // against its limits before decoding any of it.
            let received = match self.receiver.recv::<Body<Value>>().await {
                // The link is attached with `decode_messages(false)`: it
                // hands over no decoded message.
                Ok(delivery) => {
                    let (info, _) = delivery.into_parts();
                    Received::Unhandled(Unread {
                        unhandled: Unhandled::Unreadable,
                        info: Some(info),
                        reason: "the link decoded it unasked".to_owned(),
                        payload: bytes::Bytes::new(),
                    })
                }
                Err(RecvError::MessageDecode(undecoded)) => {
                    match AmqpMessage::decode_measured(&undecoded.payload) {
                        Ok((message, decoded)) => Received::Delivery(Box::new(Inbound {
                            info: undecoded.info,
                            message,
                            size: undecoded
                                .payload
                                .len()
                                .saturating_add(usize::try_from(decoded).unwrap_or(usize::MAX)),
                            payload: undecoded.payload,
                        })),
                        Err(failure) => Received::Unhandled(Unread {
                            unhandled: Unhandled::Unreadable,
                            info: Some(undecoded.info),
                            reason: format!("not a readable AMQP message: {failure}"),
                            payload: undecoded.payload,
                        }),
                    }
                }
                Err(RecvError::MessageSizeExceeded(exceeded, info)) => {
                    Received::Unhandled(Unread {
                        unhandled: Unhandled::Oversized,
                        info,
                        reason: format!(
                            "{} bytes is over the mount's max_message_size of {}",
                            exceeded.size, exceeded.max_size
                        ),
                        payload: bytes::Bytes::new(),
                    })
                }
                Err(e) if e.recovery() == ErrorRecovery::UseLink => {
                    tracing::warn!(address = self.address, error = %e, "receiver: a transfer was refused; the link stays");
                    continue;
                }
                Err(source) => {
                    return Err(BrokerError::Receive {
                        address: self.address.clone(),
                        source,
                    });
                }
            };
            self.renew_presettled_credit().await?;
            return Ok(received);
        }
    }

    /// At most once, stops renewing the link's credit: what the broker
    /// already sent (at most the credit it was last given) still arrives,
    /// and then the link goes quiet. Taken at a stop, so that a backlog
    /// cannot keep it receiving.
    pub fn stop_renewing_credit(&mut self) {
        self.renews_presettled = false;
    }

    /// Withdraws the link's credit (a pause): the broker sends nothing
    /// more, and settling deliveries no longer renews it. What the broker
    /// sent before it saw the withdrawal still arrives.
    pub async fn withdraw_credit(&mut self) -> Result<(), BrokerError> {
        self.renews_presettled = false;
        self.set_credit(0).await
    }

    /// Gives the link its credit again (a resume), or `only_one`
    /// delivery's worth (a circuit breaker trying one).
    pub async fn restore_credit(&mut self, only_one: bool) -> Result<(), BrokerError> {
        self.renews_presettled = self.presettled && !only_one;
        self.since_renewed = 0;
        self.set_credit(if only_one { 1 } else { self.credit })
            .await
    }

    async fn set_credit(&mut self, credit: u32) -> Result<(), BrokerError> {
        self.receiver
            .set_credit(credit)
            .await
            .map_err(|e| BrokerError::Receive {
                address: self.address.clone(),
                source: RecvError::LinkStateError(e.into()),
            })
    }

    /// At most once, renews the link's credit once half of it is used, as
    /// fe2o3 does for unsettled deliveries when they are settled.
    async fn renew_presettled_credit(&mut self) -> Result<(), BrokerError> {
        if !self.renews_presettled {
            return Ok(());
        }
        self.since_renewed += 1;
        if self.since_renewed < self.credit.div_ceil(2) {
            return Ok(());
        }
        self.since_renewed = 0;
        self.set_credit(self.credit).await
    }

    /// Sends one disposition for unsettled deliveries: a run of
    /// consecutive delivery ids goes out as one frame, and the link's credit
    /// is renewed once for all of them. A `rejected` for deliveries read by
    /// no handler says why (`unread`).
    pub async fn settle_all(
        &self,
        infos: Vec<DeliveryInfo>,
        disposition: Disposition,
        unread: Option<(Unhandled, &str)>,
    ) -> Result<(), BrokerError> {
        let sent = match disposition {
            Disposition::Accepted => self.receiver.accept_all(infos).await,
            Disposition::Rejected => {
                let error = unread.map(|(unhandled, reason)| rejection(unhandled, reason));
                self.receiver.reject_all(infos, error).await
            }
            Disposition::Released => self.receiver.release_all(infos).await,
            Disposition::Modified => {
                let modified = Modified {
                    delivery_failed: Some(true),
                    undeliverable_here: Some(false),
                    message_annotations: None,
                };
                self.receiver.modify_all(infos, modified).await
            }
        };
        sent.map_err(|source| BrokerError::Settle {
            address: self.address.clone(),
            source,
        })
    }

    /// Settles this receiver's deliveries from another task.
    pub fn disposer(&self) -> fe2o3_amqp::ReceiverDisposer {
        self.receiver.disposer()
    }

    /// Detaches the link (the broker requeues whatever is still
    /// unsettled), waiting at most `timeout` for the broker's answer: some
    /// answer a closing detach without `closed=true`, a blocked one not at
    /// all. A durable subscription is left for the next link unless `end`
    /// says to end it.
    pub async fn close(self, timeout: std::time::Duration, end: bool) {
        let detached = if self.durable && !end {
            tokio::time::timeout(timeout, self.receiver.detach())
                .await
                .map(|detached| detached.map(drop).map_err(drop))
        } else {
            tokio::time::timeout(timeout, self.receiver.close())
                .await
                .map(|closed| closed.map_err(drop))
        };
        if !matches!(detached, Ok(Ok(()))) {
            tracing::debug!(address = self.address, "receiver did not detach cleanly");
        }
    }
}

/// Ends the durable topic subscription `name` on `address`: attaches to it
/// as its mounts do and detaches with `closed = true`, which has the broker
/// delete it once no other link consumes from it. Messages it held are
/// gone with it.
pub async fn end_subscription(
    endpoint: &wharf_core::endpoint::Endpoint,
    connect: &super::ConnectOptions,
    address: &str,
    name: &str,
    kind: SubscriptionKind,
    timeout: std::time::Duration,
) -> Result<(), BrokerError> {
    let mut connection = super::BrokerConnection::open(endpoint, connect).await?;
    let mut session = connection.begin_session().await?;
    let link_name = match kind {
        SubscriptionKind::DurableShared => format!("{name}|unsubscribe"),
        SubscriptionKind::Durable | SubscriptionKind::Volatile => name.to_owned(),
    };
    let options = ReceiverOptions {
        link_name: &link_name,
        address,
        capability: Some("topic"),
        subscription: Some(kind),
        settle: Settle::AtLeastOnce,
        credit: 1,
        paused: false,
        max_message_size: 0,
    };
    let attached = tokio::time::timeout(timeout, Subscription::attach(&mut session, options))
        .await
        .map_err(|_| BrokerError::Attach {
            address: address.to_owned(),
            role: "receiver",
            source: AttachFailure::TimedOut(timeout),
        });
    if let Ok(Ok(subscription)) = attached {
        subscription.close(timeout, true).await;
        let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, session.end()).await;
        connection.close(super::CLOSE_TIMEOUT).await;
        return Ok(());
    }
    connection.close(super::CLOSE_TIMEOUT).await;
    attached?.map(drop)
}

/// One mount's address as [`probe`] tries it.
pub struct ProbeTarget<'a> {
    /// The address the mount consumes from.
    pub address: &'a str,
    /// The terminus capability of the mount's node, if it names one.
    pub capability: Option<&'static str>,
    /// The mount consumes a topic.
    pub topic: bool,
}

/// Connects as a host would, then attaches a receiver without credit and a
/// sender to each target and detaches them again: nothing is consumed or
/// sent, and a topic gets a volatile subscription, not the mount's durable
/// one. The connection's error when it cannot open, else what the broker
/// offered and each attach's result (what its links offered, or the error
/// in words), in order.
pub async fn probe(
    endpoint: &wharf_core::endpoint::Endpoint,
    connect: &super::ConnectOptions,
    targets: &[ProbeTarget<'_>],
    timeout: std::time::Duration,
) -> Result<
    (
        super::BrokerOffers,
        Vec<Result<wharf_core::settlement::LinkOffers, String>>,
    ),
    BrokerError,
> {
    let mut connection = super::BrokerConnection::open(endpoint, connect).await?;
    let offers = connection.offers().clone();
    let mut results = Vec::with_capacity(targets.len());
    let mut session = None;
    for (i, target) in targets.iter().enumerate() {
        if target.topic && offers.is_rabbitmq() {
            results.push(Err(AttachFailure::Unsupported(
                super::error::RABBITMQ_HAS_NO_TOPICS,
            )
            .to_string()));
            continue;
        }
        // A refused attach may end its session on some brokers: each
        // failure gets the next target a new one.
        let begun = match session.take() {
            Some(session) => Ok(session),
            None => connection.begin_session().await,
        };
        let mut begun = match begun {
            Ok(session) => session,
            Err(e) => {
                results.push(Err(e.to_string()));
                continue;
            }
        };
        let link_name = format!("{}-probe-{i}", connect.container_id);
        let options = ReceiverOptions {
            link_name: &link_name,
            address: target.address,
            capability: if target.topic {
                Some("topic")
            } else {
                target.capability
            },
            subscription: None,
            settle: Settle::AtLeastOnce,
            credit: 0,
            paused: false,
            max_message_size: 0,
        };
        match tokio::time::timeout(timeout, Subscription::attach(&mut begun, options)).await {
            Ok(Ok(subscription)) => {
                let modified_supported = subscription.modified_supported();
                subscription.close(timeout, false).await;
                // Scheduling may be offered on a sender link alone.
                let sender = super::SenderTarget {
                    address: target.address,
                    capability: target.capability,
                };
                let attached = super::outputs::attach_sender(&mut begun, &link_name, sender);
                let delayed_delivery = match tokio::time::timeout(timeout, attached).await {
                    Ok(Ok(sender)) => {
                        let offered = super::publisher::offers_delayed_delivery(&sender);
                        let _ = tokio::time::timeout(timeout, sender.close()).await;
                        offered
                    }
                    _ => false,
                };
                results.push(Ok(wharf_core::settlement::LinkOffers {
                    modified_supported,
                    delayed_delivery: delayed_delivery || offers.delayed_delivery,
                }));
                session = Some(begun);
            }
            Ok(Err(e)) => results.push(Err(e.to_string())),
            Err(_) => results.push(Err(format!("no answer within {timeout:?}"))),
        }
    }
    if let Some(mut session) = session {
        let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, session.end()).await;
    }
    connection.close(super::CLOSE_TIMEOUT).await;
    Ok((offers, results))
}
