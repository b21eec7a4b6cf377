//! What publishers can make the host hold: peak resident memory of the
//! `wharf` process (`VmHWM`) while
//!
//! - `large`: 10 mounts of one tenant each find 4 messages of 16 MiB
//!   waiting, handled slowly (2 s each);
//! - `held`: one mount on the held delay path (RabbitMQ 4) receives 200 messages a
//!   second of 64 KiB for a minute, each answered `retry-after(1h)`.
//!
//! `cargo bench -p wharf-tests --bench memory` (Artemis and RabbitMQ 4 running, guests
//! built). `WHARF_BIN=/path/to/wharf` measures another build of the host;
//! `WHARF_BENCH_SECONDS` shortens the `held` run.

use std::time::{Duration, Instant};

use wharf_tests::client::{Client, TestMessage};
use wharf_tests::process::{WharfProcess, peak_resident};
use wharf_tests::{MountToml, artemis_url, config_text, rabbitmq4_url, unique};

const MIB: f64 = (1 << 20) as f64;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if only.as_deref().is_none_or(|o| o == "large") {
        large().await?;
    }
    if only.as_deref().is_none_or(|o| o == "held") {
        held().await?;
    }
    Ok(())
}

async fn large() -> anyhow::Result<()> {
    const MOUNTS: usize = 10;
    const EACH: usize = 4;
    const SIZE: usize = 16 << 20;
    let url = artemis_url();
    let mut client = Client::connect(&url).await?;
    let body = "x".repeat(SIZE - 1024);
    let mut mounts = Vec::new();
    for m in 0..MOUNTS {
        let q = unique("memory.large");
        let messages = (0..EACH).map(|i| {
            TestMessage::new(&format!("{q}.{i}"), &body)
                .script("*:busy=2000")
                .build()
        });
        client.publish_many(&q, messages).await?;
        mounts.push(
            MountToml::new(&format!("m{m}"), "fixture_script", &q)
                .with("max_message_size = \"17MiB\"")
                .with("[tenant.mount.grants]\nclocks = true"),
        );
    }
    let started = Instant::now();
    let mut wharf = WharfProcess::start_config(&config_text(&url, &mounts)).await?;
    wharf
        .count_log("\"message\":\"handled\"", MOUNTS * EACH)
        .await?;
    let peak = peak_resident(&wharf)?;
    println!(
        "large: {MOUNTS} mounts x {EACH} messages of {} MiB ({:.0} MiB in all) handled in {:?}: peak resident {:.0} MiB",
        SIZE >> 20,
        (MOUNTS * EACH * SIZE) as f64 / MIB,
        started.elapsed(),
        peak as f64 / MIB
    );
    client.close().await;
    Ok(())
}

async fn held() -> anyhow::Result<()> {
    const RATE: u64 = 200;
    let seconds: u64 = std::env::var("WHARF_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    // On RabbitMQ: Artemis stops paging messages in while many are
    // unsettled, which would hide what the host itself holds.
    let url = rabbitmq4_url();
    let q = unique("memory.held");
    let mount = MountToml::new("m", "fixture_script", &q).with("delay = \"held\"");
    let body = "x".repeat(64 * 1024);
    let mut wharf = WharfProcess::start_config(&config_text(&url, &[mount])).await?;
    let _log = wharf.collect_handled();
    let mut client = Client::connect(&url).await?;
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let due = started + Duration::from_millis(sent * 1000 / RATE);
        tokio::time::sleep_until(due.into()).await;
        let batch = (0..RATE / 10).map(|i| {
            TestMessage::new(&format!("{q}.{sent}.{i}"), &body)
                .script("*:after=3600000")
                .build()
        });
        client.publish_many(&q, batch).await?;
        sent += RATE / 10;
    }
    let peak = peak_resident(&wharf)?;
    println!(
        "held (RabbitMQ 4): {sent} messages of 64 KiB at {RATE}/s for {seconds} s, each retry-after(1h) on the held path: peak resident {:.0} MiB",
        peak as f64 / MIB
    );
    client.close().await;
    Ok(())
}
