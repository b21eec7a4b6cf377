//! `wharf send`: publish a few messages by hand.

use std::time::Duration;

use fe2o3_amqp::Sender;
use fe2o3_amqp::types::messaging::{ApplicationProperties, Header, Message, Outcome, Properties};

use super::error::{AttachFailure, PublishFailure};
use super::{BrokerConnection, BrokerError, ConnectOptions, Endpoint};

/// Where and how `wharf send` publishes.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// The broker.
    pub endpoint: Endpoint,
    /// How to connect and log in to it.
    pub connect: ConnectOptions,
    /// The address to publish to.
    pub address: String,
    /// String application properties every message carries.
    pub properties: Vec<(String, String)>,
    /// How long each publish may take.
    pub timeout: Duration,
}

/// Publishes one durable message per body and waits for the broker to
/// accept each.
pub async fn send(options: &SendOptions, bodies: &[String]) -> Result<(), BrokerError> {
    let mut connection = BrokerConnection::open(&options.endpoint, &options.connect).await?;
    let address = options.address.as_str();
    let publish_error = |source| BrokerError::Publish {
        address: address.to_owned(),
        source,
    };
    let mut session = connection.begin_session().await?;
    let mut sender = Sender::attach(&mut session, "wharf-send", address)
        .await
        .map_err(|e| BrokerError::Attach {
            address: address.to_owned(),
            role: "sender",
            source: AttachFailure::Sender(e),
        })?;
    for (n, body) in bodies.iter().enumerate() {
        let mut app = ApplicationProperties::builder();
        for (key, value) in &options.properties {
            app = app.insert(key.as_str(), value.as_str());
        }
        let message = Message::builder()
            .header(Header {
                durable: true,
                ..Header::default()
            })
            .properties(
                Properties::builder()
                    .message_id(format!("wharf-send-{}-{n}", std::process::id()))
                    .build(),
            )
            .application_properties(app.build())
            .value(body.as_str())
            .build();
        match tokio::time::timeout(options.timeout, sender.send(message)).await {
            Ok(Ok(Outcome::Accepted(_))) => println!("sent {body:?} to {address}"),
            Ok(Ok(other)) => {
                return Err(publish_error(PublishFailure::Refused(format!("{other:?}"))));
            }
            Ok(Err(e)) => return Err(publish_error(PublishFailure::Send(e))),
            Err(_) => return Err(publish_error(PublishFailure::TimedOut(options.timeout))),
        }
    }
    let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, sender.close()).await;
    let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, session.end()).await;
    connection.close(super::CLOSE_TIMEOUT).await;
    Ok(())
}
