//! KEDA `ScaledObject`s made from the config, so the triggers are the
//! mounts' queues and cannot drift from them: one trigger per queue a
//! mount on the host's broker consumes, summed by a formula (each pod
//! serves every tenant, so every tenant's backlog adds replicas), with the
//! keys KEDA's scalers read and a fallback.

use serde_json::{Value, json};
use wharf_core::address::decode_strictly;
use wharf_core::config::{Config, Mount, Node};

/// Which scaler reads the backlog, and how it reaches the broker's
/// management API.
#[derive(Debug, Clone)]
pub enum Scaler {
    /// KEDA's `artemis-queue` over Jolokia: per queue, its default request
    /// (`MessageCount`) less a second reading `ScheduledCount`, so delayed
    /// copies are not backlog. Jolokia must allow the request's Origin,
    /// `http://` and the management endpoint.
    Artemis {
        /// `host:port` of the web console.
        management_endpoint: String,
        /// The broker's name (`<name>` in `broker.xml`).
        broker_name: String,
    },
    /// KEDA's `rabbitmq` over the management API, counting only messages
    /// ready to be delivered (what wharf holds unsettled is not backlog);
    /// the host comes from the `TriggerAuthentication`.
    RabbitMq,
}

/// What the generated object says besides its triggers.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    /// The Deployment scaled (and the object's name).
    pub deployment: String,
    /// The `TriggerAuthentication` every trigger uses.
    pub authentication: String,
    /// Backlog per replica the HPA aims at.
    pub target: u32,
    /// Fewest replicas (also the fallback's).
    pub min_replicas: u32,
    /// Most replicas.
    pub max_replicas: u32,
}

/// The `ScaledObject` for `config`'s mounts, and for each mount left out,
/// why.
pub fn scaled_object(
    config: &Config,
    scaler: &Scaler,
    options: &ScaleOptions,
) -> (Value, Vec<String>) {
    let mut triggers = Vec::new();
    // What each queue adds to the formula.
    let mut terms = Vec::new();
    let mut left_out = Vec::new();
    for (tenant, mount) in config.mounts() {
        let here = format!("tenant `{}`, mount `{}`", tenant.name, mount.name);
        if tenant.broker.is_some() {
            left_out.push(format!(
                "{here}: on the tenant's own broker, whose management API this object does not reach"
            ));
            continue;
        }
        let name = format!("q{}", terms.len());
        match (scaler, queue_of(scaler, mount)) {
            (_, Err(why)) => left_out.push(format!("{here}: {why}")),
            (
                Scaler::Artemis {
                    management_endpoint,
                    broker_name,
                },
                Ok((address, queue)),
            ) => {
                let authentication = json!({ "name": options.authentication });
                triggers.push(json!({
                    "type": "artemis-queue",
                    "name": name,
                    "metadata": {
                        "managementEndpoint": management_endpoint,
                        "brokerName": broker_name,
                        "brokerAddress": address,
                        "queueName": queue,
                        "queueLength": options.target.to_string(),
                    },
                    "authenticationRef": authentication,
                }));
                // MessageCount counts scheduled messages (wharf's delayed
                // retry copies): a second trigger reads ScheduledCount,
                // subtracted in the formula.
                let template = format!(
                    "http://{management_endpoint}/console/jolokia/read/org.apache.activemq.artemis:broker=\"{broker_name}\",component=addresses,address=\"{address}\",subcomponent=queues,routing-type=\"anycast\",queue=\"{queue}\"/ScheduledCount"
                );
                triggers.push(json!({
                    "type": "artemis-queue",
                    "name": format!("{name}s"),
                    "metadata": {
                        "restApiTemplate": template,
                        "queueLength": options.target.to_string(),
                    },
                    "authenticationRef": authentication,
                }));
                terms.push(format!("({name} - {name}s)"));
            }
            (Scaler::RabbitMq, Ok((_, queue))) => {
                triggers.push(json!({
                    "type": "rabbitmq",
                    "name": name,
                    "metadata": {
                        "protocol": "http",
                        "queueName": queue,
                        "mode": "QueueLength",
                        "value": options.target.to_string(),
                        "excludeUnacknowledged": "true",
                    },
                    "authenticationRef": { "name": options.authentication },
                }));
                terms.push(name);
            }
        }
    }
    let formula = terms.join(" + ");
    let object = json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": { "name": options.deployment },
        "spec": {
            "scaleTargetRef": { "name": options.deployment },
            "minReplicaCount": options.min_replicas,
            "maxReplicaCount": options.max_replicas,
            // The management API unreachable: hold at the minimum rather
            // than scale on a guess.
            "fallback": { "failureThreshold": 3, "replicas": options.min_replicas },
            "advanced": {
                "scalingModifiers": {
                    "formula": formula,
                    "target": options.target.to_string(),
                    "metricType": "AverageValue",
                },
            },
            "triggers": triggers,
        },
    });
    (object, left_out)
}

/// The address and queue whose backlog a mount consumes, as the scaler
/// names them.
fn queue_of(scaler: &Scaler, mount: &Mount) -> Result<(String, String), String> {
    if mount.subscription.is_some() || mount.node == Some(Node::Topic) {
        return Err("a topic mount: its subscription queue is the broker's to name".to_owned());
    }
    let address = mount.address.as_str();
    match scaler {
        Scaler::Artemis { .. } => {
            let address = address.strip_prefix("queue://").unwrap_or(address);
            let (address, queue) = address.split_once("::").unwrap_or((address, address));
            // KEDA finds the names in its request by splitting on `:`, `,`,
            // `=` and `&`, and Jolokia reads `!`, `/` and `"` in them as
            // escapes: only plain names survive both.
            let plain = |name: &str| {
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            };
            if plain(address) && plain(queue) {
                Ok((address.to_owned(), queue.to_owned()))
            } else {
                Err(format!(
                    "`{address}::{queue}` has characters KEDA's Jolokia request cannot carry (only letters, digits, `.`, `_` and `-`)"
                ))
            }
        }
        Scaler::RabbitMq => {
            let queue = match address.strip_prefix('/') {
                None => Some(address.to_owned()),
                Some(path) => match path.split('/').collect::<Vec<_>>().as_slice() {
                    ["queues", queue] => decode_strictly(queue),
                    ["queue", queue] | ["amq", "queue", queue] => Some((*queue).to_owned()),
                    _ => None,
                },
            };
            queue
                .filter(|queue| !queue.is_empty())
                .map(|queue| (address.to_owned(), queue))
                .ok_or_else(|| {
                    format!("`{address}` is not a queue (an exchange's backlog is its queues')")
                })
        }
    }
}
