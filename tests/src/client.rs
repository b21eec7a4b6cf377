//! A plain AMQP client for tests: publish crafted messages, watch addresses,
//! ask the broker what its queues hold.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context as _, bail};
use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::RecvError;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Header, Message, MessageId, Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use wharf_core::endpoint::Endpoint;
use wharf_core::message::AmqpMessage;
use wharf_core::settlement::RETRY_COUNT_PROPERTY;

use crate::{DEADLINE, unique};

/// A test message: id, body, and what the fixture handler should do.
pub struct TestMessage {
    id: String,
    body: String,
    header: Option<u32>,
    properties: Vec<(String, SimpleValue)>,
    reply_to: Option<String>,
    correlation_id: Option<String>,
    group: Option<(String, u32)>,
}

impl TestMessage {
    /// A message with this id and body.
    pub fn new(id: &str, body: &str) -> TestMessage {
        TestMessage {
            id: id.to_owned(),
            body: body.to_owned(),
            header: None,
            properties: Vec::new(),
            reply_to: None,
            correlation_id: None,
            group: None,
        }
    }

    /// Sets `group-id` and `group-sequence`.
    pub fn group(mut self, id: &str, sequence: u32) -> TestMessage {
        self.group = Some((id.to_owned(), sequence));
        self
    }

    /// Sets `reply-to`.
    pub fn reply_to(mut self, address: &str) -> TestMessage {
        self.reply_to = Some(address.to_owned());
        self
    }

    /// Sets `correlation-id`.
    pub fn correlation_id(mut self, id: &str) -> TestMessage {
        self.correlation_id = Some(id.to_owned());
        self
    }

    /// Gives the message a header section with this delivery-count.
    pub fn header(mut self, delivery_count: u32) -> TestMessage {
        self.header = Some(delivery_count);
        self
    }

    /// Makes the message look like a copy with this retry count.
    pub fn retry_count(self, retry_count: u32) -> TestMessage {
        self.property(RETRY_COUNT_PROPERTY, SimpleValue::Uint(retry_count))
    }

    /// The fixture's `script` property.
    pub fn script(self, script: &str) -> TestMessage {
        self.property("script", SimpleValue::String(script.to_owned()))
    }

    /// Adds an application property.
    pub fn property(mut self, key: &str, value: SimpleValue) -> TestMessage {
        self.properties.push((key.to_owned(), value));
        self
    }

    /// The AMQP message this describes.
    pub fn build(&self) -> AmqpMessage {
        let mut properties = ApplicationProperties::builder();
        for (key, value) in &self.properties {
            properties = properties.insert(key.as_str(), value.clone());
        }
        Message::builder()
            .header(self.header.map(|delivery_count| Header {
                durable: true,
                delivery_count,
                ..Header::default()
            }))
            .properties(Properties {
                reply_to: self.reply_to.clone(),
                correlation_id: self.correlation_id.clone().map(MessageId::String),
                group_id: self.group.as_ref().map(|(id, _)| id.clone()),
                group_sequence: self.group.as_ref().map(|(_, sequence)| *sequence),
                ..Properties::builder()
                    .message_id(self.id.clone())
                    .content_type("text/plain")
                    .build()
            })
            .application_properties(properties.build())
            .body(Body::Value(fe2o3_amqp::types::messaging::AmqpValue(
                Value::String(self.body.clone()),
            )))
            .build()
            .into()
    }
}

impl From<TestMessage> for AmqpMessage {
    fn from(message: TestMessage) -> AmqpMessage {
        message.build()
    }
}

impl From<&TestMessage> for AmqpMessage {
    fn from(message: &TestMessage) -> AmqpMessage {
        message.build()
    }
}

/// One connection and session to a broker.
pub struct Client {
    connection: ConnectionHandle<()>,
    session: SessionHandle<()>,
    senders: HashMap<String, Sender>,
    management: Option<(Sender, Receiver, String)>,
}

impl Client {
    /// Connects to the broker at `url`.
    pub async fn connect(url: &str) -> anyhow::Result<Client> {
        let mut connection = open(url).await.with_context(|| {
            format!("cannot connect to {url}: is the broker running? (scripts/test starts it)")
        })?;
        let session = Session::begin(&mut connection).await?;
        Ok(Client {
            connection,
            session,
            senders: HashMap::new(),
            management: None,
        })
    }

    async fn sender(&mut self, address: &str) -> anyhow::Result<&mut Sender> {
        if !self.senders.contains_key(address) {
            let sender = Sender::attach(&mut self.session, unique("test-sender"), address).await?;
            self.senders.insert(address.to_owned(), sender);
        }
        Ok(self.senders.get_mut(address).expect("inserted above"))
    }

