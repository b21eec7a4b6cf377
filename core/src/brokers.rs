//! The brokers wharf knows beyond what they offer: how each is told from
//! the others, and what it does that the AMQP spec leaves open.

/// The brokers whose behaviour wharf knows beyond what they offer, by the
/// `product` of their open properties. What each does differently was
/// measured by the tests on a real broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// ActiveMQ Artemis (`apache-activemq-artemis`).
    Artemis,
    /// RabbitMQ 3.x (`rabbitmq_amqp1_0`) or 4.x (`RabbitMQ`).
    RabbitMq,
    /// ActiveMQ Classic 5.x/6.x (`ActiveMQ`).
    ActiveMqClassic,
    /// Apache Qpid Broker-J (`Apache Qpid Broker-J Core`).
    QpidBrokerJ,
    /// Any other broker: only what it offers counts.
    Other,
}

impl BrokerKind {
    /// `messaging.system` in OpenTelemetry's messaging conventions.
    pub fn messaging_system(self) -> &'static str {
        match self {
            BrokerKind::Artemis | BrokerKind::ActiveMqClassic => "activemq",
            BrokerKind::RabbitMq => "rabbitmq",
            BrokerKind::QpidBrokerJ => "qpid",
            BrokerKind::Other => "amqp",
        }
    }

    /// It decodes and encodes a message again to redeliver it after
    /// `modified`, and loses sections on the way (ActiveMQ Classic 6.3
    /// keeps only the header and footer of a message with two data
    /// sections): retries are better carried by the host's copies, which
    /// are built from the bytes as first delivered.
    pub fn reencodes_redeliveries(self) -> bool {
        self == BrokerKind::ActiveMqClassic
    }

    /// It puts a `rejected` message back on its queue, counted, until the
    /// queue's own delivery limit routes it elsewhere (Broker-J's
    /// `maximumDeliveryAttempts`, which is off by default): an original
    /// settled `rejected` after its copy went out may come back.
    pub fn requeues_rejected(self) -> bool {
        self == BrokerKind::QpidBrokerJ
    }

    /// It drops a message whose `_AMQ_DUPL_ID` it has seen (Artemis).
    pub fn drops_duplicate_ids(self) -> bool {
        self == BrokerKind::Artemis
    }

    /// Outputs commit with their input in a transaction unless the config
    /// says otherwise: where the tests showed local transactions that
    /// take a receiver's `accepted` with outputs sent on other sessions
    /// (RabbitMQ has none over AMQP 1.0).
    pub fn transactions_by_default(self) -> bool {
        matches!(
            self,
            BrokerKind::Artemis | BrokerKind::ActiveMqClassic | BrokerKind::QpidBrokerJ
        )
    }
}

impl BrokerKind {
    /// The brokers wharf knows.
    pub const KNOWN: [BrokerKind; 4] = [
        BrokerKind::Artemis,
        BrokerKind::RabbitMq,
        BrokerKind::ActiveMqClassic,
        BrokerKind::QpidBrokerJ,
    ];

    /// Every kind, `Other` last.
    pub const ALL: [BrokerKind; 5] = [
        BrokerKind::Artemis,
        BrokerKind::RabbitMq,
        BrokerKind::ActiveMqClassic,
        BrokerKind::QpidBrokerJ,
        BrokerKind::Other,
    ];

    /// Which broker it is, by the `product` of its open properties.
    pub fn of_product(product: Option<&str>) -> BrokerKind {
        match product {
            Some(p) if p.contains("artemis") => BrokerKind::Artemis,
            Some(p) if p.eq_ignore_ascii_case("rabbitmq") => BrokerKind::RabbitMq,
            Some("ActiveMQ") => BrokerKind::ActiveMqClassic,
            Some(p) if p.starts_with("Apache Qpid Broker-J") => BrokerKind::QpidBrokerJ,
            _ => BrokerKind::Other,
        }
    }
}

/// What kind of queue a RabbitMQ 4 address consumes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueKind {
    /// Counts nothing: a redelivered message looks like a first one.
    Classic,
    /// Counts deliveries (`x-delivery-count`) and dead-letters on its own
    /// at its delivery limit.
    Quorum {
        /// The queue's `x-delivery-limit` argument, if declared with one
        /// (policies may set another, which this does not see).
        delivery_limit: Option<u64>,
    },
    /// An append-only log: nothing can be put back.
    Stream,
    /// A type this version of wharf does not know.
    Other(String),
}

impl std::fmt::Display for QueueKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueKind::Classic => f.write_str("classic"),
            QueueKind::Quorum {
                delivery_limit: Some(limit),
            } => write!(f, "quorum (delivery limit {limit})"),
            QueueKind::Quorum {
                delivery_limit: None,
            } => f.write_str("quorum"),
            QueueKind::Stream => f.write_str("stream"),
            QueueKind::Other(kind) => write!(f, "{kind}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broker_is_known_by_its_product() {
        let kind = |product: &str| BrokerKind::of_product(Some(product));
        assert_eq!(kind("apache-activemq-artemis"), BrokerKind::Artemis);
        assert_eq!(kind("RabbitMQ"), BrokerKind::RabbitMq);
        assert_eq!(kind("ActiveMQ"), BrokerKind::ActiveMqClassic);
        assert_eq!(kind("Apache Qpid Broker-J Core"), BrokerKind::QpidBrokerJ);
        assert_eq!(kind("SolaceMessageBroker"), BrokerKind::Other);
        assert_eq!(BrokerKind::of_product(None), BrokerKind::Other);
    }
}
