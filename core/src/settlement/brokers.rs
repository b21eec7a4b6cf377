//! What each broker does to the settlement contract: how a mount's policy
//! is made from its config, the broker's kind, what the broker offered on
//! the links, and what kind of queue the address is.

use super::{DelayPath, Disposition, Policy, RetryPath};
use crate::brokers::{BrokerKind, QueueKind};
use crate::config::{DelayChoice, Mount, OutputsChoice, RetryAfterOriginal, RetryChoice, Settle};

/// What a broker offered on a mount's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkOffers {
    /// The receiver may settle `modified`: the source's `outcomes` list it,
    /// or list nothing.
    pub modified_supported: bool,
    /// Messages are scheduled by their `x-opt-delivery-time`
    /// (`DELAYED_DELIVERY` offered on the connection or the sender).
    pub delayed_delivery: bool,
}

/// The settlement policy of `mount` on a broker of `kind` that offered
/// `links`, on `queue` where the broker said what it is; the mount's
/// config overrides.
pub fn policy_for(
    mount: &Mount,
    kind: BrokerKind,
    links: LinkOffers,
    queue: Option<&QueueKind>,
) -> Policy {
    // Only a queue that counts redeliveries can carry attempts in
    // `modified`; classic queues and streams cannot. A broker that loses
    // parts of a message redelivering it gets copies.
    let counts = queue.is_none_or(|q| matches!(q, QueueKind::Quorum { .. }))
        && !kind.reencodes_redeliveries();
    let retry = match (mount.retry, links.modified_supported) {
        (_, false) | (Some(RetryChoice::Copy), true) => RetryPath::Copy,
        (Some(RetryChoice::Modified), true) => RetryPath::Modified,
        (None, true) if counts => RetryPath::Modified,
        (None, true) => RetryPath::Copy,
    };
    let delay = match (mount.delay, links.delayed_delivery) {
        (Some(DelayChoice::Scheduled), _) | (None, true) => DelayPath::Scheduled,
        (Some(DelayChoice::Held), _) | (None, false) => DelayPath::Held,
    };
    Policy {
        settle: mount.settle,
        max_attempts: mount.max_attempts,
        dead_letter: mount.dead_letter.is_some(),
        retry,
        modified_supported: links.modified_supported,
        delay,
        // Where `rejected` may put the original back beside its copy, it
        // is accepted: the copy carries the message on.
        retry_after_original: match mount.retry_after_original {
            Some(RetryAfterOriginal::Rejected) => Disposition::Rejected,
            Some(RetryAfterOriginal::Accepted) => Disposition::Accepted,
            None if kind.requeues_rejected() => Disposition::Accepted,
            None => Disposition::Rejected,
        },
        rejected_requeues: kind.requeues_rejected(),
        ordered: mount.order_by.is_some(),
    }
}

/// Whether a mount's outputs commit with their input in a transaction:
/// when it may have outputs, settles after the handler, and the config
/// asks for transactions or leaves it to a broker of `kind` that has them.
pub fn outputs_in_transactions(mount: &Mount, kind: BrokerKind) -> bool {
    let grants = &mount.grants;
    let outputs = !grants.send.is_empty() || grants.reply.granted();
    // An at-most-once delivery is settled on receipt: there is no
    // acceptance to commit with.
    outputs
        && mount.settle == Settle::AtLeastOnce
        && match mount.outputs {
            Some(OutputsChoice::Transaction) => true,
            Some(OutputsChoice::Confirm) => false,
            None => kind.transactions_by_default(),
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// A mount on queue `q` with `extra` lines.
    fn mount(extra: &str) -> Mount {
        let dir = std::env::temp_dir().join(format!("wharf-capabilities-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("m.wasm"), b"").expect("module file");
        let text = format!(
            "[broker]\nurl = \"amqp://localhost\"\n[[tenant]]\nname = \"t\"\n[[tenant.mount]]\nname = \"m\"\nmodule = \"m.wasm\"\naddress = \"q\"\n{extra}"
        );
        let config = Config::parse(&text, &dir.join("wharf.toml")).expect("valid config");
        config.mounts().next().expect("one mount").1.clone()
    }

    const EVERYTHING: LinkOffers = LinkOffers {
        modified_supported: true,
        delayed_delivery: true,
    };

    #[test]
    fn activemq_classic_retries_by_copy_unless_the_config_says_modified() {
        let on = |extra| policy_for(&mount(extra), BrokerKind::ActiveMqClassic, EVERYTHING, None);
        assert_eq!(on("").retry, RetryPath::Copy);
        assert_eq!(on("retry = \"modified\"").retry, RetryPath::Modified);
        assert_eq!(on("").retry_after_original, Disposition::Rejected);
        let artemis = policy_for(&mount(""), BrokerKind::Artemis, EVERYTHING, None);
        assert_eq!(artemis.retry, RetryPath::Modified);
    }

    #[test]
    fn broker_j_is_never_sent_rejected_unless_the_config_says() {
        let links = LinkOffers {
            modified_supported: false,
            delayed_delivery: true,
        };
        let on = |extra| policy_for(&mount(extra), BrokerKind::QpidBrokerJ, links, None);
        let policy = on("");
        assert!(policy.rejected_requeues);
        assert_eq!(
            (policy.retry, policy.delay, policy.retry_after_original),
            (RetryPath::Copy, DelayPath::Scheduled, Disposition::Accepted)
        );
        let told = on("retry_after_original = \"rejected\"");
        assert_eq!(told.retry_after_original, Disposition::Rejected);
    }

    #[test]
    fn outputs_commit_in_transactions_where_the_broker_enlists_acceptance() {
        let granted = mount("[tenant.mount.grants]\nsend = [\"out\"]");
        for kind in [
            BrokerKind::Artemis,
            BrokerKind::ActiveMqClassic,
            BrokerKind::QpidBrokerJ,
        ] {
            assert!(outputs_in_transactions(&granted, kind), "{kind:?}");
        }
        assert!(!outputs_in_transactions(&granted, BrokerKind::RabbitMq));
        assert!(!outputs_in_transactions(&granted, BrokerKind::Other));
        assert!(!outputs_in_transactions(&mount(""), BrokerKind::Artemis));
        let confirmed = mount("outputs = \"confirm\"\n[tenant.mount.grants]\nsend = [\"out\"]");
        assert!(!outputs_in_transactions(
            &confirmed,
            BrokerKind::QpidBrokerJ
        ));
    }
}
