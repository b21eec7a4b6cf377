//! Every vector of the settlement contract on Apache Artemis, observed on
//! the broker: what is left on the queue, what reached the dead-letter
//! address, what copies were published, and what the broker redelivered.
//!
//! Each vector is one row: the mount's settings, the message published,
//! what the host reports for each delivery of it, and what the broker shows
//! afterwards. One runner publishes, waits and checks every row.
//!
//! Artemis notes the assertions rely on (measured on 2.40): a message
//! without a header arrives without one; a publisher-set `delivery-count`
//! is delivered as is the first time, but after `modified` the broker sends
//! its own count (1, 2, ...); `rejected` moves the message to the broker's
//! dead-letter address (`DLQ`, queue `DLQ.<address>` in the test broker).

use std::time::{Duration, Instant};

use wharf::events::{Event, Handled};
use wharf_core::settlement::{DelayPath, Disposition, Outcome, Publish};

use crate::client::{Client, TestMessage, Watcher, body_text, message_id, retry_count};
use crate::{
    MountToml, TestHost, artemis_url, assert_failed, start_with_client, unique, wait_for_count,
};

const SCRIPT: &str = "fixture_script";

/// The queue where the test broker's own dead-letter policy puts messages
/// rejected on `address`.
fn broker_dlq(address: &str) -> String {
    format!("DLQ.{address}")
}

/// Polls the broker until `queue` holds `expected` messages.
async fn assert_count(client: &mut Client, queue: &str, expected: u64) -> anyhow::Result<()> {
    wait_for_count(queue, expected, async || client.artemis_count(queue).await).await
}

/// Starts a host with one mount `m` on `address`, connects a client.
pub(crate) async fn setup(address: &str, extra: &[&str]) -> anyhow::Result<(TestHost, Client)> {
    let mut mount = MountToml::new("m", SCRIPT, address);
    for line in extra {
        mount = mount.with(line);
    }
    let url = artemis_url();
    start_with_client(&url, &[mount]).await
}

/// Asserts that `address`'s queue and the broker's dead-letter queue for it
/// are both empty once the host has stopped.
pub(crate) async fn assert_gone(client: &mut Client, address: &str) -> anyhow::Result<()> {
    assert_count(client, address, 0).await?;
    assert_count(client, &broker_dlq(address), 0).await
}

/// Asserts `got` is `sent` as published: the dead-letter address receives
/// the delivery exactly as it arrived.
fn assert_same_message(got: &wharf_core::message::AmqpMessage, sent: &TestMessage) {
    let sent = sent.build();
    assert_eq!(got.header, sent.header, "header");
    assert_eq!(got.properties, sent.properties, "properties");
    assert_eq!(
        got.application_properties, sent.application_properties,
        "application properties"
    );
    assert_eq!(got.body, sent.body, "body");
}

/// One vector of the contract and what Artemis must show for it.
struct Vector {
    /// Prefix of the unique address; `fanout.` addresses are topics on the
    /// test broker, watched from before the publish.
    address: &'static str,
    /// The mount's settings besides its address; a `dead_letter` address
    /// is added when the row expects [`OnBroker::DeadLetterAddress`].
    mount: &'static [&'static str],
    /// The message, built on one whose id is the address.
    message: fn(TestMessage) -> TestMessage,
    /// What the host reports for each delivery of the message, by the
    /// attempt the handler saw (deliveries of the same attempt in the order
    /// they were handled: a copy may be handled before the delivery it was
    /// copied from has reported).
    handled: &'static [(u32, &'static [Check])],
    /// What the broker shows afterwards.
    on_broker: OnBroker,
}

