//! One AMQP connection to one broker node.

use std::time::Duration;
use wharf_core::brokers::BrokerKind;

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::sasl_profile::{SaslProfile, SaslScramSha256, SaslScramSha512};
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::primitives::{Symbol, Value};
use fe2o3_amqp::{Connection, Session};

use super::error::{BrokerError, ConnectFailure, Timed};
use super::{socket, tls};
use wharf_core::config::{Broker, Credentials, SaslMechanism, TlsFiles};
use wharf_core::endpoint::Endpoint;

/// Sessions one connection may carry (the AMQP maximum; a broker may allow
/// fewer, and then the pool opens more connections).
const CHANNEL_MAX: u16 = u16::MAX;

/// How a connection is opened and kept.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The container id announced in the AMQP open.
    pub container_id: String,
    /// How long TCP, SASL and the AMQP open may take together.
    pub connect_timeout: Duration,
    /// The idle time-out announced to the broker.
    pub idle_timeout: Duration,
    /// How long beginning a session may take.
    pub begin_timeout: Duration,
    /// How to log in.
    pub credentials: Credentials,
    /// TLS for `amqps://` nodes; its files are read at every connect, so
    /// renewed certificates are picked up on the next reconnect.
    pub tls: Option<TlsFiles>,
}

impl ConnectOptions {
    /// The options `broker` asks for.
    pub fn of(broker: &Broker) -> ConnectOptions {
        ConnectOptions {
            container_id: broker.container_id.clone(),
            connect_timeout: broker.connect_timeout,
            idle_timeout: broker.idle_timeout,
            begin_timeout: broker.attach_timeout,
            credentials: broker.credentials.clone(),
            tls: broker.tls.clone(),
        }
    }
}

/// The SASL profile for `endpoint`: the URL's user and password where it
/// has them, else the config's.
fn sasl_profile(endpoint: &Endpoint, credentials: &Credentials) -> SaslProfile {
    let user = || {
        endpoint
            .user
            .clone()
            .or_else(|| credentials.user.clone())
            .unwrap_or_default()
    };
    let password = || {
        endpoint
            .password
            .clone()
            .or_else(|| credentials.password.as_ref().map(|p| p.expose().to_owned()))
            .unwrap_or_default()
    };
    match credentials.mechanism {
        SaslMechanism::Anonymous => SaslProfile::Anonymous,
        SaslMechanism::Plain => SaslProfile::Plain {
            username: user(),
            password: password(),
        },
        SaslMechanism::External => SaslProfile::External,
        SaslMechanism::ScramSha256 => {
            SaslProfile::ScramSha256(SaslScramSha256::new(user(), password()))
        }
        SaslMechanism::ScramSha512 => {
            SaslProfile::ScramSha512(SaslScramSha512::new(user(), password()))
        }
    }
}

/// What a broker said about itself when the connection opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerOffers {
    /// It schedules messages by their `x-opt-delivery-time` annotation.
    pub delayed_delivery: bool,
    /// The `product` of its open properties (`apache-activemq-artemis`,
    /// `RabbitMQ`).
    pub product: Option<String>,
    /// The `version` of its open properties.
    pub version: Option<String>,
}

/// The capability a broker offers in its open when it schedules messages by
/// their delivery time (Artemis does).
const DELAYED_DELIVERY: &str = "DELAYED_DELIVERY";

impl BrokerOffers {
    /// Which broker it is, by its open properties.
    pub fn kind(&self) -> BrokerKind {
        BrokerKind::of_product(self.product.as_deref())
    }

    /// Whether the broker is ActiveMQ Artemis.
    pub fn is_artemis(&self) -> bool {
        self.kind() == BrokerKind::Artemis
    }

    /// Whether the broker is RabbitMQ.
    pub fn is_rabbitmq(&self) -> bool {
        self.kind() == BrokerKind::RabbitMq
    }

