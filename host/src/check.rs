//! `wharf check`: the config and every module loaded as `wharf run` would,
//! one line per mount, and with `--connect` each broker and address tried.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use wharf::Host;
use wharf::broker::{BrokerOffers, ConnectOptions, ProbeTarget};
use wharf_core::brokers::BrokerKind;
use wharf_core::config::{
    Broker, Config, DelayChoice, Mount, OutputsChoice, RetryChoice, Settle, Tenant,
};
use wharf_core::endpoint::Endpoint;
use wharf_core::grants::ReplyGrant;
use wharf_core::settlement::{DelayPath, RetryPath};
use wharf_core::settlement::{LinkOffers, outputs_in_transactions, policy_for};

/// Loads the config and every module; prints a line per mount (the long
/// explanation with `verbose`); with `connect`, tries every broker and
/// address and fails if any is refused.
pub(crate) async fn check(path: &Path, verbose: bool, connect: bool) -> anyhow::Result<()> {
    let config = Config::load(path)?;
    let lines: Vec<String> = config
        .mounts()
        .map(|(t, m)| {
            if verbose {
                explain(t, m)
            } else {
                summary(t, m)
            }
        })
        .collect();
    let (tenants, mounts) = (config.tenants.len(), lines.len());
    let probes = connect.then(|| config.clone());
    Host::load(config).await?;
    println!(
        "{}: ok ({tenants} tenant(s), {mounts} mount(s), every module is a valid handler and starts)",
        path.display()
    );
    for line in lines {
        println!("  {line}");
    }
    if !verbose && mounts > 0 {
        println!("  (`auto`: decided at attach by what the broker offers; `--verbose` says how)");
    }
    match probes {
        Some(config) => connect_all(&config).await,
        None => Ok(()),
    }
}