/// One fact about a handled delivery.
enum Check {
    Outcome(Outcome),
    Disposition(Option<Disposition>),
    Publish(Option<Publish>),
    /// Whether the plan's disposition was one at-most-once cannot send.
    Unsupported(bool),
    /// The broker's own delivery count.
    DeliveryCount(u32),
    DeliveryCountAtLeast(u32),
    /// The handler failed for a reason that mentions this.
    Failed(&'static str),
}

impl Check {
    fn assert(&self, handled: &Handled) {
        let h = handled;
        match *self {
            Check::Outcome(o) => assert_eq!(h.outcome, o, "outcome: {h:?}"),
            Check::Disposition(d) => assert_eq!(h.disposition, d, "disposition: {h:?}"),
            Check::Publish(p) => assert_eq!(h.plan.publish(), p, "publish: {h:?}"),
            Check::Unsupported(u) => assert_eq!(h.plan.unsupported(), u, "unsupported: {h:?}"),
            Check::DeliveryCount(n) => {
                assert_eq!(h.counters.delivery_count, Some(n), "delivery count: {h:?}");
            }
            Check::DeliveryCountAtLeast(n) => {
                assert!(
                    h.counters.delivery_count >= Some(n),
                    "delivery count: {h:?}"
                );
            }
            Check::Failed(reason) => assert_failed(h, reason),
        }
    }
}

/// What the broker shows once the deliveries are handled.
enum OnBroker {
    /// Nothing left: the queue and the broker's dead-letter queue are
    /// empty once the host has stopped.
    Nothing,
    /// The queue is empty and the broker's dead-letter queue holds the
    /// message.
    BrokerDeadLettered,
    /// The mount's dead-letter address holds the message exactly as it
    /// arrived, and nothing is left elsewhere.
    DeadLetterAddress,
    /// The topic carried the message as published, then these copies in
    /// order; with `then_nothing`, nothing else.
    Carried {
        copies: &'static [Copy],
        then_nothing: bool,
    },
    /// Not looked at: the vector is about the host's plan, and the broker
    /// is still redelivering when the host stops.
    NotObserved,
}

/// A copy the host published to the topic.
struct Copy {
    /// Whether the copy keeps the original's header (durable, with the
    /// count at zero) or has none.
    keeps_header: bool,
    retry_count: u32,
    /// How long after the publish it arrives at the earliest.
    not_before: Duration,
}

const ONE_SECOND: Duration = Duration::from_secs(1);
const TWO_SECONDS: Duration = Duration::from_secs(2);

/// Runs one row: publishes its message to a fresh mount, checks each
/// handled delivery, then what the broker shows.
async fn run(vector: Vector) -> anyhow::Result<()> {
    let q = unique(vector.address);
    let dla = format!("{q}.dla");
    let dla_line = format!("dead_letter = \"{dla}\"");
    let mut mount = vector.mount.to_vec();
    if matches!(vector.on_broker, OnBroker::DeadLetterAddress) {
        mount.push(&dla_line);
    }
    let (mut host, mut client) = setup(&q, &mount).await?;
    // Artemis takes `modified`: every mount says so when it is ready.
    assert!(host.seen(|e| matches!(
        e,
        Event::MountReady {
            modified_supported: true,
            ..
        }
    )));
    let mut watch = match vector.on_broker {
        OnBroker::Carried { .. } => Some(client.watch(&q).await?),
        _ => None,
    };
    let sent = (vector.message)(TestMessage::new(&q, "x"));
    let published = Instant::now();
    client.publish(&q, &sent).await?;
    let mut handled = Vec::with_capacity(vector.handled.len());
    while handled.len() < vector.handled.len() {
        handled.push(host.handled(&q).await?);
    }
    for (attempt, checks) in vector.handled {
        let Some(at) = handled.iter().position(|h| h.attempt == *attempt) else {
            panic!("no delivery with attempt {attempt}: {handled:?}");
        };
        let delivery = handled.remove(at);
        for check in *checks {
            check.assert(&delivery);
        }
    }
    if let (
        Some(watch),
        OnBroker::Carried {
            copies,
            then_nothing,
        },
    ) = (&mut watch, &vector.on_broker)
    {
        let (_, original) = watch.next_with_id(&q).await?;
        assert_same_message(&original, &sent);
        for expected in *copies {
            let (arrived, copy) = watch.next_with_id(&q).await?;
            let after = arrived - published;
            assert!(after >= expected.not_before, "copy after {after:?}");
            match (&copy.header, expected.keeps_header) {
                (Some(header), true) => {
                    assert!(header.durable);
                    assert_eq!(header.delivery_count, 0);
                }
                (None, false) => {}
                (header, _) => panic!("copy's header: {header:?}"),
            }
            assert_eq!(retry_count(&copy), Some(expected.retry_count));
            assert_eq!(body_text(&copy), "x");
        }
        if *then_nothing {
            assert_nothing_else_published(&mut client, watch, &q).await?;
        }
    }
    if let Some(watch) = watch {
        watch.close().await;
    }
    host.stop().await?;
    match vector.on_broker {
        OnBroker::Nothing => assert_gone(&mut client, &q).await?,
        OnBroker::BrokerDeadLettered => {
            assert_count(&mut client, &q, 0).await?;
            let mut dlq = client.watch(&format!("DLQ::{}", broker_dlq(&q))).await?;
            let (_, dead) = dlq.next_with_id(&q).await?;
            assert_eq!(body_text(&dead), "x");
            dlq.close().await;
        }
        OnBroker::DeadLetterAddress => {
            let mut dead = client.watch(&dla).await?;
            let (_, got) = dead.next_with_id(&q).await?;
            assert_same_message(&got, &sent);
            dead.close().await;
            assert_gone(&mut client, &q).await?;
        }
        OnBroker::Carried { .. } | OnBroker::NotObserved => {}
    }
    client.close().await;
    Ok(())
}

/// Publishes a sentinel and asserts it is the next message on the watched
/// address: nothing else was published in between.
async fn assert_nothing_else_published(
    client: &mut Client,
    watch: &mut Watcher,
    address: &str,
) -> anyhow::Result<()> {
    let sentinel = format!("{address}.sentinel");
    client
        .publish(address, TestMessage::new(&sentinel, "sentinel"))
        .await?;
    let (_, next) = watch.next().await?;
    assert_eq!(
        message_id(&next).as_deref(),
        Some(sentinel.as_str()),
        "unexpected message {next:?}"
    );
    Ok(())
}

#[tokio::test]
async fn vector_01_ack_is_accepted() -> anyhow::Result<()> {
    run(Vector {
        address: "v01",
        mount: &[],
        message: |m| m.header(0).script("*:ack"),
        handled: &[(
            1,
            &[
                Check::Outcome(Outcome::Ack),
                Check::Disposition(Some(Disposition::Accepted)),
            ],
        )],
        on_broker: OnBroker::Nothing,
    })
    .await
}

#[tokio::test]
async fn vector_02_drop_is_rejected_and_the_broker_dead_letters_it() -> anyhow::Result<()> {
    run(Vector {
        address: "v02",
        mount: &[],
        message: |m| m.header(0).script("*:drop"),
        handled: &[(1, &[Check::Disposition(Some(Disposition::Rejected))])],
        on_broker: OnBroker::BrokerDeadLettered,
    })
    .await
}

#[tokio::test]
async fn vector_03_retry_is_modified_and_the_broker_counts_it() -> anyhow::Result<()> {
    run(Vector {
        address: "v03",
        mount: &[],
        message: |m| m.header(7).script("8:retry *:ack"),
        handled: &[
            (8, &[Check::Disposition(Some(Disposition::Modified))]),
            // Back on the queue with the broker's count raised (Artemis
            // counts its own deliveries from 0, so the redelivery carries 1).
            (
                2,
                &[
                    Check::DeliveryCount(1),
                    Check::Disposition(Some(Disposition::Accepted)),
                ],
            ),
        ],
        on_broker: OnBroker::Nothing,
    })
    .await
}

#[tokio::test]
async fn vector_04_retry_below_the_limit_is_modified() -> anyhow::Result<()> {
    run(Vector {
        address: "v04",
        mount: &["max_attempts = 3"],
        message: |m| m.header(1).script("2:retry *:ack"),
        handled: &[
            (2, &[Check::Disposition(Some(Disposition::Modified))]),
            (2, &[Check::DeliveryCountAtLeast(1)]),
        ],
        on_broker: OnBroker::NotObserved,
    })
    .await
}

#[tokio::test]
async fn vector_05_retry_at_the_limit_without_dla_is_rejected() -> anyhow::Result<()> {
    run(Vector {
        address: "v05",
        mount: &["max_attempts = 3"],
        message: |m| m.header(2).script("3:retry"),
        handled: &[(3, &[Check::Disposition(Some(Disposition::Rejected))])],
        on_broker: OnBroker::BrokerDeadLettered,
    })
    .await
}

#[tokio::test]
async fn vector_06_retry_at_the_limit_goes_to_the_dla_as_it_arrived() -> anyhow::Result<()> {
    run(Vector {
        address: "v06",
        mount: &["max_attempts = 3"],
        message: |m| m.header(2).script("3:retry"),
        handled: &[(3, DEAD_LETTERED_AND_ACCEPTED)],
        on_broker: OnBroker::DeadLetterAddress,
    })
    .await
}

#[tokio::test]
async fn vector_07_a_dla_without_limit_takes_every_retry() -> anyhow::Result<()> {
    run(Vector {
        address: "v07",
        mount: &[],
        message: |m| m.header(0).script("*:retry"),
        handled: &[(1, &[Check::Disposition(Some(Disposition::Accepted))])],
        on_broker: OnBroker::DeadLetterAddress,
    })
    .await
}

#[tokio::test]
async fn vector_08_retry_after_rejects_then_publishes_a_copy_later() -> anyhow::Result<()> {
    run(Vector {
        address: "fanout.v08",
        mount: &[],
        message: |m| m.header(0).script("1:after=2000 *:ack"),
        handled: &[
            (1, &[Check::Disposition(Some(Disposition::Rejected))]),
            (2, &[Check::Disposition(Some(Disposition::Accepted))]),
        ],
        // The copy keeps the original's header (durable survives a broker
        // restart) with the count at zero: its retry count carries the
        // attempt.
        on_broker: OnBroker::Carried {
            copies: &[Copy {
                keeps_header: true,
                retry_count: 1,
                not_before: TWO_SECONDS,
            }],
            then_nothing: false,
        },
    })
    .await
}

#[tokio::test]
async fn vector_09_retry_of_a_copy_below_the_limit_copies_now_then_accepts() -> anyhow::Result<()> {
    run(Vector {
        address: "fanout.v09",
        mount: &["max_attempts = 3"],
        message: |m| m.retry_count(1).script("2:retry *:ack"),
        handled: &[
            (
                2,
                &[
                    Check::Publish(Some(Publish::Copy {
                        retry_count: 2,
                        delay: Duration::ZERO,
                        path: DelayPath::Scheduled,
                    })),
                    Check::Disposition(Some(Disposition::Accepted)),
                ],
            ),
            (3, &[]),
        ],
        on_broker: OnBroker::Carried {
            copies: &[Copy {
                keeps_header: false,
                retry_count: 2,
                not_before: Duration::ZERO,
            }],
            then_nothing: false,
        },
    })
    .await
}

#[tokio::test]
async fn vector_10_retry_after_at_the_limit_goes_to_the_dla() -> anyhow::Result<()> {
    run(Vector {
        address: "v10",
        mount: &["max_attempts = 3"],
        message: |m| m.retry_count(2).script("3:after=1000"),
        handled: &[(3, DEAD_LETTERED_AND_ACCEPTED)],
        on_broker: OnBroker::DeadLetterAddress,
    })
    .await
}

/// At the limit with a dead-letter address: the message is published
/// there and the original accepted.
const DEAD_LETTERED_AND_ACCEPTED: &[Check] = &[
    Check::Publish(Some(Publish::DeadLetter)),
    Check::Disposition(Some(Disposition::Accepted)),
];

/// At most once, `ack` and `drop` have no disposition to send and publish
/// nothing.
const UNSUPPORTED_AND_SILENT: &[(u32, &[Check])] = &[(
    1,
    &[
        Check::Unsupported(true),
        Check::Disposition(None),
        Check::Publish(None),
    ],
)];

#[tokio::test]
async fn vector_12_at_most_once_ack_is_unsupported_and_silent() -> anyhow::Result<()> {
    run(Vector {
        address: "fanout.v12-ack",
        mount: &["settle = \"at-most-once\""],
        message: |m| m.script("*:ack"),
        handled: UNSUPPORTED_AND_SILENT,
        on_broker: OnBroker::Carried {
            copies: &[],
            then_nothing: true,
        },
    })
    .await
}

#[tokio::test]
async fn vector_12_at_most_once_drop_is_unsupported_and_silent() -> anyhow::Result<()> {
    run(Vector {
        address: "fanout.v12-drop",
        mount: &["settle = \"at-most-once\""],
        message: |m| m.script("*:drop"),
        handled: UNSUPPORTED_AND_SILENT,
        on_broker: OnBroker::Carried {
            copies: &[],
            then_nothing: true,
        },
    })
    .await
}

#[tokio::test]
async fn vector_13_at_most_once_retry_with_a_broker_counter_makes_no_copy() -> anyhow::Result<()> {
    run(Vector {
        address: "fanout.v13",
        mount: &["settle = \"at-most-once\"", "max_attempts = 3"],
        message: |m| m.header(0).script("*:retry"),
        handled: &[(1, &[Check::Unsupported(true), Check::Publish(None)])],
        on_broker: OnBroker::Carried {
            copies: &[],
            then_nothing: true,
        },
    })
    .await
}

#[tokio::test]
async fn vector_14_at_most_once_retry_without_a_counter_copies_at_once() -> anyhow::Result<()> {
    run(Vector {
        address: "fanout.v14",
        mount: &["settle = \"at-most-once\"", "max_attempts = 3"],
        message: |m| m.script("1:retry *:ack"),
        handled: &[
            (
                1,
                &[
                    Check::Unsupported(true),
                    Check::Publish(Some(Publish::Copy {
                        retry_count: 1,
                        delay: Duration::ZERO,
                        path: DelayPath::Scheduled,
                    })),
                ],
            ),
            (2, &[]),
        ],
        on_broker: OnBroker::Carried {
            copies: &[Copy {
                keeps_header: false,
                retry_count: 1,
                not_before: Duration::ZERO,
            }],
            then_nothing: false,
        },
    })
    .await
}

#[tokio::test]
async fn vector_15_at_most_once_retry_after_copies_later() -> anyhow::Result<()> {
    run(Vector {
        address: "fanout.v15",
        mount: &["settle = \"at-most-once\""],
        message: |m| m.script("1:after=1000 *:ack"),
        handled: &[(1, &[Check::Unsupported(false)]), (2, &[])],
        on_broker: OnBroker::Carried {
            copies: &[Copy {
                keeps_header: false,
                retry_count: 1,
                not_before: ONE_SECOND,
            }],
            then_nothing: false,
        },
    })
    .await
}

#[tokio::test]
async fn vector_16_at_most_once_retry_at_the_limit_goes_to_the_dla() -> anyhow::Result<()> {
    run(Vector {
        address: "v16",
        mount: &["settle = \"at-most-once\"", "max_attempts = 2"],
        message: |m| m.retry_count(1).script("2:retry"),
        handled: &[(2, &[Check::Publish(Some(Publish::DeadLetter))])],
        on_broker: OnBroker::DeadLetterAddress,
    })
    .await
}

#[tokio::test]
async fn vector_17_a_trapping_handler_is_retried_with_modified() -> anyhow::Result<()> {
    run(Vector {
        address: "v17",
        mount: &["max_attempts = 3"],
        message: |m| m.header(0).script("1:trap *:ack"),
        handled: &[
            (
                1,
                &[
                    Check::Failed("trapped"),
                    Check::Outcome(Outcome::Retry),
                    Check::Disposition(Some(Disposition::Modified)),
                ],
            ),
            (
                2,
                &[
                    Check::DeliveryCount(1),
                    Check::Disposition(Some(Disposition::Accepted)),
                ],
            ),
        ],
        on_broker: OnBroker::Nothing,
    })
    .await
}

/// With the contract's `rejected`, Artemis' dead-letter policy would hold
/// the original too.
#[tokio::test]
async fn retry_after_may_accept_the_original_so_nothing_reaches_the_dlq() -> anyhow::Result<()> {
    run(Vector {
        address: "after-accepted",
        mount: &["retry_after_original = \"accepted\""],
        message: |m| m.header(0).script("1:after=500 *:ack"),
        handled: &[
            (1, &[Check::Disposition(Some(Disposition::Accepted))]),
            (2, &[Check::Disposition(Some(Disposition::Accepted))]),
        ],
        on_broker: OnBroker::Nothing,
    })
    .await
}

#[tokio::test]
async fn node_queue_asks_the_broker_for_a_queue() -> anyhow::Result<()> {
    // `fanout.*` addresses are topics by the test broker's defaults; a mount
    // that says `node = "queue"` gets a queue there instead.
    let plain = unique("fanout.node-default");
    let queue = unique("fanout.node-queue");
    let url = artemis_url();
    let mounts = [
        MountToml::new("plain", SCRIPT, &plain),
        MountToml::new("queue", SCRIPT, &queue).with("node = \"queue\""),
    ];
    let (host, mut client) = start_with_client(&url, &mounts).await?;
    let plain_types = client.artemis_routing_types(&plain).await?;
    assert!(
        plain_types.contains("MULTICAST") && !plain_types.contains("ANYCAST"),
        "{plain_types}"
    );
    let queue_types = client.artemis_routing_types(&queue).await?;
    assert!(
        queue_types.contains("ANYCAST") && !queue_types.contains("MULTICAST"),
        "{queue_types}"
    );
    host.stop().await?;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn a_poison_message_reaches_its_limit_on_artemis() -> anyhow::Result<()> {
    let (q, dla) = (unique("poison"), unique("poison-dla"));
    crate::poison::poison_on(&artemis_url(), &q, &dla, &dla, "Artemis").await?;
    Ok(())
}
