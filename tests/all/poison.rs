//! A poison message on every broker: the handler retries every time, and
//! the attempt limit must still hold on whichever retry path the queue takes.

use std::collections::BTreeMap;

use wharf::events::Event;
use wharf_core::brokers::QueueKind;
use wharf_core::settlement::{Disposition, Publish, RetryPath};

use crate::client::{Client, TestMessage};
use crate::{MountToml, TestHost, unique};

/// Takes `n` messages off `address` and returns their ids.
pub(crate) async fn take(
    client: &mut Client,
    address: &str,
    n: usize,
) -> anyhow::Result<Vec<String>> {
    let mut watch = client.watch(address).await?;
    let mut ids = Vec::new();
    while ids.len() < n {
        let (_, message) = watch.next().await?;
        ids.push(message.message_id().unwrap_or_default());
    }
    watch.close().await;
    Ok(ids)
}

/// The mount's queue kind and retry path, as it attached.
pub(crate) async fn attached(
    host: &mut TestHost,
) -> anyhow::Result<(Option<QueueKind>, RetryPath)> {
    host.next(|e| match e {
        Event::MountReady { queue, retry, .. } => Some((queue.clone(), *retry)),
        _ => None,
    })
    .await
}

/// Five messages whose handler always retries, on `address` of the broker
/// at `url` with three attempts and the dead-letter address `dla`: every
/// one must be handled exactly at attempts 1, 2 and 3 and then be
/// dead-lettered, which the test reads back from `dla_source` (`dla` itself
/// unless that is an exchange). Prints the handler calls it took.
pub(crate) async fn poison_on(
    url: &str,
    address: &str,
    dla: &str,
    dla_source: &str,
    label: &str,
) -> anyhow::Result<(Option<QueueKind>, RetryPath)> {
    let url = url.to_owned();
    let mount = MountToml::new("m", "fixture_script", address)
        .with("max_attempts = 3")
        .with(&format!("dead_letter = \"{dla}\""));
    let mut host = TestHost::start(&url, &[mount]).await?;
    let kind = attached(&mut host).await?;
    let mut client = Client::connect(&url).await?;
    let ids: Vec<String> = (0..5)
        .map(|n| format!("{}.{n}", unique("poison")))
        .collect();
    client
        .publish_many(
            address,
            ids.iter()
                .map(|id| TestMessage::new(id, "x").script("*:retry").build()),
        )
        .await?;
    // A copy is on the queue before its original is settled, so a later
    // attempt may be reported first: read all fifteen calls, then check.
    let mut attempts: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut dead_lettered = 0;
    let calls = 3 * ids.len();
    for _ in 0..calls {
        let handled = host
            .next(|e| match e {
                Event::Handled(h) => Some(h.clone()),
                _ => None,
            })
            .await?;
        let id = handled.message_id.clone().unwrap_or_default();
        attempts.entry(id).or_default().push(handled.attempt);
        if handled.plan.publish() == Some(Publish::DeadLetter)
            && handled.disposition == Some(Disposition::Accepted)
        {
            dead_lettered += 1;
        }
    }
    for (id, seen) in &attempts {
        let mut seen = seen.clone();
        seen.sort_unstable();
        assert_eq!(seen, [1, 2, 3], "{label}: {id}");
    }
    assert_eq!(dead_lettered, ids.len(), "{label}: {attempts:?}");
    let on_dla = take(&mut client, dla_source, ids.len()).await?;
    // By now a sixteenth call would have shown.
    assert!(
        !host.seen(|e| matches!(e, Event::Handled(_))),
        "{label}: more than {calls} handler calls"
    );
    println!(
        "{label}: {calls} handler calls for 5 poison messages, {} dead-lettered at attempt 3 (retry path {:?})",
        on_dla.len(),
        kind.1
    );
    host.stop().await?;
    client.close().await;
    Ok(kind)
}
