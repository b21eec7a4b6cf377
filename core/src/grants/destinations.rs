//! Where a handler's outputs may go. A reply's address comes from the
//! request's `reply-to`, which whoever can publish to the mount writes, a
//! send's from the handler: both are read as the broker reads them
//! ([`crate::address`]) and checked against the mount's grant, against
//! what the other tenants of this host own, and against the broker's own
//! system addresses.

use std::sync::OnceLock;

use super::AddressPattern;
use crate::address::{self, AddressError, MAX_ADDRESS_BYTES};
use crate::brokers::BrokerKind;
use crate::text::Untrusted;

/// What `grants.reply` allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReplyGrant {
    /// No replies (the default).
    #[default]
    Denied,
    /// Replies to whatever `reply-to` names, within the rules below.
    Any,
    /// Replies only to addresses these patterns name, within the rules
    /// below.
    To(Vec<AddressPattern>),
}

impl ReplyGrant {
    /// Whether the mount may reply at all.
    pub fn granted(&self) -> bool {
        *self != ReplyGrant::Denied
    }
}

/// The addresses each tenant of this host owns: its mounts' addresses,
/// their dead-letter addresses, and its send grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressOwners {
    owners: Owned,
    /// The owners' patterns as each kind of broker reads them, made when
    /// first asked: index [`kind_index`].
    read: [OnceLock<Owned>; 5],
}

/// Each tenant with the patterns of the addresses it owns.
type Owned = Vec<(String, Vec<AddressPattern>)>;

/// Why an output may not go where its handler asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The address is longer than [`MAX_ADDRESS_BYTES`].
    TooLarge,
    /// Not allowed; why, in words that quote nothing of the address.
    Denied(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::TooLarge => write!(f, "it is longer than {MAX_ADDRESS_BYTES} bytes"),
            Refusal::Denied(why) => f.write_str(why),
        }
    }
}

impl AddressOwners {
    /// Owners from `(tenant, addresses it owns)` pairs.
    pub fn new(owners: impl IntoIterator<Item = (String, Vec<AddressPattern>)>) -> AddressOwners {
        AddressOwners {
            owners: owners.into_iter().collect(),
            read: Default::default(),
        }
    }

    /// Whether a reply from a mount of `tenant` with `grant` may go to
    /// `address` on a broker of `kind`: every node the broker would reach
    /// through it must be one the grant names, none a broker's own, none
    /// another tenant's.
    pub fn check_reply(
        &self,
        kind: BrokerKind,
        tenant: &str,
        grant: &ReplyGrant,
        address: &Untrusted,
    ) -> Result<(), Refusal> {
        let patterns = match grant {
            ReplyGrant::Denied => {
                return Err(Refusal::Denied(
                    "the mount does not grant `reply`".to_owned(),
                ));
            }
            ReplyGrant::Any => None,
            ReplyGrant::To(patterns) => Some(patterns),
        };
        let names = read(kind, address)?;
        if let Some(patterns) = patterns {
            within(kind, patterns, &names, "no `grants.reply` pattern names it")?;
        }
        if let Some(why) = names.iter().find_map(|name| system_name(name)) {
            return Err(Refusal::Denied(format!("it reaches {why}")));
        }
        self.stays_home(kind, tenant, &names)
    }

    /// Whether a mount of `tenant` granted `grants` may send to `address`
    /// on a broker of `kind`: every node the broker would reach through it
    /// must be one a grant names, a broker's own only where a grant names
    /// it in full, and none another tenant's that the grants do not name in
    /// full (the config refuses wildcards that would).
    pub fn check_send(
        &self,
        kind: BrokerKind,
        tenant: &str,
        grants: &[AddressPattern],
        address: &Untrusted,
    ) -> Result<(), Refusal> {
        let names = read(kind, address)?;
        within(kind, grants, &names, "not in the mount's `grants.send`")?;
        let literal = |name: &str| {
            grants
                .iter()
                .flat_map(|grant| address::pattern_names(kind, grant))
                .any(|pattern| pattern.is_literal() && pattern.as_str() == name)
        };
        for name in &names {
            if let Some(why) = system_name(name)
                && !literal(name)
            {
                return Err(Refusal::Denied(format!("it reaches {why}")));
            }
        }
        self.stays_home(kind, tenant, &names)
    }

