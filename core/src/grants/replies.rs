//! Where a handler's `reply` may go. The address comes from the request's
//! `reply-to`, which whoever can publish to the mount writes, so it is
//! checked like any other untrusted input: against the mount's grant,
//! against what the other tenants of this host own, and against the
//! broker's own system addresses.

use super::AddressPattern;

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
    owners: Vec<(String, Vec<AddressPattern>)>,
}

impl AddressOwners {
    /// Owners from `(tenant, addresses it owns)` pairs.
    pub fn new(owners: impl IntoIterator<Item = (String, Vec<AddressPattern>)>) -> AddressOwners {
        AddressOwners {
            owners: owners.into_iter().collect(),
        }
    }

    /// Why a reply from a mount of `tenant` with `grant` may not go to
    /// `address`, or `None` when it may.
    pub fn refuse_reply(&self, tenant: &str, grant: &ReplyGrant, address: &str) -> Option<String> {
        match grant {
            ReplyGrant::Denied => return Some("the mount does not grant `reply`".to_owned()),
            ReplyGrant::Any => {}
            ReplyGrant::To(patterns) => {
                if !patterns.iter().any(|p| p.matches(address)) {
                    return Some("no `grants.reply` pattern names it".to_owned());
                }
            }
        }
        if let Some(why) = system_address(address) {
            return Some(format!("it is {why}"));
        }
        let owns = |addresses: &[AddressPattern]| names(addresses, address);
        let own = self
            .owners
            .iter()
            .any(|(owner, addresses)| owner == tenant && owns(addresses));
        if own {
            return None;
        }
        self.owners
            .iter()
            .find(|(owner, addresses)| owner != tenant && owns(addresses))
            .map(|(owner, _)| format!("it belongs to another tenant (`{owner}`)"))
    }
}

/// Whether `patterns` name `address`, the node behind its broker prefix,
/// or the address or queue of an Artemis fully qualified `address::queue`.
fn names(patterns: &[AddressPattern], address: &str) -> bool {
    let parts = address.split_once("::");
    let node = node_name(address);
    patterns.iter().any(|p| {
        p.matches(address)
            || p.matches(node)
            || parts.is_some_and(|(addr, queue)| p.matches(addr) || p.matches(queue))
    })
}

/// Why `address` is one of a broker's own, which no handler may write to:
/// management and system addresses, RabbitMQ's `amq.` names (its direct
/// reply-to excepted, which exists for replies), Artemis's shared
/// dead-letter and expiry queues, ActiveMQ Classic's `ActiveMQ.` names
/// (advisories, its DLQ). RabbitMQ's address prefixes (`/queue/`,
/// `/queues/`, `/exchange/`, `/exchanges/`, `/topic/`, `/amq/queue/`),
/// ActiveMQ Classic's (`queue://`, `topic://`, `temp-queue://`,
/// `temp-topic://`) and Artemis's `address::queue` are seen through.
pub fn system_address(address: &str) -> Option<&'static str> {
    let names = [address]
        .into_iter()
        .chain(address.split_once("::").map(|(a, _)| a))
        .chain(address.split_once("::").map(|(_, q)| q));
    for raw in names {
        let name = node_name(raw).to_ascii_lowercase();
        if name.starts_with("amq.rabbitmq.reply-to") {
            continue;
        }
        let why = if name.starts_with("activemq.") || name.starts_with("$sys") {
            Some("a broker management or system address")
        } else if name.starts_with('$') {
            Some("a broker system address")
        } else if name.starts_with("amq.") {
            Some("a RabbitMQ system name (`amq.`)")
        } else if name == "dlq" || name == "expiryqueue" {
            Some("the broker's shared dead-letter or expiry queue")
        } else {
            None
        };
        if why.is_some() {
            return why;
        }
    }
    None
}

/// The queue, topic or exchange an address names behind a RabbitMQ or
/// ActiveMQ Classic prefix.
fn node_name(address: &str) -> &str {
    for prefix in [
        "/amq/queue/",
        "/queues/",
        "/queue/",
        "/exchanges/",
        "/exchange/",
        "/topic/",
        "queue://",
        "topic://",
        "temp-queue://",
        "temp-topic://",
    ] {
        if let Some(rest) = address.strip_prefix(prefix) {
            return rest;
        }
    }
    address
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn another_tenants_addresses_are_refused() {
        let owners = owners();
        let any = ReplyGrant::Any;
        for address in [
            "globex.orders",
            "globex.orders.dlq",
            "globex.orders::globex.orders",
            "queue://globex.orders",
            "/queues/globex.orders",
        ] {
            let why = owners.refuse_reply("acme", &any, address);
            assert!(
                why.as_deref().is_some_and(|w| w.contains("`globex`")),
                "{address}: {why:?}"
            );
        }
        assert_eq!(owners.refuse_reply("acme", &any, "acme.replies.7"), None);
        assert_eq!(owners.refuse_reply("acme", &any, "client-42"), None);
        assert_eq!(owners.refuse_reply("globex", &any, "globex.orders"), None);
    }

    #[test]
    fn an_address_both_tenants_use_is_allowed_to_either() {
        let owners = AddressOwners::new([
            ("a".to_owned(), vec![AddressPattern::new("shared")]),
            ("b".to_owned(), vec![AddressPattern::new("shared")]),
        ]);
        assert_eq!(owners.refuse_reply("a", &ReplyGrant::Any, "shared"), None);
    }

    #[test]
    fn system_addresses_are_refused_whatever_the_grant() {
        let owners = owners();
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
                owners.refuse_reply("acme", &all, address).is_some(),
                "{address}"
            );
        }
        assert_eq!(
            owners.refuse_reply("acme", &all, "/queues/amq.rabbitmq.reply-to.g1h2"),
            None
        );
    }

    #[test]
    fn a_pattern_grant_limits_replies_to_what_it_names() {
        let owners = owners();
        let grant = ReplyGrant::To(vec![AddressPattern::new("client.*")]);
        assert_eq!(owners.refuse_reply("acme", &grant, "client.9"), None);
        assert!(owners.refuse_reply("acme", &grant, "other").is_some());
        assert!(
            owners
                .refuse_reply("acme", &ReplyGrant::Denied, "client.9")
                .is_some()
        );
    }
}
