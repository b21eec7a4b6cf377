//! A tenant's service beside each hostile handler of the test fixtures on
//! one `wharf` process: its throughput draining a backlog and its latency
//! at a steady rate, against the same tenant alone in the same run.
//!
//! `cargo bench -p wharf-tests --bench hostile [-- WORD...]` (brokers
//! running, guests built: `scripts/test` does both); words pick the loads
//! whose name has one. Each load is measured `WHARF_BENCH_ROUNDS` times
//! (default 3), alone and beside in turns, and the medians close the
//! report.

use std::time::Duration;

use wharf_tests::bench::{self, median, median_ratio};
use wharf_tests::neighbour::{HostileLoad, NeighbourFigures, neighbour_beside};

fn load(name: &'static str, script: &str, mount: &[&str], tenant: &[&str]) -> HostileLoad {
    HostileLoad {
        name,
        script: script.to_owned(),
        mount: mount.iter().map(|line| (*line).to_owned()).collect(),
        tenant: tenant.iter().map(|line| (*line).to_owned()).collect(),
    }
}

/// The neighbour's backlog in each measurement: two seconds or so of its
/// deliveries, so a hiccup of the machine's is a small part of the window.
const BACKLOG: usize = 10_000;

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
            "short busy handlers (1 ms of CPU each, 16 at once)",
            "*:work=1",
            &["concurrency = 16", "[tenant.mount.grants]", "clocks = true"],
            &[],
        ),
        // The same, held to a fifth and a tenth of a core: the bound to
        // set for a tenant on a host whose cores the broker shares.
        load(
            "short busy handlers held to max_cpu = 0.2",
            "*:work=1",
            &["concurrency = 16", "[tenant.mount.grants]", "clocks = true"],
            &["max_cpu = 0.2"],
        ),
        load(
            "short busy handlers held to max_cpu = 0.1",
            "*:work=1",
            &["concurrency = 16", "[tenant.mount.grants]", "clocks = true"],
            &["max_cpu = 0.1"],
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
    let rounds = bench::rounds(3);
    let mut summary = Vec::new();
    for load in loads
        .iter()
        .filter(|l| only.is_empty() || only.iter().any(|o| l.name.contains(o.as_str())))
    {
        let (mut alone_runs, mut beside_runs) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // The baseline beside each, taken first and last in turn, so
            // drift in the machine's load hits both.
            let (alone, beside) = if round % 2 == 0 {
                let alone = neighbour_beside(None, BACKLOG).await?;
                (alone, neighbour_beside(Some(load), BACKLOG).await?)
            } else {
                let beside = neighbour_beside(Some(load), BACKLOG).await?;
                (neighbour_beside(None, BACKLOG).await?, beside)
            };
            row("none", &alone, &alone);
            row(load.name, &beside, &alone);
            alone_runs.push(alone);
            beside_runs.push(beside);
        }
        let paired =
            |figure: fn(&NeighbourFigures) -> f64| median_ratio(&alone_runs, &beside_runs, figure);
        let apart = |figure: fn(&NeighbourFigures) -> f64| {
            median(beside_runs.iter().map(figure)) / median(alone_runs.iter().map(figure))
        };
        let throughput: fn(&NeighbourFigures) -> f64 = |f| f.throughput;
        let p99: fn(&NeighbourFigures) -> f64 = |f| ms(f.p99);
        summary.push((
            load.name,
            [
                paired(throughput),
                apart(throughput),
                paired(p99),
                apart(p99),
            ],
        ));
    }
    // Each round's baseline moves by a third on this kind of machine: the
    // median of the rounds' ratios and the ratio of the medians are both
    // given.
    println!(
        "\n| hostile tenant | throughput ratio: median of rounds | of medians | p99 ratio: median of rounds | of medians |"
    );
    println!("|---|---|---|---|---|");
    for (name, [t_rounds, t_medians, p_rounds, p_medians]) in summary {
        println!("| {name} | {t_rounds:.2} | {t_medians:.2} | {p_rounds:.2} | {p_medians:.2} |");
    }
    Ok(())
}