    /// Refuses a name another tenant owns and `tenant` does not.
    fn stays_home(&self, kind: BrokerKind, tenant: &str, names: &[String]) -> Result<(), Refusal> {
        let owners = self.read[kind_index(kind)].get_or_init(|| {
            self.owners
                .iter()
                .map(|(owner, patterns)| {
                    let read = patterns
                        .iter()
                        .flat_map(|p| address::pattern_names(kind, p))
                        .collect();
                    (owner.clone(), read)
                })
                .collect()
        });
        let owns =
            |patterns: &[AddressPattern], name: &str| patterns.iter().any(|p| p.matches(name));
        for name in names {
            let own = owners
                .iter()
                .any(|(owner, patterns)| owner == tenant && owns(patterns, name));
            if own {
                continue;
            }
            if let Some((owner, _)) = owners
                .iter()
                .find(|(owner, patterns)| owner != tenant && owns(patterns, name))
            {
                return Err(Refusal::Denied(format!(
                    "it reaches an address of another tenant (`{owner}`)"
                )));
            }
        }
        Ok(())
    }
}

/// The names `address` reaches on a broker of `kind`, or why it is
/// refused.
fn read(kind: BrokerKind, address: &Untrusted) -> Result<Vec<String>, Refusal> {
    address::names(kind, address.as_checked()).map_err(|e| match e {
        AddressError::TooLong { .. } => Refusal::TooLarge,
        other => Refusal::Denied(format!("the address is refused: {other}")),
    })
}

/// Refuses unless every one of `names` is named by one of `patterns`, as
/// a broker of `kind` reads them.
fn within(
    kind: BrokerKind,
    patterns: &[AddressPattern],
    names: &[String],
    why: &str,
) -> Result<(), Refusal> {
    let read: Vec<AddressPattern> = patterns
        .iter()
        .flat_map(|p| address::pattern_names(kind, p))
        .collect();
    if names
        .iter()
        .all(|name| read.iter().any(|p| p.matches(name)))
    {
        Ok(())
    } else {
        Err(Refusal::Denied(why.to_owned()))
    }
}

fn kind_index(kind: BrokerKind) -> usize {
    match kind {
        BrokerKind::Artemis => 0,
        BrokerKind::RabbitMq => 1,
        BrokerKind::ActiveMqClassic => 2,
        BrokerKind::QpidBrokerJ => 3,
        BrokerKind::Other => 4,
    }
}

