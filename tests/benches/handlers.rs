//! What a delivery costs in each guest language, with a fresh instance per
//! delivery and with instance reuse, in the real sandbox (no broker): the
//! `flaky` example built for every language, acking one small message.
//! Costs are also given as ratios to Rust's fresh-instance cost measured in
//! the same run.
//!
//! `cargo bench -p wharf-tests --bench handlers` (guests built first:
//! `scripts/build-guests`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use wharf::sandbox::{Delivery, Instances, Outcome};
use wharf_core::config::InstancePolicy;
use wharf_tests::sandbox::{KEEP, instances, ok_delivery, sandbox};

/// The example handlers, by language.
const GUESTS: &[(&str, &str)] = &[
    ("Rust (`ack`)", "ack"),
    ("Rust", "flaky"),
    ("C", "flaky_c"),
    ("Go", "flaky_go"),
    ("JavaScript (StarlingMonkey)", "flaky_js"),
    ("JavaScript (QuickJS)", "flaky_js_qjs"),
    ("Python", "flaky_python"),
];

/// Deliveries per measurement: as many as fit this long, at least
/// `MIN_DELIVERIES`.
const MEASURE_FOR: Duration = Duration::from_secs(1);
const MIN_DELIVERIES: usize = 50;

struct Row {
    language: &'static str,
    size: u64,
    compile: Duration,
    fresh: Costs,
    reused: Costs,
}

/// The cost of one delivery: median and mean.
#[derive(Clone, Copy)]
struct Costs {
    p50: Duration,
    mean: Duration,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut rows = Vec::new();
    for &(language, name) in GUESTS {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let path = wharf_tests::repo_root()
            .join("build/guests")
            .join(format!("{name}.wasm"));
        if !path.is_file() {
            eprintln!("skipping {language}: {} is not built", path.display());
            continue;
        }
        // A sandbox per language, so each compile is cold.
        let sandbox = sandbox(16)?;
        let started = Instant::now();
        let module = sandbox.load(&path)?;
        let compile = started.elapsed();
        let instances = |policy| instances(&sandbox, &module, name, policy);
        // A handler that fails is a finding to report, not a reason to
        // leave the other languages unmeasured.
        let measured = async {
            let fresh = per_delivery(&instances(InstancePolicy::PerDelivery)).await?;
            anyhow::Ok((fresh, per_delivery(&instances(KEEP)).await?))
        };
        let (fresh, reused) = match measured.await {
            Ok(costs) => costs,
            Err(e) => {
                let error = format!("{e:#}");
                println!("{language}: {}", error.lines().next().unwrap_or_default());
                continue;
            }
        };
        rows.push(Row {
            language,
            size: std::fs::metadata(&path)?.len(),
            compile,
            fresh,
            reused,
        });
    }
    let baseline = rows
        .first()
        .map_or(Duration::from_micros(1), |row| row.fresh.p50)
        .as_secs_f64();
    println!(
        "| language | component | compile (cold) | fresh instance, p50 (mean) | reused, p50 (mean) | fresh vs first row |"
    );
    println!("|---|---|---|---|---|---|");
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    for row in rows {
        println!(
            "| {} | {:.0} KB | {:.0} ms | {:.1} µs ({:.1}) | {:.1} µs ({:.1}) | {:.1}× |",
            row.language,
            row.size as f64 / 1000.0,
            row.compile.as_secs_f64() * 1e3,
            micros(row.fresh.p50),
            micros(row.fresh.mean),
            micros(row.reused.p50),
            micros(row.reused.mean),
            row.fresh.p50.as_secs_f64() / baseline
        );
    }
    Ok(())
}

/// The cost of one delivery (reserve, instantiate when fresh, call,
/// drop), after a warm-up delivery.
async fn per_delivery(instances: &Arc<Instances>) -> anyhow::Result<Costs> {
    let delivery = ok_delivery();
    call(instances, &delivery).await?;
    let mut times = Vec::new();
    let started = Instant::now();
    while times.len() < MIN_DELIVERIES || started.elapsed() < MEASURE_FOR {
        let call_started = Instant::now();
        call(instances, &delivery)
            .await
            .map_err(|e| e.context(format!("delivery {} of the measurement", times.len() + 1)))?;
        times.push(call_started.elapsed());
    }
    let mean = times.iter().sum::<Duration>() / u32::try_from(times.len()).unwrap_or(u32::MAX);
    times.sort();
    Ok(Costs {
        p50: times[times.len() / 2],
        mean,
    })
}

async fn call(instances: &Arc<Instances>, delivery: &Delivery) -> anyhow::Result<()> {
    let result = instances
        .reserve()
        .await
        .call(delivery, wharf_core::brokers::BrokerKind::Other)
        .await
        .result;
    match result {
        Ok(Outcome::Ack) => Ok(()),
        other => anyhow::bail!("expected ack, got {other:?}"),
    }
}
