//! `wharf send`: publish a few messages by hand.

use fe2o3_amqp::types::messaging::{ApplicationProperties, Header, Message, Outcome};
use fe2o3_amqp::{Sender, Session};

use super::{BrokerConnection, BrokerError};

/// Publishes one durable message per body to `address` (each with the given
/// string application properties) and waits for the broker to accept each.
pub async fn send(
    url: &str,
    address: &str,
    properties: &[(String, String)],
    bodies: &[String],
) -> Result<(), BrokerError> {
    let mut connection =
        BrokerConnection::open(url, &format!("wharf-send-{}", std::process::id())).await?;
    let publish_error = |reason: String| BrokerError::Publish {
        address: address.to_owned(),
        reason,
    };
    let mut session = Session::begin(connection.handle())
        .await
        .map_err(|e| publish_error(e.to_string()))?;
    let mut sender = Sender::attach(&mut session, "wharf-send", address)
        .await
        .map_err(|e| publish_error(e.to_string()))?;
    for (n, body) in bodies.iter().enumerate() {
        let mut app = ApplicationProperties::builder();
        for (key, value) in properties {
            app = app.insert(key.as_str(), value.as_str());
        }
        let message = Message::builder()
            .header(Header {
                durable: true,
                ..Header::default()
            })
            .properties(
                fe2o3_amqp::types::messaging::Properties::builder()
                    .message_id(format!("wharf-send-{}-{n}", std::process::id()))
                    .build(),
            )
            .application_properties(app.build())
            .value(body.as_str())
            .build();
        match sender.send(message).await {
            Ok(Outcome::Accepted(_)) => println!("sent {body:?} to {address}"),
            Ok(other) => return Err(publish_error(format!("the broker answered {other:?}"))),
            Err(e) => return Err(publish_error(e.to_string())),
        }
    }
    let _ = sender.close().await;
    let _ = session.end().await;
    connection.close().await;
    Ok(())
}