    fn of(handle: &ConnectionHandle<()>) -> BrokerOffers {
        let property = |key: &str| {
            let properties = handle.remote_properties()?;
            match properties.get(&Symbol::from(key))? {
                Value::String(text) => Some(text.clone()),
                Value::Symbol(text) => Some(text.0.clone()),
                _ => None,
            }
        };
        BrokerOffers {
            delayed_delivery: handle
                .remote_offered_capabilities()
                .is_some_and(|offered| offered.iter().any(|c| c.0 == DELAYED_DELIVERY)),
            product: property("product"),
            version: property("version"),
        }
    }
}

/// An open AMQP 1.0 connection.
pub struct BrokerConnection {
    handle: ConnectionHandle<()>,
    endpoint: Endpoint,
    begin_timeout: Duration,
    offers: BrokerOffers,
}

impl BrokerConnection {
    /// Opens a TCP socket of its own (`TCP_NODELAY`, keepalive, connect
    /// time-out), TLS on it for `amqps://`, and an AMQP connection with the
    /// configured SASL mechanism.
    pub async fn open(
        endpoint: &Endpoint,
        options: &ConnectOptions,
    ) -> Result<BrokerConnection, BrokerError> {
        let fail = |source| BrokerError::Connect {
            endpoint: endpoint.to_string(),
            source,
        };
        let tls = match (&options.tls, endpoint.scheme.as_str()) {
            (Some(files), "amqps") => Some(
                wharf_core::tls::client_config(files)
                    .map_err(|e| fail(ConnectFailure::TlsFiles(e)))?,
            ),
            (None, "amqp") => None,
            _ => {
                return Err(fail(ConnectFailure::Unsupported(format!(
                    "`{}://` does not match the broker's TLS settings (TLS goes with `amqps://`)",
                    endpoint.scheme
                ))));
            }
        };
        let opening = async {
            let stream = socket::connect(&endpoint.host, endpoint.port, options.connect_timeout)
                .await
                .map_err(ConnectFailure::Socket)?;
            let idle_ms = u32::try_from(options.idle_timeout.as_millis()).unwrap_or(u32::MAX);
            let builder = Connection::builder()
                .container_id(options.container_id.clone())
                .channel_max(CHANNEL_MAX)
                .idle_time_out(idle_ms)
                .hostname(endpoint.host.as_str())
                .sasl_profile(sasl_profile(endpoint, &options.credentials));
            match tls {
                Some(config) => {
                    let server_name = options
                        .tls
                        .as_ref()
                        .and_then(|t| t.server_name.as_deref())
                        .unwrap_or(&endpoint.host);
                    let stream = tls::handshake(config, server_name, stream)
                        .await
                        .map_err(ConnectFailure::Tls)?;
                    builder.open_with_secured_stream(stream).await.map_err(|e| {
                        match tls::refused_certificate(&e) {
                            Some(refused) => ConnectFailure::Tls(refused),
                            None => ConnectFailure::Open(e),
                        }
                    })
                }
                None => builder
                    .open_with_stream(stream)
                    .await
                    .map_err(ConnectFailure::Open),
            }
        };
        let handle = tokio::time::timeout(options.connect_timeout, opening)
            .await
            .map_err(|_| fail(ConnectFailure::TimedOut(options.connect_timeout)))?
            .map_err(fail)?;
        Ok(BrokerConnection {
            offers: BrokerOffers::of(&handle),
            handle,
            endpoint: endpoint.clone(),
            begin_timeout: options.begin_timeout,
        })
    }

    /// The node it is connected to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// What the broker said about itself.
    pub fn offers(&self) -> &BrokerOffers {
        &self.offers
    }

    /// Begins a session, within the begin time-out.
    pub async fn begin_session(&mut self) -> Result<SessionHandle<()>, BrokerError> {
        let begun = tokio::time::timeout(self.begin_timeout, Session::begin(&mut self.handle))
            .await
            .map_err(|_| Timed::TimedOut(self.begin_timeout))
            .and_then(|begun| begun.map_err(Timed::Failed));
        begun.map_err(|source| BrokerError::Begin { source })
    }

    /// Whether the connection has ended (closed by either side, or lost).
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Closes the connection, waiting at most `timeout` for the broker.
    pub async fn close(mut self, timeout: Duration) {
        if !self.handle.is_closed() {
            let _ = tokio::time::timeout(timeout, self.handle.close()).await;
        }
    }
}
