//! One mount's receiver link: deliveries in, dispositions out.

use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::link::{ErrorRecovery, RecvError};
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::{self, AmqpError, SenderSettleMode};
use fe2o3_amqp::types::messaging::{Body, Modified, Source};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use fe2o3_amqp::{Delivery, Receiver};

use super::error::{AttachFailure, BrokerError};
use super::message::AmqpMessage;
use crate::config::Settle;
use crate::settlement::Disposition;

const MODIFIED_OUTCOME: &str = "amqp:modified:list";

/// What the link gave: a delivery, or one the host must settle without
/// running a handler.
pub enum Received {
    /// A delivery for the handler.
    Delivery(Box<Inbound>),
    /// A delivery that is not an AMQP message the host can read; it must be
    /// rejected with `amqp:decode-error`.
    Undecodable {
        /// What settling it needs.
        info: DeliveryInfo,
        /// What is wrong with it.
        reason: String,
        /// The message exactly as it arrived.
        payload: bytes::Bytes,
    },
    /// A delivery over the mount's `max_message_size`, already rejected by
    /// the link without being read.
    Oversized {
        /// Its size in bytes.
        size: u64,
        /// The limit.
        max_size: u64,
    },
}

/// A delivery taken off the link.
pub struct Inbound {
    /// What settling it needs.
    pub info: DeliveryInfo,
    /// The message, decoded.
    pub message: AmqpMessage,
    /// The message exactly as it arrived, where the mount may have to
    /// publish it so (to its dead-letter address).
    pub payload: Option<bytes::Bytes>,
    /// Its size as it arrived, in bytes.
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
    /// How deliveries are settled.
    pub settle: Settle,
    /// Link credit.
    pub credit: u32,
    /// Deliveries larger than this are rejected unread.
    pub max_message_size: u64,
    /// Keep each delivery's payload as it arrived, beside the decoded
    /// message.
    pub keep_payloads: bool,
}

/// A receiver attached to one address.
pub struct Subscription {
    receiver: Receiver,
    address: String,
    modified_supported: bool,
    keep_payloads: bool,
    /// At most once, the credit to renew: fe2o3 renews it as deliveries
    /// are settled, and settled deliveries never are.
    presettled_credit: Option<u32>,
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
        if let Some(capability) = options.capability {
            source = source.capabilities(vec![Symbol::from(capability)]);
        }
        let mut builder = Receiver::builder()
            .name(options.link_name)
            .source(source.build())
            .max_message_size(options.max_message_size)
            .decode_messages(false)
            .credit_mode(CreditMode::Auto(options.credit));
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
            modified_supported,
            keep_payloads: options.keep_payloads,
            presettled_credit: (options.settle == Settle::AtMostOnce).then_some(options.credit),
            since_renewed: 0,
        })
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
                Ok(delivery) => {
                    let delivery: Delivery<Body<Value>> = delivery;
                    let (info, message) = delivery.into_parts();
                    Received::Delivery(Box::new(Inbound {
                        info,
                        message: message.into(),
                        payload: None,
                        size: 0,
                    }))
                }
                Err(RecvError::MessageDecode(undecoded)) => {
                    match AmqpMessage::decode(&undecoded.payload) {
                        Ok(message) => Received::Delivery(Box::new(Inbound {
                            info: undecoded.info,
                            message,
                            size: undecoded.payload.len(),
                            payload: self.keep_payloads.then_some(undecoded.payload),
                        })),
                        Err(failure) => Received::Undecodable {
                            info: undecoded.info,
                            reason: failure.0,
                            payload: undecoded.payload,
                        },
                    }
                }
                Err(RecvError::MessageSizeExceeded(exceeded)) => Received::Oversized {
                    size: exceeded.size,
                    max_size: exceeded.max_size,
                },
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

    /// At most once, renews the link's credit once half of it is used, as
    /// fe2o3 does for unsettled deliveries when they are settled.
    async fn renew_presettled_credit(&mut self) -> Result<(), BrokerError> {
        let Some(credit) = self.presettled_credit else {
            return Ok(());
        };
        self.since_renewed += 1;
        if self.since_renewed < credit.div_ceil(2) {
            return Ok(());
        }
        self.since_renewed = 0;
        self.receiver
            .set_credit(credit)
            .await
            .map_err(|e| BrokerError::Receive {
                address: self.address.clone(),
                source: RecvError::LinkStateError(e.into()),
            })
    }

    /// Sends one disposition for unsettled deliveries: a run of
    /// consecutive delivery ids goes out as one frame, and the link's credit
    /// is renewed once for all of them.
    pub async fn settle_all(
        &self,
        infos: Vec<DeliveryInfo>,
        disposition: Disposition,
    ) -> Result<(), BrokerError> {
        let sent = match disposition {
            Disposition::Accepted => self.receiver.accept_all(infos).await,
            Disposition::Rejected => self.receiver.reject_all(infos, None).await,
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

    /// Rejects a delivery that is not a readable AMQP message, saying why.
    pub async fn reject_undecodable(
        &self,
        info: DeliveryInfo,
        reason: &str,
    ) -> Result<(), BrokerError> {
        let error = definitions::Error::new(AmqpError::DecodeError, Some(reason.to_owned()), None);
        self.receiver
            .reject(info, error)
            .await
            .map_err(|source| BrokerError::Settle {
                address: self.address.clone(),
                source,
            })
    }

    /// Detaches the link (the broker requeues whatever is still
    /// unsettled), waiting at most `timeout` for the broker's answer: some
    /// answer a closing detach without `closed=true`, a blocked one not at
    /// all.
    pub async fn close(self, timeout: std::time::Duration) {
        let detach = tokio::time::timeout(timeout, self.receiver.close()).await;
        if !matches!(detach, Ok(Ok(()))) {
            tracing::debug!(address = self.address, "receiver did not detach cleanly");
        }
    }
}
