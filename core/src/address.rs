//! Addresses as a broker reads them. A handler's send address and a
//! request's `reply-to` are chosen by whoever wrote the module or published
//! the request, and brokers read more into an address than its spelling:
//! RabbitMQ percent-decodes `/queues/…` and takes v1 forms beside v2 ones,
//! ActiveMQ Classic splits `a,b` into two destinations and strips
//! `queue://`, Artemis reaches a queue through `address::queue`, Broker-J
//! routes `exchange/key`. So every isolation check compares the names of
//! the nodes an address reaches ([`names`]), never its spelling; a spelling
//! whose reading is not certain is refused.

use crate::brokers::BrokerKind;
use crate::grants::AddressPattern;

/// The longest address wharf attaches a link to or publishes to, in bytes.
/// Every broker's names are shorter (RabbitMQ's at most 255 bytes), and an
/// address travels in a link's attach frame, which must fit the broker's
/// frame size.
pub const MAX_ADDRESS_BYTES: usize = 1024;

/// Why an address is refused before any link to it exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Longer than [`MAX_ADDRESS_BYTES`].
    #[error("it is {len} bytes long, over the limit of {MAX_ADDRESS_BYTES}")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Empty.
    #[error("it is empty")]
    Empty,
    /// It holds a control character (a line break, a NUL).
    #[error("it holds a control character")]
    Control,
    /// A broker would read it in a way wharf cannot be sure of.
    #[error("{broker} may read it otherwise than it is spelt ({why})")]
    Uncertain {
        /// The broker.
        broker: &'static str,
        /// What makes it so.
        why: &'static str,
    },
}

impl AddressError {
    /// Whether the address is refused for its size alone.
    pub fn too_long(&self) -> bool {
        matches!(self, AddressError::TooLong { .. })
    }
}

/// The names of the nodes (queues, addresses, exchanges, routing keys) that
/// `address` may reach on a broker of `kind`, for checks against owners
/// and grants. A broker of another kind gets the names every known broker
/// would read, and a spelling any of them would refuse to be sure of is
/// refused.
pub fn names(kind: BrokerKind, address: &str) -> Result<Vec<String>, AddressError> {
    plain(address)?;
    match kind {
        BrokerKind::Artemis => artemis(address),
        BrokerKind::RabbitMq => rabbitmq(address),
        BrokerKind::ActiveMqClassic => activemq(address),
        BrokerKind::QpidBrokerJ => Ok(qpid(address)),
        BrokerKind::Other => {
            let mut all = Vec::new();
            for known in BrokerKind::KNOWN {
                for name in names(known, address)? {
                    push_new(&mut all, &name);
                }
            }
            Ok(all)
        }
    }
}

/// What any address must be, whatever the broker: not empty, within
/// [`MAX_ADDRESS_BYTES`], free of control characters.
pub fn plain(address: &str) -> Result<(), AddressError> {
    if address.len() > MAX_ADDRESS_BYTES {
        return Err(AddressError::TooLong { len: address.len() });
    }
    if address.is_empty() {
        return Err(AddressError::Empty);
    }
    if address.chars().any(char::is_control) {
        return Err(AddressError::Control);
    }
    Ok(())
}

/// `pattern` read as an address is: the patterns of the names it reaches
/// (`/queues/orders.*` names what `orders.*` does on RabbitMQ). A broker's
/// own wildcards in it (Artemis's `#`, ActiveMQ Classic's `>`, in a
/// mount's address) count as `*`, which names at least as much. A pattern
/// the broker would not read as an address stays as written.
pub fn pattern_names(kind: BrokerKind, pattern: &AddressPattern) -> Vec<AddressPattern> {
    // Wildcards are the pattern's own: read them as part of a name.
    let text = pattern.as_str().replace(['#', '>', '*'], WILDCARD_STAND_IN);
    match names(kind, &text) {
        Ok(names) => names
            .into_iter()
            .map(|name| AddressPattern::new(name.replace(WILDCARD_STAND_IN, "*")))
            .collect(),
        Err(_) => vec![pattern.clone()],
    }
}

/// What stands for a pattern's `*` while it is read as an address: no
/// broker gives it a meaning.
const WILDCARD_STAND_IN: &str = "\u{e000}";

fn uncertain(broker: &'static str, why: &'static str) -> AddressError {
    AddressError::Uncertain { broker, why }
}