    /// Publishes bytes as they are, valid AMQP or not, and returns the
    /// broker's answer.
    pub async fn publish_raw(
        &mut self,
        address: &str,
        payload: Vec<u8>,
    ) -> anyhow::Result<Outcome> {
        self.publish_raw_within(address, payload, DEADLINE).await
    }

    /// As [`Client::publish_raw`], waiting at most `within` for the answer:
    /// some brokers never answer a message they cannot read.
    pub async fn publish_raw_within(
        &mut self,
        address: &str,
        payload: Vec<u8>,
        within: std::time::Duration,
    ) -> anyhow::Result<Outcome> {
        let sender = self.sender(address).await?;
        let answer = sender.send_payload_batchable(payload.into()).await?;
        tokio::time::timeout(within, answer)
            .await
            .with_context(|| format!("the broker did not answer a publish to {address}"))?
            .map_err(Into::into)
    }

    /// Publishes many messages without waiting for each answer in turn, then
    /// checks every one was accepted.
    pub async fn publish_many(
        &mut self,
        address: &str,
        messages: impl IntoIterator<Item = AmqpMessage>,
    ) -> anyhow::Result<()> {
        let sender = self.sender(address).await?;
        let mut answers = Vec::new();
        for message in messages {
            answers.push(sender.send_payload_batchable(message.encode()?).await?);
        }
        for answer in answers {
            match answer.await? {
                Outcome::Accepted(_) => {}
                other => bail!("publish to {address}: broker answered {other:?}"),
            }
        }
        Ok(())
    }

    /// Publishes one message per id (body `x`, a header, the fixture's
    /// `script`) with [`Client::publish_many`].
    pub async fn publish_scripted(
        &mut self,
        address: &str,
        ids: &[String],
        script: &str,
    ) -> anyhow::Result<()> {
        let messages = ids
            .iter()
            .map(|id| TestMessage::new(id, "x").header(0).script(script).build());
        self.publish_many(address, messages).await
    }

    /// Publishes and waits for `accepted`.
    pub async fn publish(
        &mut self,
        address: &str,
        message: impl Into<AmqpMessage>,
    ) -> anyhow::Result<()> {
        let payload = message.into().encode()?;
        let sender = self.sender(address).await?;
        match sender.send_payload_batchable(payload).await?.await? {
            Outcome::Accepted(_) => Ok(()),
            other => bail!("publish to {address}: broker answered {other:?}"),
        }
    }

    /// A receiver on `address` (attach it before the messages it should see
    /// are published, on fanout addresses).
    pub async fn watch(&mut self, address: &str) -> anyhow::Result<Watcher> {
        let receiver = Receiver::attach(&mut self.session, unique("test-watch"), address).await?;
        Ok(Watcher { receiver })
    }

    /// The first `n` messages waiting on `address`, each released back to
    /// the broker once read (a release counts no delivery attempt).
    pub async fn peek(&mut self, address: &str, n: u32) -> anyhow::Result<Vec<AmqpMessage>> {
        let mut receiver = Receiver::builder()
            .name(unique("test-peek"))
            .source(address)
            .credit_mode(fe2o3_amqp::link::receiver::CreditMode::Auto(n))
            .decode_messages(false)
            .attach(&mut self.session)
            .await?;
        let mut read = Vec::new();
        while read.len() < n as usize {
            let received = tokio::time::timeout(DEADLINE, receiver.recv::<Body<Value>>())
                .await
                .context("no message arrived in time")?;
            match received {
                Err(RecvError::MessageDecode(undecoded)) => {
                    read.push(AmqpMessage::decode(&undecoded.payload)?);
                    receiver.release(undecoded.info).await?;
                }
                Ok(_) => bail!("a peeking receiver decoded a message"),
                Err(e) => return Err(e.into()),
            }
        }
        let _ = receiver.close().await;
        Ok(read)
    }

    /// A receiver on `address` that hands over each message's payload as
    /// it arrived, decoding nothing (for messages no decoder should touch).
    pub async fn watch_raw(&mut self, address: &str) -> anyhow::Result<RawWatcher> {
        let receiver = Receiver::builder()
            .name(unique("test-watch-raw"))
            .source(address)
            .decode_messages(false)
            .attach(&mut self.session)
            .await?;
        Ok(RawWatcher { receiver })
    }

    /// How many messages an Artemis queue holds (0 if it does not exist),
    /// asked of the broker's management address.
    pub async fn artemis_count(&mut self, queue: &str) -> anyhow::Result<u64> {
        let resource = format!("queue.{queue}");
        let Some(text) = self
            .artemis_management(&resource, "countMessages", "[]")
            .await?
        else {
            return Ok(0);
        };
        text.trim_matches(|c| c == '[' || c == ']')
            .parse()
            .with_context(|| format!("management reply {text}"))
    }

