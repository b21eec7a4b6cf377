//! A publisher that is not on our side: messages drawn from a grammar of
//! hostile shapes, each built byte by byte as any client could send it.
//! Huge and odd application-property keys, values nested deep and wide,
//! every AMQP type in every section, arrays of empty compounds, long and
//! odd `reply-to` and `to` addresses (the neighbour tenant's queue in
//! every spelling a broker reads), ids of every type and size, forged host
//! annotations and headers. A seed decides everything: a seed that breaks
//! an invariant is a regression test.

use fe2o3_amqp::types::messaging::{Header, MessageId, Properties};
use fe2o3_amqp::types::primitives::{Binary, Uuid};
use wharf_core::brokers::BrokerKind;

/// A small, seeded random number source (SplitMix64): the same seed gives
/// the same messages on every machine.
pub struct Rng(u64);

impl Rng {
    /// The source for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (at least 1).
    pub fn below(&mut self, n: usize) -> usize {
        (self.bits() % n.max(1) as u64) as usize
    }

    /// A number in `low..=high`.
    pub fn within(&mut self, low: usize, high: usize) -> usize {
        low + self.below(high - low + 1)
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// True about one time in `n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// What the broker the messages go through is, and takes.
#[derive(Debug, Clone)]
pub struct Through {
    /// Its kind: which spellings of an address it reads.
    pub kind: BrokerKind,
    /// The deepest nesting the broker itself decodes without failing
    /// (Broker-J decodes every message, recursively).
    pub max_depth: usize,
    /// It takes only simple values as application properties (Broker-J).
    pub simple_properties: bool,
    /// The neighbour tenant's queue name, and its dead-letter queue's.
    pub neighbour: Vec<String>,
}

/// One hostile message.
#[derive(Debug, Clone)]
pub struct Hostile {
    /// Which shape of the grammar made it.
    pub shape: &'static str,
    /// The message as sent.
    pub payload: Vec<u8>,
    /// Its message-id as wharf reports it (bounded, escaped).
    pub id: String,
}

/// The scripts a hostile message may carry for the fixture handler: every
/// outcome, and the outputs that read `reply-to`.
const SCRIPTS: [&str; 8] = [
    "*:ack",
    "*:retry",
    "*:drop",
    "1:after=20 *:ack",
    "*:reply,ack",
    "*:trap",
    "1:retry *:ack",
    "*:reply,retry",
];

/// The shapes of the grammar, by name.
pub const SHAPES: [&str; 14] = [
    "binary-key",
    "odd-keys",
    "many-keys",
    "deep-value",
    "wide-value",
    "empty-compounds",
    "every-type",
    "long-reply-to",
    "neighbour-reply-to",
    "system-reply-to",
    "odd-ids",
    "forged-host",
    "symbolic-sections",
    "odd-to",
];

/// Message `n` of the run with `seed`: a shape drawn from the grammar,
/// filled in at random.
pub fn message(rng: &mut Rng, seed: u64, n: usize, through: &Through) -> Hostile {
    let shape = *rng.pick(&SHAPES);
    let mut m = Draft::new(rng, seed, n);
    match shape {
        "binary-key" => {
            let len = m.rng.within(1, 60_000);
            m.property(binary(&vec![0xab; len]), int(1));
        }
        "odd-keys" => {
            for _ in 0..m.rng.within(1, 5) {
                let key = match m.rng.below(6) {
                    0 => int(7),
                    1 => vec![0x40],
                    2 => symbol("sym"),
                    3 => string(&"k".repeat(m.rng.within(1, 30_000))),
                    4 => string("line\nbreak\u{1b}[31m\u{202e}"),
                    _ => ulong(u64::MAX),
                };
                m.property(key, string("v"));
            }
        }
        "many-keys" => {
            for i in 0..m.rng.within(100, 5_000) {
                m.property(string(&format!("k{i}")), int(i as i32));
            }
        }
        "deep-value" => {
            let depth = m.rng.within(1, through.max_depth.min(80));
            let value = nested(depth);
            if m.rng.one_in(2) && !through.simple_properties {
                m.property(string("deep"), value);
            } else {
                m.body = section(0x77, &value);
            }
        }
        "wide-value" => {
            let n = m.rng.within(1, 300_000);
            let item = if m.rng.one_in(2) {
                vec![0x41]
            } else {
                vec![0x45]
            };
            m.body = section(0x77, &list(&vec![item; n]));
        }
        "empty-compounds" => {
            let n = m.rng.within(1, 1_000);
            let array = empty_lists(n);
            match m.rng.below(3) {
                0 => m.body = section(0x77, &array),
                1 if !through.simple_properties => m.property(string("lists"), array),
                _ => m.annotation("x-opt-lists", array),
            }
        }
        "every-type" => {
            let value = m.any_value(3);
            m.body = match m.rng.below(3) {
                0 => section(0x77, &value),
                1 => [
                    section(0x76, &list(std::slice::from_ref(&value))),
                    section(0x76, &list(&[value])),
                ]
                .concat(),
                _ => [
                    section(0x75, &binary(b"one")),
                    section(0x75, &binary(b"two")),
                ]
                .concat(),
            };
        }
        "long-reply-to" => {
            let len = m.rng.within(900, 100_000);
            m.properties.reply_to = Some(format!("client.{}", "r".repeat(len)));
            m.script = Some(*m.rng.pick(&["*:reply,ack", "*:reply,fails=too-large,ack"]));
        }
        "neighbour-reply-to" => {
            let queue = m.rng.pick(&through.neighbour).clone();
            let spelt = spellings(through.kind, &queue);
            m.properties.reply_to = Some(m.rng.pick(&spelt).clone());
            m.script = Some("*:reply,fails=denied,ack");
        }
        "system-reply-to" => {
            let system = *m.rng.pick(&[
                "DLQ",
                "ActiveMQ.DLQ",
                "activemq.management",
                "amq.direct",
                "$sys.x",
            ]);
            let spelt = spellings(through.kind, system);
            m.properties.reply_to = Some(m.rng.pick(&spelt).clone());
            m.script = Some("*:reply,fails=denied,ack");
        }
        "odd-ids" => {
            let (id, shown) = m.odd_id();
            m.properties.message_id = Some(id);
            m.id = shown;
            if m.rng.one_in(2) {
                let len = m.rng.within(1, 100_000);
                m.properties.correlation_id = Some(MessageId::Binary(Binary::from(vec![7; len])));
            }
        }
        "forged-host" => {
            match m.rng.below(8) {
                0 => m.property(string("x-ruststream-retry-count"), string("99")),
                1 => m.property(string("x-ruststream-retry-count"), ulong(u64::MAX)),
                2 => m.property(string("x-wharf-retry-seal"), string(&"f".repeat(5_000))),
                3 => {
                    // Unique: Artemis drops a second message with the same
                    // id on the address, as it should.
                    let mut id = m.id.clone().into_bytes();
                    id.resize(3_000, 1);
                    m.property(string("_AMQ_DUPL_ID"), binary(&id));
                }
                4 => m.property(string("traceparent"), string(&"0".repeat(10_000))),
                5 => m.annotation(
                    "x-opt-wharf-dead-letter-reason",
                    string(&"reason\n".repeat(8_000)),
                ),
                6 => m.annotation("x-delivery-count", string("999999999999")),
                _ => m.annotation("x-opt-delivery-time", string("yesterday")),
            }
            m.header = Some(Header {
                delivery_count: *m.rng.pick(&[0, 1, 2, u32::MAX]),
                first_acquirer: m.rng.one_in(2),
                durable: m.rng.one_in(2),
                ..Header::default()
            });
        }
        "symbolic-sections" => {
            m.symbolic = true;
        }
        _ => {
            let to = if m.rng.one_in(2) {
                "t".repeat(m.rng.within(1, 80_000))
            } else {
                through.neighbour[0].clone()
            };
            m.properties.to = Some(to);
        }
    }
    m.finish(shape)
}

/// A message being drawn: its sections, to be encoded in order.
struct Draft<'a> {
    rng: &'a mut Rng,
    header: Option<Header>,
    annotations: Vec<(Vec<u8>, Vec<u8>)>,
    properties: Properties,
    /// Application properties, keys and values encoded.
    application: Vec<(Vec<u8>, Vec<u8>)>,
    script: Option<&'static str>,
    body: Vec<u8>,
    /// Sections named by symbol rather than code.
    symbolic: bool,
    /// The message-id as wharf reports it.
    id: String,
}

impl<'a> Draft<'a> {
    fn new(rng: &'a mut Rng, seed: u64, n: usize) -> Draft<'a> {
        let id = format!("h{seed:x}-{n}");
        let script = Some(*rng.pick(&SCRIPTS));
        Draft {
            rng,
            header: None,
            annotations: Vec::new(),
            properties: Properties::builder().message_id(id.clone()).build(),
            application: Vec::new(),
            script,
            body: section(0x77, &string("hostile")),
            symbolic: false,
            id,
        }
    }

    fn property(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.application.push((key, value));
    }

    fn annotation(&mut self, key: &str, value: Vec<u8>) {
        self.annotations.push((symbol(key), value));
    }

    /// A message-id of an odd type or size, and how wharf shows it.
    fn odd_id(&mut self) -> (MessageId, String) {
        let n = self.id.clone();
        match self.rng.below(4) {
            0 => {
                let id = 1_000_000_000_000 + self.rng.bits() % 1_000_000_000;
                (MessageId::Ulong(id), id.to_string())
            }
            1 => {
                let mut bytes = [0u8; 16];
                bytes[..8].copy_from_slice(&self.rng.bits().to_be_bytes());
                bytes[8..].copy_from_slice(&self.rng.bits().to_be_bytes());
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                let text = format!(
                    "{}-{}-{}-{}-{}",
                    &hex[0..8],
                    &hex[8..12],
                    &hex[12..16],
                    &hex[16..20],
                    &hex[20..32]
                );
                (MessageId::Uuid(Uuid::from(bytes)), text)
            }
            2 => {
                let mut bytes = n.clone().into_bytes();
                bytes.resize(bytes.len() + self.rng.within(0, 50_000), 0xfe);
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                (
                    MessageId::Binary(Binary::from(bytes)),
                    wharf_core::text::shown(&hex).to_string(),
                )
            }
            _ => {
                let text = format!(
                    "{n}-{}\n{}",
                    "i".repeat(self.rng.within(0, 200_000)),
                    "\u{1b}"
                );
                let shown = wharf_core::text::shown(&text).to_string();
                (MessageId::String(text), shown)
            }
        }
    }

    /// A value of any AMQP type, nested at most `depth` deep.
    fn any_value(&mut self, depth: usize) -> Vec<u8> {
        let kinds = if depth == 0 { 14 } else { 18 };
        match self.rng.below(kinds) {
            0 => vec![0x40],
            1 => vec![0x41],
            2 => vec![0x50, 0xff],
            3 => [vec![0x60], 65_535u16.to_be_bytes().to_vec()].concat(),
            4 => [vec![0x71], (-7i32).to_be_bytes().to_vec()].concat(),
            5 => [vec![0x81], i64::MIN.to_be_bytes().to_vec()].concat(),
            6 => [vec![0x72], f32::NAN.to_bits().to_be_bytes().to_vec()].concat(),
            7 => [vec![0x82], f64::INFINITY.to_bits().to_be_bytes().to_vec()].concat(),
            8 => [vec![0x94], [0xee; 16].to_vec()].concat(),
            9 => [vec![0x73], 0x1f600u32.to_be_bytes().to_vec()].concat(),
            10 => [vec![0x83], i64::MAX.to_be_bytes().to_vec()].concat(),
            11 => [vec![0x98], [0x11; 16].to_vec()].concat(),
            12 => symbol("a-symbol"),
            13 => string("text with\nlines"),
            14 => {
                let items: Vec<Vec<u8>> = (0..self.rng.within(0, 4))
                    .map(|_| self.any_value(depth - 1))
                    .collect();
                list(&items)
            }
            15 => {
                let key = self.any_value(0);
                let value = self.any_value(depth - 1);
                map(&[(key, value)])
            }
            16 => {
                let value = self.any_value(depth - 1);
                [vec![0x00, 0xa3, 0x07], b"x:thing".to_vec(), value].concat()
            }
            _ => empty_lists(self.rng.within(0, 3)),
        }
    }

    fn finish(mut self, shape: &'static str) -> Hostile {
        let mut payload = Vec::new();
        if let Some(header) = &self.header {
            payload.extend(serde_amqp::to_vec(header).expect("a header encodes"));
        }
        if !self.annotations.is_empty() {
            payload.extend(self.section(0x72, &map(&self.annotations)));
        }
        payload.extend(serde_amqp::to_vec(&self.properties).expect("properties encode"));
        if let Some(script) = self.script {
            self.application.push((string("script"), string(script)));
        }
        if !self.application.is_empty() {
            payload.extend(self.section(0x74, &map(&self.application)));
        }
        if self.symbolic {
            payload.extend(self.section(0x77, &string("named sections")));
        } else {
            payload.extend(&self.body);
        }
        Hostile {
            shape,
            payload,
            id: self.id,
        }
    }

    /// A section, named by its code or (when the draft says) its symbol.
    fn section(&self, code: u8, value: &[u8]) -> Vec<u8> {
        if !self.symbolic {
            return section(code, value);
        }
        let name = match code {
            0x72 => "amqp:message-annotations:map",
            0x74 => "amqp:application-properties:map",
            _ => "amqp:amqp-value:*",
        };
        [vec![0x00], symbol(name), value.to_vec()].concat()
    }
}

/// Every spelling of the node `name` that a broker of `kind` reads as
/// reaching it (an unknown broker: every known broker's).
pub fn spellings(kind: BrokerKind, name: &str) -> Vec<String> {
    let encoded: String = name
        .bytes()
        .map(|b| {
            if b == b'.' {
                "%2E".to_owned()
            } else {
                (b as char).to_string()
            }
        })
        .collect();
    let mut all = vec![name.to_owned()];
    match kind {
        BrokerKind::RabbitMq => all.extend([
            format!("/queues/{encoded}"),
            format!("/queues/{name}"),
            format!("/queue/{name}"),
            format!("/amq/queue/{name}"),
            format!("/exchanges/amq.default/{encoded}"),
            format!("/exchange/amq.default/{name}"),
        ]),
        BrokerKind::ActiveMqClassic => all.extend([
            format!("queue://{name}"),
            format!("client.1,{name}"),
            format!("client.1,queue://{name}"),
            format!("client.1, {name}"),
            format!("{name}?consumer.prefetchSize=1"),
        ]),
        BrokerKind::Artemis => all.extend([format!("client::{name}"), format!("{name}::{name}")]),
        BrokerKind::QpidBrokerJ => all.extend([format!("amq.direct/{name}"), format!("/{name}")]),
        BrokerKind::Other => {
            for known in BrokerKind::KNOWN {
                all.extend(spellings(known, name));
            }
        }
    }
    all
}

/// A described section: descriptor `code`, then `value`.
pub fn section(code: u8, value: &[u8]) -> Vec<u8> {
    [vec![0x00, 0x53, code], value.to_vec()].concat()
}

/// A `str32`.
pub fn string(text: &str) -> Vec<u8> {
    variable(0xb1, text.as_bytes())
}

/// A `sym32`.
pub fn symbol(text: &str) -> Vec<u8> {
    variable(0xb3, text.as_bytes())
}

/// A `vbin32`.
pub fn binary(bytes: &[u8]) -> Vec<u8> {
    variable(0xb0, bytes)
}

/// An `int`.
pub fn int(n: i32) -> Vec<u8> {
    [vec![0x71], n.to_be_bytes().to_vec()].concat()
}

/// A `ulong`.
pub fn ulong(n: u64) -> Vec<u8> {
    [vec![0x80], n.to_be_bytes().to_vec()].concat()
}

fn variable(code: u8, bytes: &[u8]) -> Vec<u8> {
    let len = u32::try_from(bytes.len()).expect("under 4 GiB");
    [vec![code], len.to_be_bytes().to_vec(), bytes.to_vec()].concat()
}

/// A `list32` of encoded `items`.
pub fn list(items: &[Vec<u8>]) -> Vec<u8> {
    compound(0xd0, items.iter().map(Vec::as_slice), items.len())
}

/// A `map32` of encoded keys and values.
pub fn map(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let items = entries
        .iter()
        .flat_map(|(key, value)| [key.as_slice(), value.as_slice()]);
    compound(0xd1, items, entries.len() * 2)
}

fn compound<'a>(code: u8, items: impl Iterator<Item = &'a [u8]>, count: usize) -> Vec<u8> {
    let content: Vec<u8> = items.flat_map(|item| item.iter().copied()).collect();
    let size = u32::try_from(content.len() + 4).expect("under 4 GiB");
    let count = u32::try_from(count).expect("under 4 billion");
    [
        vec![code],
        size.to_be_bytes().to_vec(),
        count.to_be_bytes().to_vec(),
        content,
    ]
    .concat()
}

/// An `array32` of `n` empty lists: a value serde_amqp 0.18 decodes but
/// cannot encode again.
pub fn empty_lists(n: usize) -> Vec<u8> {
    let count = u32::try_from(n).expect("under 4 billion");
    // The count and the element constructor: `list0` elements take no
    // bytes of their own.
    let size = 5u32;
    let mut array = vec![0xf0];
    array.extend(size.to_be_bytes());
    array.extend(count.to_be_bytes());
    array.push(0x45);
    array
}

/// A list nested `depth` deep around an empty one.
pub fn nested(depth: usize) -> Vec<u8> {
    let mut value = vec![0x45];
    for _ in 1..depth {
        value = list(&[value]);
    }
    value
}