/// Artemis: an address, or `address::queue` (a fully qualified queue name)
/// reaching both; `queue://` and `topic://` are stripped where an acceptor
/// is set up with them as routing-type prefixes. Wildcards (`#`, `*`)
/// are refused: what a wildcard address reaches is the broker's to decide.
fn artemis(address: &str) -> Result<Vec<String>, AddressError> {
    if address.contains(['#', '*']) {
        return Err(uncertain("Artemis", "a wildcard address"));
    }
    let mut names = vec![address.to_owned()];
    for stripped in strip_prefixes(address, &["queue://", "topic://"]) {
        push_new(&mut names, stripped);
    }
    for at in 0..names.len() {
        let name = names[at].clone();
        for part in name.split("::") {
            push_new(&mut names, part);
        }
    }
    Ok(names)
}

/// RabbitMQ 4's v2 addresses (`/queues/Q`, `/exchanges/X`,
/// `/exchanges/X/K`: segments percent-decoded), its v1 ones and 3.x's
/// (`/queue/Q`, `/amq/queue/Q`, `/exchange/X`, `/exchange/X/K`,
/// `/topic/K`: read as spelt and, to be sure, decoded too), and a plain
/// name (a queue). An exchange reaches its name and its routing key (the
/// default exchange routes a key to the queue of that name; a bound
/// exchange by rules wharf cannot see).
fn rabbitmq(address: &str) -> Result<Vec<String>, AddressError> {
    const BROKER: &str = "RabbitMQ";
    let Some(path) = address.strip_prefix('/') else {
        return Ok(vec![address.to_owned()]);
    };
    let segments: Vec<&str> = path.split('/').collect();
    let decoded = |segment: &str| {
        decode_strictly(segment)
            .filter(|name| !name.is_empty())
            .ok_or_else(|| uncertain(BROKER, "a segment that does not percent-decode to a name"))
    };
    // v1 forms are not decoded by every version; both readings count.
    let both = |segment: &str| -> Result<Vec<String>, AddressError> {
        let mut names = vec![segment.to_owned()];
        if segment.contains('%') {
            names.push(decoded(segment)?);
        }
        if segment.is_empty() {
            return Err(uncertain(BROKER, "an empty segment"));
        }
        Ok(names)
    };
    let names = match segments.as_slice() {
        ["queues", queue] => vec![decoded(queue)?],
        ["exchanges", exchange] => vec![decoded(exchange)?],
        ["exchanges", exchange, key] => vec![decoded(exchange)?, decoded(key)?],
        ["queue", queue] | ["amq", "queue", queue] => both(queue)?,
        ["exchange", exchange] => both(exchange)?,
        ["exchange", exchange, key] => [both(exchange)?, both(key)?].concat(),
        ["topic", key] => [vec!["amq.topic".to_owned()], both(key)?].concat(),
        ["queue"] => return Err(uncertain(BROKER, "it routes by each message's `to`")),
        _ => return Err(uncertain(BROKER, "not an address form RabbitMQ documents")),
    };
    Ok(names)
}