    /// How many messages an Artemis queue holds for later delivery.
    pub async fn artemis_scheduled_count(&mut self, queue: &str) -> anyhow::Result<u64> {
        let resource = format!("queue.{queue}");
        let text = self
            .artemis_management(&resource, "getScheduledCount", "[]")
            .await?
            .with_context(|| format!("no queue {queue}"))?;
        text.trim_matches(|c| c == '[' || c == ']')
            .parse()
            .with_context(|| format!("management reply {text}"))
    }

    /// The routing types of an Artemis address, as the broker's JSON text.
    pub async fn artemis_routing_types(&mut self, address: &str) -> anyhow::Result<String> {
        let resource = format!("address.{address}");
        self.artemis_management(&resource, "getRoutingTypesAsJSON", "[]")
            .await?
            .with_context(|| format!("no address {address}"))
    }

    /// Adds Artemis address settings for addresses matching `pattern`:
    /// `settings` is a JSON object of setting names and values.
    pub async fn artemis_address_settings(
        &mut self,
        pattern: &str,
        settings: &str,
    ) -> anyhow::Result<()> {
        let arguments = serde_json::json!([pattern, settings]).to_string();
        self.artemis_management("broker", "addAddressSettings", &arguments)
            .await?
            .map(drop)
            .with_context(|| format!("no broker to set {pattern} on"))
    }

    /// Makes Artemis close every connection that consumes from `address`,
    /// as a broker restart or a network failure would.
    pub async fn artemis_close_consumer_connections(
        &mut self,
        address: &str,
    ) -> anyhow::Result<()> {
        self.artemis_management(
            "broker",
            "closeConsumerConnectionsForAddress",
            &format!("[\"{address}\"]"),
        )
        .await?
        .map(drop)
        .with_context(|| format!("no broker to close the consumers of {address}"))
    }

    /// Calls a management operation on an Artemis resource; `None` when
    /// the resource does not exist.
    async fn artemis_management(
        &mut self,
        resource: &str,
        operation: &str,
        arguments: &str,
    ) -> anyhow::Result<Option<String>> {
        if self.management.is_none() {
            let replies = unique("test.replies");
            let sender =
                Sender::attach(&mut self.session, unique("mgmt"), "activemq.management").await?;
            let receiver =
                Receiver::attach(&mut self.session, unique("mgmt-replies"), replies.as_str())
                    .await?;
            self.management = Some((sender, receiver, replies));
        }
        let (sender, receiver, replies) = self.management.as_mut().expect("set above");
        let request = Message::builder()
            .properties(Properties::builder().reply_to(replies.clone()).build())
            .application_properties(
                ApplicationProperties::builder()
                    .insert("_AMQ_ResourceName", resource)
                    .insert("_AMQ_OperationName", operation)
                    .build(),
            )
            .value(arguments)
            .build();
        sender.send(request).await?;
        let reply = tokio::time::timeout(DEADLINE, receiver.recv::<Body<Value>>())
            .await
            .context("no management reply")??;
        receiver.accept(&reply).await?;
        let text = body_text(&reply.message().clone().into());
        let ok = reply
            .message()
            .application_properties
            .as_ref()
            .and_then(|p| p.0.get("_AMQ_OperationSucceeded"))
            == Some(&SimpleValue::Bool(true));
        match (ok, text.contains("AMQ229067")) {
            (true, _) => Ok(Some(text)),
            (false, true) => Ok(None), // no such resource
            (false, false) => bail!("management {operation} on {resource} failed: {text}"),
        }
    }

    /// Detaches every link and closes the connection.
    pub async fn close(mut self) {
        for (_, sender) in self.senders.drain() {
            let _ = sender.close().await;
        }
        if let Some((sender, receiver, _)) = self.management.take() {
            let _ = sender.close().await;
            let _ = receiver.close().await;
        }
        let _ = self.session.end().await;
        let _ = self.connection.close().await;
    }
}

/// A connection on a socket with `TCP_NODELAY`, as wharf opens them, so a
/// test client is never the slow end.
pub async fn open(url: &str) -> anyhow::Result<ConnectionHandle<()>> {
    let endpoint = Endpoint::parse(url).map_err(anyhow::Error::msg)?;
    let stream = wharf::broker::socket::connect(&endpoint.host, endpoint.port, DEADLINE).await?;
    let profile = match &endpoint.user {
        Some(user) => SaslProfile::Plain {
            username: user.clone(),
            password: endpoint.password.clone().unwrap_or_default(),
        },
        None => SaslProfile::Anonymous,
    };
    Ok(Connection::builder()
        .container_id(unique("wharf-test-client"))
        .hostname(endpoint.host.as_str())
        .sasl_profile(profile)
        .open_with_stream(stream)
        .await?)
}

