//! One mount's receiver link: deliveries in, dispositions out.

use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::SenderSettleMode;
use fe2o3_amqp::types::messaging::{Body, Modified, Source};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use fe2o3_amqp::{Delivery, Receiver, Session};

use super::BrokerError;
use super::connection::BrokerConnection;
use super::message::AmqpMessage;
use crate::config::Settle;
use crate::settlement::Disposition;

const MODIFIED_OUTCOME: &str = "amqp:modified:list";

/// A delivery taken off the link.
pub struct Inbound {
    /// What settling it needs.
    pub info: DeliveryInfo,
    /// The message, exactly as it arrived.
    pub message: AmqpMessage,
}

/// A receiver attached to one address on a session of its own.
pub struct Subscription {
    receiver: Receiver,
    session: SessionHandle<()>,
    address: String,
    modified_supported: bool,
}

impl Subscription {
    /// Attaches a receiver to `address`, asking for the node kind
    /// `capability` names if any. At-most-once asks the broker to send every
    /// delivery settled.
    pub async fn attach(
        connection: &mut BrokerConnection,
        link_name: &str,
        address: &str,
        capability: Option<&'static str>,
        settle: Settle,
        credit: u32,
    ) -> Result<Subscription, BrokerError> {
        let attach_error = |reason: String| BrokerError::Attach {
            address: address.to_owned(),
            role: "receiver",
            reason,
        };
        let mut session = Session::begin(connection.handle())
            .await
            .map_err(|e| attach_error(format!("cannot begin a session: {e}")))?;
        let mut source = Source::builder().address(address);
        if let Some(capability) = capability {
            source = source.capabilities(vec![Symbol::from(capability)]);
        }
        let mut builder = Receiver::builder()
            .name(link_name)
            .source(source.build())
            .credit_mode(CreditMode::Auto(credit));
        if settle == Settle::AtMostOnce {
            builder = builder.sender_settle_mode(SenderSettleMode::Settled);
        }
        let receiver = builder
            .attach(&mut session)
            .await
            .map_err(|e| attach_error(e.to_string()))?;
        // After attach the source is the broker's: its `outcomes` say
        // whether `modified` may be sent. No list means no restriction.
        let modified_supported = receiver
            .source()
            .as_ref()
            .and_then(|s| s.outcomes.as_ref())
            .is_none_or(|outcomes| outcomes.0.iter().any(|o| o.0 == MODIFIED_OUTCOME));
        Ok(Subscription {
            receiver,
            session,
            address: address.to_owned(),
            modified_supported,
        })
    }

    /// Whether the broker takes `modified` on this link.
    pub fn modified_supported(&self) -> bool {
        self.modified_supported
    }

    /// The next delivery. Cancel-safe.
    pub async fn recv(&mut self) -> Result<Inbound, BrokerError> {
        let delivery: Delivery<Body<Value>> =
            self.receiver.recv().await.map_err(|e| self.link_error(e))?;
        let (info, message) = delivery.into_parts();
        Ok(Inbound { info, message })
    }

    /// Sends a disposition for an unsettled delivery.
    pub async fn settle(
        &self,
        info: DeliveryInfo,
        disposition: Disposition,
    ) -> Result<(), BrokerError> {
        let sent = match disposition {
            Disposition::Accepted => self.receiver.accept(info).await,
            Disposition::Rejected => self.receiver.reject(info, None).await,
            Disposition::Released => self.receiver.release(info).await,
            Disposition::Modified => {
                let modified = Modified {
                    delivery_failed: Some(true),
                    undeliverable_here: Some(false),
                    message_annotations: None,
                };
                self.receiver.modify(info, modified).await
            }
        };
        sent.map_err(|e| self.link_error(e))
    }

    /// Detaches the link (the broker requeues whatever is still unsettled)
    /// and ends the session.
    pub async fn close(self) {
        let Subscription {
            receiver,
            mut session,
            address,
            ..
        } = self;
        // Some brokers answer a closing detach without `closed=true`; do not
        // wait on it forever.
        let detach = tokio::time::timeout(super::CLOSE_TIMEOUT, receiver.close()).await;
        if !matches!(detach, Ok(Ok(()))) {
            tracing::debug!(address, "receiver did not detach cleanly");
        }
        let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, session.end()).await;
    }

    fn link_error(&self, e: impl std::fmt::Display) -> BrokerError {
        BrokerError::Link {
            address: self.address.clone(),
            reason: e.to_string(),
        }
    }
}