/// `%XX` escapes decoded; `None` when one is malformed or the result is not
/// UTF-8 (a broker may read such a name otherwise).
pub fn decode_strictly(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// ActiveMQ Classic: `a,b` is a composite destination reaching each part
/// (trimmed, as the broker trims them), each with or without a
/// `queue://`, `topic://`, `temp-queue://` or `temp-topic://` prefix and
/// with its `?options` cut off. Wildcards (`*`, `>`) are refused: what a
/// wildcard destination reaches is the broker's to decide.
fn activemq(address: &str) -> Result<Vec<String>, AddressError> {
    const BROKER: &str = "ActiveMQ Classic";
    const PREFIXES: [&str; 4] = ["queue://", "topic://", "temp-queue://", "temp-topic://"];
    let mut names = Vec::new();
    for part in address.split(',') {
        let part = part.trim();
        let forms = std::iter::once(part).chain(strip_prefixes(part, &PREFIXES));
        for form in forms {
            let name = form.split_once('?').map_or(form, |(name, _)| name).trim();
            if name.is_empty() {
                return Err(uncertain(BROKER, "an empty destination"));
            }
            if name.contains(['*', '>']) {
                return Err(uncertain(BROKER, "a wildcard destination"));
            }
            push_new(&mut names, name);
        }
    }
    Ok(names)
}

/// Qpid Broker-J: a queue or exchange name, or `exchange/routing-key`,
/// which reaches the queues the key is bound to: a name with slashes
/// reaches every tail of it (a key may hold slashes itself). The exchange
/// in front is a way through, not a destination.
fn qpid(address: &str) -> Vec<String> {
    let mut names = vec![address.to_owned()];
    let mut rest = address;
    while let Some((_, tail)) = rest.split_once('/') {
        if !tail.is_empty() {
            push_new(&mut names, tail);
        }
        rest = tail;
    }
    names
}

/// Adds `name` to `names` unless it is there already.
fn push_new(names: &mut Vec<String>, name: &str) {
    if !names.iter().any(|known| known == name) {
        names.push(name.to_owned());
    }
}

/// `text` with each of `prefixes` stripped, as often as one starts it
/// (case aside): every form on the way.
fn strip_prefixes<'a>(text: &'a str, prefixes: &[&str]) -> Vec<&'a str> {
    let mut forms = Vec::new();
    let mut rest = text;
    'strip: loop {
        for prefix in prefixes {
            let starts = rest
                .get(..prefix.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(prefix));
            if starts {
                rest = &rest[prefix.len()..];
                forms.push(rest);
                continue 'strip;
            }
        }
        return forms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(kind: BrokerKind, address: &str) -> Vec<String> {
        names(kind, address).unwrap_or_else(|e| panic!("{address}: {e}"))
    }

    #[test]
    fn rabbitmq_decodes_v2_segments_and_reads_v1_both_ways() {
        let kind = BrokerKind::RabbitMq;
        assert_eq!(read(kind, "/queues/globex%2Eorders"), ["globex.orders"]);
        assert_eq!(read(kind, "orders"), ["orders"]);
        assert_eq!(
            read(kind, "/queue/a%2Eb"),
            ["a%2Eb".to_owned(), "a.b".to_owned()]
        );
        assert_eq!(
            read(kind, "/exchanges/amq.default/globex.orders"),
            ["amq.default", "globex.orders"]
        );
        assert_eq!(read(kind, "/topic/k"), ["amq.topic", "k"]);
        for uncertain in [
            "/queues/a/b",
            "/queues/%2",
            "/queues/%zz",
            "/queue",
            "/x/y",
            "/queues/",
        ] {
            assert!(names(kind, uncertain).is_err(), "{uncertain}");
        }
    }

    #[test]
    fn activemq_splits_composites_and_strips_prefixes_and_options() {
        let kind = BrokerKind::ActiveMqClassic;
        assert_eq!(
            read(kind, "client.1, queue://globex.orders?consumer.x=1"),
            ["client.1", "queue://globex.orders", "globex.orders"]
        );
        assert_eq!(read(kind, "QUEUE://a"), ["QUEUE://a", "a"]);
        for uncertain in ["a,", "a.>", "a.*", "queue://"] {
            assert!(names(kind, uncertain).is_err(), "{uncertain}");
        }
    }

    #[test]
    fn artemis_reaches_both_halves_of_a_qualified_name() {
        assert_eq!(
            read(BrokerKind::Artemis, "client::globex.orders"),
            ["client::globex.orders", "client", "globex.orders"]
        );
        assert_eq!(
            read(BrokerKind::Artemis, "queue://a::b"),
            ["queue://a::b", "a::b", "queue://a", "b", "a"]
        );
    }

    #[test]
    fn broker_j_reaches_every_tail_of_an_exchange_and_key() {
        assert_eq!(
            read(BrokerKind::QpidBrokerJ, "amq.direct/globex.orders"),
            ["amq.direct/globex.orders", "globex.orders"]
        );
        assert_eq!(
            read(BrokerKind::QpidBrokerJ, "/queue/a/b"),
            ["/queue/a/b", "queue/a/b", "a/b", "b"]
        );
    }

    #[test]
    fn an_unknown_broker_gets_every_reading() {
        let all = read(BrokerKind::Other, "/queues/a%2Eb,c");
        assert!(all.contains(&"a.b,c".to_owned()), "{all:?}");
        assert!(all.contains(&"c".to_owned()), "{all:?}");
        assert!(names(BrokerKind::Other, "a.>").is_err());
    }

    #[test]
    fn every_broker_refuses_what_no_name_holds() {
        for kind in BrokerKind::ALL {
            assert_eq!(names(kind, ""), Err(AddressError::Empty));
            assert_eq!(names(kind, "a\nb"), Err(AddressError::Control));
            let long = "a".repeat(MAX_ADDRESS_BYTES + 1);
            assert!(names(kind, &long).is_err_and(|e| e.too_long()));
        }
    }

    #[test]
    fn patterns_are_read_as_the_addresses_they_name() {
        let read = |kind, text| {
            pattern_names(kind, &AddressPattern::new(text))
                .iter()
                .map(|p| p.as_str().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(read(BrokerKind::RabbitMq, "/queues/orders.*"), ["orders.*"]);
        assert_eq!(
            read(BrokerKind::ActiveMqClassic, "queue://orders.*"),
            ["queue://orders.*", "orders.*"]
        );
        assert_eq!(read(BrokerKind::RabbitMq, "/nonsense/*"), ["/nonsense/*"]);
        assert_eq!(read(BrokerKind::Artemis, "news.#"), ["news.*"]);
        assert!(names(BrokerKind::Artemis, "news.#").is_err());
    }
}
