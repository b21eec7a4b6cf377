//! A tenant's service beside each hostile handler of the test fixtures on
//! one `wharf` process: its throughput draining a backlog and its latency
//! at a steady rate, against the same tenant alone in the same run.
//!
//! `cargo bench -p wharf-tests --bench hostile [-- WORD...]` (brokers
//! running, guests built: `scripts/test` does both); words pick the loads
//! whose name has one. Each load is measured `WHARF_BENCH_ROUNDS` times
//! (default 3), alone then beside, and the medians of the ratios close
//! the report.

use std::time::Duration;

use wharf_tests::neighbour::{HostileLoad, NeighbourFigures, neighbour_beside};

fn load(name: &'static str, script: &str, mount: &[&str], tenant: &[&str]) -> HostileLoad {
    HostileLoad {
        name,
        script: script.to_owned(),
        mount: mount.iter().map(|line| (*line).to_owned()).collect(),
        tenant: tenant.iter().map(|line| (*line).to_owned()).collect(),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Accepts connections and holds them open without answering.
async fn silent_server() -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    Ok(port)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let silent = silent_server().await?;
    let silent_grant = format!("http = [\"http://127.0.0.1:{silent}\"]");
    let loads = [
        load(
            "short busy handlers (1 ms each, 16 at once)",
            "*:busy=1",
            &["concurrency = 16", "[tenant.mount.grants]", "clocks = true"],
            &[],
        ),
        // The same, held to a fifth of a core: the bound to set for a
        // tenant on a host whose cores the broker shares.
        load(
            "short busy handlers held to max_cpu = 0.2",
            "*:busy=1",
            &["concurrency = 16", "[tenant.mount.grants]", "clocks = true"],
            &["max_cpu = 0.2"],
        ),
        // The broker traffic of a busy tenant without its CPU: what the
        // neighbour loses to the deliveries themselves (the broker's and
        // the host's work for them), which no CPU turn covers.
        load(
            "acking as fast as delivered (no handler CPU)",
            "*:ack",
            &["concurrency = 16"],
            &[],
        ),
        // The same, held to 500 deliveries a second.
        load(
            "acking, held to max_rate = 500",
            "*:ack",
            &["concurrency = 16"],
            &["max_rate = 500"],
        ),
        load(
            "header maps in a loop",
            "*:fields",
            &[
                "concurrency = 8",
                "[tenant.mount.grants]",
                "http = [\"http://127.0.0.1:9\"]",
            ],
            &[],
        ),
        load(
            "logging 256 KiB at error",
            "*:shout=262144",
            &["concurrency = 8"],
            &[],
        ),
        load(
            "opening connections without waiting",
            &format!("*:open=40=127.0.0.1:{silent}"),
            &[
                "concurrency = 8",
                "timeout = \"1s\"",
                "[tenant.mount.grants]",
                &silent_grant,
            ],
            &[],
        ),
    ];
    println!(
        "| hostile tenant | neighbour deliveries/s | ratio | p50 ms | p99 ms | p99 ratio | hostile deliveries taken |"
    );
    println!("|---|---|---|---|---|---|---|");
    let row = |name: &str, figures: &NeighbourFigures, alone: &NeighbourFigures| {
        println!(
            "| {name} | {:.0} | {:.2} | {:.1} | {:.1} | {:.2} | {} |",
            figures.throughput,
            figures.throughput / alone.throughput,
            ms(figures.p50),
            ms(figures.p99),
            ms(figures.p99) / ms(alone.p99),
            figures.hostile_taken,
        );
    };
    // `cargo bench ... -- busy` runs only the loads whose name has `busy`.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let rounds: usize = std::env::var("WHARF_BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3)
        .max(1);
    let mut medians = Vec::new();
    for load in loads
        .iter()
        .filter(|l| only.is_empty() || only.iter().any(|o| l.name.contains(o.as_str())))
    {
        let mut ratios = Vec::new();
        for _ in 0..rounds {
            // The baseline beside each, so drift in the machine's load hits
            // both.
            let alone = neighbour_beside(None).await?;
            let beside = neighbour_beside(Some(load)).await?;
            row("none", &alone, &alone);
            row(load.name, &beside, &alone);
            ratios.push((
                beside.throughput / alone.throughput,
                ms(beside.p99) / ms(alone.p99),
            ));
        }
        medians.push((
            load.name,
            median(ratios.iter().map(|r| r.0)),
            median(ratios.iter().map(|r| r.1)),
        ));
    }
    println!("\n| hostile tenant | median throughput ratio | median p99 ratio |");
    println!("|---|---|---|");
    for (name, throughput, p99) in medians {
        println!("| {name} | {throughput:.2} | {p99:.2} |");
    }
    Ok(())
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