/// Messages arriving on one address, each accepted on receipt.
pub struct Watcher {
    receiver: Receiver,
}

impl Watcher {
    /// The next message, and when it arrived.
    pub async fn next(&mut self) -> anyhow::Result<(Instant, AmqpMessage)> {
        let received = tokio::time::timeout(DEADLINE, self.receiver.recv::<Body<Value>>())
            .await
            .context("no message arrived in time")?;
        let arrived = Instant::now();
        match received {
            Ok(delivery) => {
                self.receiver.accept(&delivery).await?;
                Ok((arrived, delivery.into_message().into()))
            }
            // Application properties fe2o3 cannot type (a broker's
            // dead-letter history, say): read them as wharf does.
            Err(RecvError::MessageDecode(undecoded)) => {
                let message = AmqpMessage::decode(&undecoded.payload)?;
                self.receiver.accept(undecoded.info).await?;
                Ok((arrived, message))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The next message whose id is `id`, skipping others.
    pub async fn next_with_id(&mut self, id: &str) -> anyhow::Result<(Instant, AmqpMessage)> {
        loop {
            let (at, message) = self.next().await?;
            if message_id(&message).as_deref() == Some(id) {
                return Ok((at, message));
            }
        }
    }

    /// Stops watching.
    pub async fn close(self) {
        let _ = self.receiver.close().await;
    }
}

/// Messages arriving on one address as their payloads, each accepted on
/// receipt.
pub struct RawWatcher {
    receiver: Receiver,
}

impl RawWatcher {
    /// The next message's payload, exactly as it arrived.
    pub async fn next(&mut self) -> anyhow::Result<bytes::Bytes> {
        let received = tokio::time::timeout(DEADLINE, self.receiver.recv::<Body<Value>>())
            .await
            .context("no message arrived in time")?;
        match received {
            Err(RecvError::MessageDecode(undecoded)) => {
                self.receiver.accept(undecoded.info).await?;
                Ok(undecoded.payload)
            }
            Ok(_) => bail!("a raw watcher decoded a message"),
            Err(e) => Err(e.into()),
        }
    }

    /// Stops watching.
    pub async fn close(self) {
        let _ = self.receiver.close().await;
    }
}

/// `properties.message-id` as text.
pub fn message_id(message: &AmqpMessage) -> Option<String> {
    message.message_id()
}

/// The message-id of the input whose output `index` has the message-id
/// `output_id` (`<input id>#<digest>/out/<index>`), if it is one.
pub fn input_of_output(output_id: &str, index: usize) -> Option<&str> {
    let derived = output_id.strip_suffix(&format!("/out/{index}"))?;
    derived.rsplit_once('#').map(|(input, _)| input)
}

/// The `x-ruststream-retry-count` of a message.
pub fn retry_count(message: &AmqpMessage) -> Option<u32> {
    message.counters().retry_count
}

/// The body's bytes: its `data` sections joined, or an `amqp-value`
/// string's.
pub fn body_bytes(message: &AmqpMessage) -> Vec<u8> {
    match &message.body {
        Body::Data(sections) => sections.iter().flat_map(|d| d.0.to_vec()).collect(),
        Body::Value(v) => match &v.0 {
            Value::String(s) => s.clone().into_bytes(),
            other => format!("{other:?}").into_bytes(),
        },
        other => format!("{other:?}").into_bytes(),
    }
}

/// `properties.correlation-id` as text.
pub fn correlation_id(message: &AmqpMessage) -> Option<String> {
    match message.properties.as_ref()?.correlation_id.as_ref()? {
        MessageId::String(s) => Some(s.clone()),
        other => Some(format!("{other:?}")),
    }
}

/// The body as text (an `amqp-value` string).
pub fn body_text(message: &AmqpMessage) -> String {
    match &message.body {
        Body::Value(v) => match &v.0 {
            Value::String(s) => s.clone(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

/// The trace context `message` carries, which must be there (`what`
/// names the message in the error).
pub fn trace_context(
    message: &AmqpMessage,
    what: &str,
) -> anyhow::Result<wharf_core::trace::TraceContext> {
    wharf_core::trace::TraceContext::of(message)
        .map_err(|e| anyhow::anyhow!("{what}: unreadable context in the {}", e.place))?
        .ok_or_else(|| anyhow::anyhow!("{what}: no trace context"))
}
