//! Publishing copies and dead letters, and waiting for the broker to take
//! them.

use std::collections::HashMap;
use std::time::Duration;

use fe2o3_amqp::link::delivery::Sendable;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::{Outcome, Target};
use fe2o3_amqp::types::primitives::Symbol;
use fe2o3_amqp::{Sender, Session};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::BrokerError;
use super::connection::BrokerConnection;
use super::message::AmqpMessage;

/// How long the broker may take to settle a publish before it counts as
/// failed (and the original is kept), so a silent broker cannot stall a
/// delivery or a shutdown forever.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

struct Request {
    address: String,
    message: AmqpMessage,
    done: oneshot::Sender<Result<(), BrokerError>>,
}

/// A handle to publish messages to a fixed set of addresses. Clones share
/// the links.
#[derive(Clone)]
pub struct Publisher {
    requests: mpsc::Sender<Request>,
}

/// The task that owns the sender links.
pub struct PublisherTask {
    task: tokio::task::JoinHandle<()>,
    close: CancellationToken,
}

impl PublisherTask {
    /// Refuses new publishes, waits until every one already asked for has
    /// the broker's answer, then closes the links.
    pub async fn close(self) {
        self.close.cancel();
        let _ = self.task.await;
    }
}

impl Publisher {
    /// Attaches one sender per address (asking for the node kind its
    /// capability names, if any) on a session of its own.
    pub async fn open(
        connection: &mut BrokerConnection,
        link_prefix: &str,
        addresses: &[(&str, Option<&'static str>)],
    ) -> Result<(Publisher, PublisherTask), BrokerError> {
        let first = addresses.first().map(|(a, _)| *a).unwrap_or_default();
        let mut session =
            Session::begin(connection.handle())
                .await
                .map_err(|e| BrokerError::Attach {
                    address: first.to_owned(),
                    role: "sender",
                    reason: format!("cannot begin a session: {e}"),
                })?;
        let mut senders = HashMap::new();
        for &(address, capability) in addresses {
            if senders.contains_key(address) {
                continue;
            }
            let mut target = Target::builder().address(address);
            if let Some(capability) = capability {
                target = target.capabilities(vec![Symbol::from(capability)]);
            }
            let sender = Sender::builder()
                .name(format!("{link_prefix}/send/{address}"))
                .target(target.build())
                .attach(&mut session)
                .await
                .map_err(|e| BrokerError::Attach {
                    address: address.to_owned(),
                    role: "sender",
                    reason: e.to_string(),
                })?;
            senders.insert(address.to_owned(), sender);
        }
        let (requests, inbox) = mpsc::channel(256);
        let close = CancellationToken::new();
        let task = tokio::spawn(serve(session, senders, inbox, close.clone()));
        Ok((Publisher { requests }, PublisherTask { task, close }))
    }

    /// Publishes `message` to `address` and waits for the broker's
    /// `accepted`.
    pub async fn publish(&self, address: &str, message: AmqpMessage) -> Result<(), BrokerError> {
        let (done, answer) = oneshot::channel();
        let request = Request {
            address: address.to_owned(),
            message,
            done,
        };
        let gone = || BrokerError::Publish {
            address: address.to_owned(),
            reason: "the publisher has shut down".to_owned(),
        };
        self.requests.send(request).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn serve(
    mut session: SessionHandle<()>,
    mut senders: HashMap<String, Sender>,
    mut inbox: mpsc::Receiver<Request>,
    close: CancellationToken,
) {
    let mut waiting = tokio::task::JoinSet::new();
    loop {
        let request = tokio::select! {
            request = inbox.recv() => request,
            () = close.cancelled() => {
                // Take what was already queued, then stop.
                inbox.close();
                inbox.recv().await
            }
        };
        let Some(request) = request else { break };
        let Some(sender) = senders.get_mut(&request.address) else {
            let _ = request.done.send(Err(BrokerError::Publish {
                address: request.address,
                reason: "no sender link is attached to this address".to_owned(),
            }));
            continue;
        };
        // Pipeline: hand the transfer to the link now, wait for the broker's
        // answer beside the loop.
        let address = request.address;
        let sendable = Sendable::builder().message(request.message).build();
        match sender.send_batchable(sendable).await {
            Ok(outcome) => {
                let done = request.done;
                waiting.spawn(async move {
                    let result = match tokio::time::timeout(PUBLISH_TIMEOUT, outcome).await {
                        Ok(Ok(Outcome::Accepted(_))) => Ok(()),
                        Ok(Ok(other)) => Err(format!("the broker answered {other:?}")),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err(format!(
                            "no answer from the broker within {PUBLISH_TIMEOUT:?}"
                        )),
                    };
                    let _ = done
                        .send(result.map_err(|reason| BrokerError::Publish { address, reason }));
                });
            }
            Err(e) => {
                let _ = request.done.send(Err(BrokerError::Publish {
                    address,
                    reason: e.to_string(),
                }));
            }
        }
        while waiting.try_join_next().is_some() {}
    }
    while waiting.join_next().await.is_some() {}
    for (_, sender) in senders {
        let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, sender.close()).await;
    }
    let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, session.end()).await;
}