/// Why `name` (a node an address reaches, as [`address::names`] gives
/// it) is one of a broker's own, which no handler may write to unasked:
/// management and system addresses, RabbitMQ's `amq.` names (its direct
/// reply-to excepted, which exists for replies), Artemis's shared
/// dead-letter and expiry queues, ActiveMQ Classic's `ActiveMQ.` names
/// (advisories, its DLQ).
pub fn system_name(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    if name.starts_with("amq.rabbitmq.reply-to") {
        None
    } else if name.starts_with("activemq.") || name.starts_with("$sys") {
        Some("a broker management or system address")
    } else if name.starts_with('$') {
        Some("a broker system address")
    } else if name.starts_with("amq.") {
        Some("a RabbitMQ system name (`amq.`)")
    } else if name == "dlq" || name == "expiryqueue" {
        Some("the broker's shared dead-letter or expiry queue")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn owners() -> AddressOwners {
        AddressOwners::new([
            (
                "acme".to_owned(),
                vec![
                    AddressPattern::new("acme.rpc"),
                    AddressPattern::new("acme.replies.*"),
                ],
            ),
            (
                "globex".to_owned(),
                vec![
                    AddressPattern::new("globex.orders"),
                    AddressPattern::new("globex.orders.dlq"),
                    AddressPattern::new("audit"),
                ],
            ),
        ])
    }

    fn reply(
        kind: BrokerKind,
        tenant: &str,
        grant: &ReplyGrant,
        address: &str,
    ) -> Result<(), Refusal> {
        owners().check_reply(kind, tenant, grant, &Untrusted::new(address))
    }

    #[test]
    fn another_tenants_addresses_are_refused() {
        let any = ReplyGrant::Any;
        for address in [
            "globex.orders",
            "globex.orders.dlq",
            "globex.orders::globex.orders",
            "queue://globex.orders",
            "/queues/globex.orders",
            "/queues/globex%2Eorders",
            "client.1,globex.orders",
            "client.1, queue://globex.orders",
        ] {
            let why = reply(BrokerKind::Other, "acme", &any, address);
            assert!(
                matches!(&why, Err(Refusal::Denied(w)) if w.contains("`globex`")),
                "{address}: {why:?}"
            );
        }
        for kind in BrokerKind::ALL {
            assert_eq!(reply(kind, "acme", &any, "acme.replies.7"), Ok(()));
            assert_eq!(reply(kind, "acme", &any, "client-42"), Ok(()));
            assert_eq!(reply(kind, "globex", &any, "globex.orders"), Ok(()));
        }
    }

    #[test]
    fn an_address_both_tenants_use_is_allowed_to_either() {
        let owners = AddressOwners::new([
            ("a".to_owned(), vec![AddressPattern::new("shared")]),
            ("b".to_owned(), vec![AddressPattern::new("shared")]),
        ]);
        let shared = Untrusted::new("shared");
        assert_eq!(
            owners.check_reply(BrokerKind::Other, "a", &ReplyGrant::Any, &shared),
            Ok(())
        );
    }

    #[test]
    fn system_addresses_are_refused_whatever_the_grant() {
        let all = ReplyGrant::To(vec![AddressPattern::new("*")]);
        for address in [
            "activemq.management",
            "activemq.notifications",
            "$sys.mqtt.queue",
            "amq.direct",
            "/exchange/amq.topic/x",
            "/queues/amq.gen-1",
            "DLQ",
            "q::DLQ",
            "ActiveMQ.DLQ",
            "topic://ActiveMQ.Advisory.Connection",
            "queue://$management",
        ] {
            assert!(
                reply(BrokerKind::Other, "acme", &all, address).is_err(),
                "{address}"
            );
        }
        assert_eq!(
            reply(
                BrokerKind::RabbitMq,
                "acme",
                &all,
                "/queues/amq.rabbitmq.reply-to.g1h2"
            ),
            Ok(())
        );
    }

    #[test]
    fn a_pattern_grant_limits_replies_to_what_it_names() {
        let grant = ReplyGrant::To(vec![AddressPattern::new("client.*")]);
        assert_eq!(reply(BrokerKind::Other, "acme", &grant, "client.9"), Ok(()));
        assert!(reply(BrokerKind::Other, "acme", &grant, "other").is_err());
        assert!(reply(BrokerKind::Other, "acme", &ReplyGrant::Denied, "client.9").is_err());
        // A composite that starts with a granted name reaches one that is
        // not.
        assert!(
            reply(
                BrokerKind::ActiveMqClassic,
                "acme",
                &grant,
                "client.1,elsewhere"
            )
            .is_err()
        );
        // RabbitMQ reads the decoded name, which the grant names.
        assert_eq!(
            reply(BrokerKind::RabbitMq, "acme", &grant, "/queues/client%2E9"),
            Ok(())
        );
    }

    #[test]
    fn an_address_too_long_is_too_large_not_denied() {
        let long = "a".repeat(MAX_ADDRESS_BYTES + 1);
        assert_eq!(
            reply(BrokerKind::Artemis, "acme", &ReplyGrant::Any, &long),
            Err(Refusal::TooLarge)
        );
        let sent = owners().check_send(
            BrokerKind::Artemis,
            "acme",
            &[AddressPattern::new("*")],
            &Untrusted::new(long),
        );
        assert_eq!(sent, Err(Refusal::TooLarge));
    }

    #[test]
    fn sends_reach_only_what_the_grants_name() {
        let owners = owners();
        let send = |kind, grants: &[&str], address: &str| {
            let grants: Vec<AddressPattern> =
                grants.iter().map(|g| AddressPattern::new(*g)).collect();
            owners.check_send(kind, "acme", &grants, &Untrusted::new(address))
        };
        assert_eq!(
            send(BrokerKind::Artemis, &["acme.out.*"], "acme.out.1"),
            Ok(())
        );
        assert!(
            send(
                BrokerKind::ActiveMqClassic,
                &["acme.out.*"],
                "acme.out.1,audit"
            )
            .is_err()
        );
        assert!(send(BrokerKind::Artemis, &["acme.out.*"], "acme.out.1::audit").is_err());
        assert!(send(BrokerKind::RabbitMq, &["*"], "/queues/globex%2Eorders").is_err());
        assert!(send(BrokerKind::Artemis, &["*"], "DLQ").is_err());
        // Named in full, a broker's own address or another tenant's may be
        // granted.
        assert_eq!(send(BrokerKind::Artemis, &["DLQ"], "DLQ"), Ok(()));
    }

    /// A name a tenant might own: words of letters and digits joined by
    /// dots, dashes or underscores.
    fn name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9]{0,6}([._-][a-z0-9]{1,6}){0,3}"
    }

    /// `name` with each byte percent-encoded where `mask` says.
    fn percent_encoded(name: &str, mask: u64) -> String {
        name.bytes()
            .enumerate()
            .map(|(i, b)| {
                if mask >> (i % 64) & 1 == 1 {
                    format!("%{b:02X}")
                } else {
                    (b as char).to_string()
                }
            })
            .collect()
    }

    /// Every spelling of `name` that `kind` reads as reaching it.
    fn spellings(kind: BrokerKind, name: &str, mask: u64) -> Vec<String> {
        let encoded = percent_encoded(name, mask);
        let mut all = vec![name.to_owned()];
        match kind {
            BrokerKind::RabbitMq => all.extend([
                format!("/queues/{encoded}"),
                format!("/queue/{name}"),
                format!("/queue/{encoded}"),
                format!("/amq/queue/{encoded}"),
                format!("/exchanges/amq.default/{encoded}"),
                format!("/exchanges/x/{encoded}"),
                format!("/exchange/amq.default/{name}"),
                format!("/topic/{name}"),
            ]),
            BrokerKind::ActiveMqClassic => all.extend([
                format!("queue://{name}"),
                format!("QUEUE://{name}"),
                format!("topic://{name}"),
                format!("client.1,{name}"),
                format!("client.1, queue://{name}"),
                format!("{name}?consumer.prefetchSize=1"),
                format!(" {name} "),
            ]),
            BrokerKind::Artemis => all.extend([
                format!("client::{name}"),
                format!("{name}::client"),
                format!("queue://{name}"),
            ]),
            BrokerKind::QpidBrokerJ => all.extend([
                format!("amq.direct/{name}"),
                format!("x/{name}"),
                format!("/{name}"),
            ]),
            BrokerKind::Other => {
                for known in BrokerKind::KNOWN {
                    all.extend(spellings(known, name, mask));
                }
            }
        }
        all
    }

    proptest! {
        #[test]
        fn no_spelling_of_another_tenants_address_is_allowed(
            owned in name(),
            mask in any::<u64>(),
            kind in prop::sample::select(BrokerKind::ALL.to_vec()),
        ) {
            prop_assume!(!owned.starts_with("client"));
            let owners = AddressOwners::new([
                ("acme".to_owned(), vec![AddressPattern::new("client.*")]),
                ("globex".to_owned(), vec![AddressPattern::new(owned.clone())]),
            ]);
            let grants = [
                ReplyGrant::Any,
                ReplyGrant::To(vec![AddressPattern::new("client.*")]),
            ];
            for spelling in spellings(kind, &owned, mask) {
                let address = Untrusted::new(spelling.clone());
                for grant in &grants {
                    let refused = owners.check_reply(kind, "acme", grant, &address);
                    prop_assert!(refused.is_err(), "{kind:?}: reply to {spelling:?}");
                }
                let sent = owners.check_send(kind, "acme", &[AddressPattern::new("client.*")], &address);
                prop_assert!(sent.is_err(), "{kind:?}: send to {spelling:?}");
            }
        }

        #[test]
        fn no_spelling_of_a_system_address_is_allowed(
            system in prop::sample::select(vec![
                "DLQ", "ExpiryQueue", "ActiveMQ.DLQ", "ActiveMQ.Advisory.Queue",
                "activemq.management", "amq.direct", "amq.gen-1", "$sys.x",
            ]),
            mask in any::<u64>(),
            kind in prop::sample::select(BrokerKind::ALL.to_vec()),
        ) {
            let owners = AddressOwners::default();
            let all = ReplyGrant::To(vec![AddressPattern::new("*")]);
            for spelling in spellings(kind, system, mask) {
                let address = Untrusted::new(spelling.clone());
                prop_assert!(
                    owners.check_reply(kind, "acme", &all, &address).is_err(),
                    "{kind:?}: reply to {spelling:?}"
                );
                prop_assert!(
                    owners.check_send(kind, "acme", &[AddressPattern::new("*")], &address).is_err(),
                    "{kind:?}: send to {spelling:?}"
                );
            }
        }
    }
}