/// One short line: the address, how deliveries are settled, and what the
/// mount may reach.
fn summary(tenant: &Tenant, mount: &Mount) -> String {
    let mut line = format!("{}/{}: `{}`", tenant.name, mount.name, mount.address);
    if let Some(subscription) = &mount.subscription {
        line += &format!(
            " (topic, {} subscription `{}`)",
            subscription.kind.as_str(),
            subscription.name
        );
    }
    line += &format!(", {}", mount.settle);
    let retry = match mount.retry {
        Some(RetryChoice::Modified) => "modified",
        Some(RetryChoice::Copy) => "copies",
        None => "auto",
    };
    let delay = match mount.delay {
        Some(DelayChoice::Scheduled) => "scheduled",
        Some(DelayChoice::Held) => "held",
        None => "auto",
    };
    match &mount.order_by {
        Some(order_by) => line += &format!(", ordered by {order_by}, retries in place"),
        None => line += &format!(", retry {retry}, retry-after {delay}"),
    }
    if let Some(dead_letter) = &mount.dead_letter {
        line += &format!(", dead letters to `{dead_letter}`");
    }
    let grants = &mount.grants;
    let mut sends: Vec<String> = grants
        .send
        .iter()
        .map(|p| format!("`{}`", p.as_str()))
        .collect();
    match &grants.reply {
        ReplyGrant::Denied => {}
        ReplyGrant::Any => sends.push("reply-to".to_owned()),
        ReplyGrant::To(patterns) => sends.push(format!(
            "reply-to within {}",
            patterns
                .iter()
                .map(|p| format!("`{}`", p.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
    if !sends.is_empty() {
        line += &format!(", sends to {}", sends.join(", "));
    }
    if !grants.http.allowed.is_empty() {
        let to: Vec<&str> = grants.http.allowed.iter().map(|p| p.as_str()).collect();
        line += &format!(", HTTP to {}", to.join(", "));
    }
    line
}

/// How a mount's retries, delays and outputs will be carried out, as
/// `wharf check --verbose` explains it: what the config fixes, or how it
/// is decided at attach.
fn explain(tenant: &Tenant, mount: &Mount) -> String {
    let retry = match mount.retry {
        Some(RetryChoice::Modified) => "`modified`",
        Some(RetryChoice::Copy) => "copies",
        None => {
            "`modified` where the broker takes it, counts redeliveries and redelivers a message intact, else copies (seen at attach)"
        }
    };
    let delay = match mount.delay {
        Some(DelayChoice::Scheduled) => "copies scheduled on the broker",
        Some(DelayChoice::Held) => "held by the host, the original unsettled",
        None => "scheduled where the broker offers DELAYED_DELIVERY, else held (seen at attach)",
    };
    let grants = &mount.grants;
    let outputs = if grants.send.is_empty() && !grants.reply.granted() {
        String::new()
    } else {
        let mut to: Vec<&str> = grants.send.iter().map(|p| p.as_str()).collect();
        let replies;
        match &grants.reply {
            ReplyGrant::Denied => {}
            ReplyGrant::Any => to.push("reply-to"),
            ReplyGrant::To(patterns) => {
                let names: Vec<&str> = patterns.iter().map(|p| p.as_str()).collect();
                replies = format!("reply-to within {}", names.join(", "));
                to.push(&replies);
            }
        }
        let how = match (mount.outputs, mount.settle) {
            (_, Settle::AtMostOnce) => "published on an ack (the delivery is settled on receipt)",
            (Some(OutputsChoice::Transaction), _) => {
                "posted in one transaction with the ack (all or nothing; the mount needs a broker with transactions)"
            }
            (Some(OutputsChoice::Confirm), _) => {
                "published and confirmed before the ack is accepted (at least once; duplicates dropped by id on Artemis)"
            }
            (None, _) => {
                "in one transaction with the ack where the broker is Artemis, ActiveMQ Classic or Qpid Broker-J, else confirmed before the ack is accepted (at least once; seen at attach)"
            }
        };
        format!("; outputs to {}: {how}", to.join(", "))
    };
    let http = if grants.http.allowed.is_empty() {
        String::new()
    } else {
        let to: Vec<&str> = grants.http.allowed.iter().map(|p| p.as_str()).collect();
        format!("; HTTP to {} (not part of the settlement)", to.join(", "))
    };
    let topic = match &mount.subscription {
        Some(subscription) => format!(
            " (topic: {} subscription `{}`)",
            subscription.kind.as_str(),
            subscription.name
        ),
        None => String::new(),
    };
    let retries = match &mount.order_by {
        Some(order_by) => format!(
            "ordered by {order_by}: one delivery of a key at a time, in the order delivered, keys side by side (at most {}); retry and retry-after run again in place, holding the key; across replicas: see `--connect`",
            mount.max_keys
        ),
        None => format!("retry: {retry}; retry-after: {delay}"),
    };
    format!(
        "{}/{}: {} on `{}`{topic}; {retries}{outputs}{http}",
        tenant.name, mount.name, mount.settle, mount.address
    )
}

/// How a mount's retries, delays and outputs would be carried out on a
/// broker that offered `links`, as its attach would choose, with the
/// reason where the broker's kind decides.
fn chosen(mount: &Mount, offers: &BrokerOffers, links: LinkOffers) -> String {
    let kind = offers.kind();
    let outputs = if outputs_in_transactions(mount, kind) {
        "; outputs in transactions"
    } else {
        ""
    };
    if let Some(order_by) = &mount.order_by {
        let across = wharf_core::ordering::across_replicas(order_by, kind);
        return format!("ordered by {order_by}, retries in place; order kept {across}{outputs}");
    }
    let policy = policy_for(mount, kind, links, None);
    let retry = match policy.retry {
        _ if mount.retry.is_none() && kind == BrokerKind::RabbitMq && links.modified_supported => {
            "`modified` on a quorum queue, else copies (its kind is asked at attach)"
        }
        RetryPath::Modified => "`modified`",
        RetryPath::Copy if !links.modified_supported => "copies (no `modified` offered)",
        RetryPath::Copy if mount.retry.is_none() && kind.reencodes_redeliveries() => {
            "copies (the broker re-encodes what it redelivers)"
        }
        RetryPath::Copy => "copies",
    };
    let delay = match (policy.delay, links.delayed_delivery) {
        (DelayPath::Scheduled, true) => "scheduled on the broker",
        (DelayPath::Scheduled, false) => "scheduled, though the broker offers no DELAYED_DELIVERY",
        (DelayPath::Held, _) => "held by the host",
    };
    let original = policy.retry_after_original.as_str();
    let gives_up = if policy.rejected_requeues {
        "; the broker puts `rejected` back, so the host gives messages up"
    } else {
        ""
    };
    format!("retry {retry}; retry-after {delay}, original {original}{gives_up}{outputs}")
}

/// How long `--connect` waits for each broker and attach.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `--connect`: each broker of the config opened (and logged in to) once,
/// each mount's address attached without credit; a table of the results.
async fn connect_all(config: &Config) -> anyhow::Result<()> {
    // Mounts grouped by the broker they use, in the config's order.
    let mut brokers: Vec<(&Broker, Vec<(&Tenant, &Mount)>)> = Vec::new();
    for (tenant, mount) in config.mounts() {
        let broker = tenant.broker.as_ref().unwrap_or(&config.broker);
        match brokers.iter_mut().find(|(b, _)| *b == broker) {
            Some((_, mounts)) => mounts.push((tenant, mount)),
            None => brokers.push((broker, vec![(tenant, mount)])),
        }
    }
    let mut rows = Vec::new();
    for (broker, mounts) in brokers {
        let url = broker.urls.first().context("the broker names no URL")?;
        let endpoint = Endpoint::parse(url).map_err(anyhow::Error::msg)?;
        let mut connect = ConnectOptions::of(broker);
        connect.container_id = format!("wharf-check-{}", std::process::id());
        connect.connect_timeout = connect.connect_timeout.min(CONNECT_TIMEOUT);
        let targets: Vec<ProbeTarget> = mounts
            .iter()
            .map(|(_, m)| ProbeTarget {
                address: &m.address,
                capability: m.node.map(wharf_core::config::Node::capability),
                topic: m.subscription.is_some(),
            })
            .collect();
        let probed = wharf::broker::probe(&endpoint, &connect, &targets, CONNECT_TIMEOUT).await;
        let results: Vec<Result<String, String>> = match probed {
            Ok((offers, results)) => {
                let product = offers.product.as_deref().unwrap_or("an unnamed broker");
                let version = offers.version.as_deref().unwrap_or("");
                let ok = format!("ok ({product} {version})").replace(" )", ")");
                results
                    .into_iter()
                    .zip(&mounts)
                    .map(|(r, (_, mount))| {
                        r.map(|links| format!("{ok}: {}", chosen(mount, &offers, links)))
                    })
                    .collect()
            }
            Err(e) => {
                let why = wharf_core::words::with_causes(&e);
                mounts.iter().map(|_| Err(why.clone())).collect()
            }
        };
        for ((tenant, mount), result) in mounts.iter().zip(results) {
            let refused = result.is_err();
            rows.push((
                [
                    format!("{}/{}", tenant.name, mount.name),
                    endpoint.to_string(),
                    format!("`{}`", mount.address),
                    result.unwrap_or_else(|why| format!("refused: {why}")),
                ],
                refused,
            ));
        }
    }
    let titles = ["mount", "broker", "address", "result"];
    let widths: Vec<usize> = (0..3)
        .map(|i| {
            rows.iter()
                .map(|(row, _)| row[i].len())
                .fold(titles[i].len(), usize::max)
        })
        .collect();
    let line = |cells: [&str; 4]| {
        let padded: Vec<String> = (0..3)
            .map(|i| format!("{:width$}", cells[i], width = widths[i]))
            .collect();
        println!("  {}  {}", padded.join("  "), cells[3]);
    };
    println!();
    line(titles);
    for (row, _) in &rows {
        line([&row[0], &row[1], &row[2], &row[3]]);
    }
    let refused = rows.iter().filter(|(_, refused)| *refused).count();
    anyhow::ensure!(
        refused == 0,
        "{refused} of {} mount(s) cannot attach (see the table above)",
        rows.len()
    );
    Ok(())
}
