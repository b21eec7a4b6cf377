//! wharf end to end on a real broker, against a hand-written fe2o3-amqp
//! consumer doing the same work in the same run (its socket with
//! `TCP_NODELAY`, the same credit): throughput and the process's CPU time
//! per message, per handler language and instance policy, latency at half
//! and nine tenths of each policy's best rate, what ordering by key
//! costs, mounts sharing a connection, and what idle mounts cost.
//!
//!     cargo bench -p wharf-tests --bench throughput             # Artemis, then RabbitMQ 4
//!     cargo bench -p wharf-tests --bench throughput -- artemis  # one broker
//!     cargo bench -p wharf-tests --bench throughput -- artemis ack  # cases naming `ack`
//!     cargo bench -p wharf-tests --bench throughput -- artemis tracing  # what spans cost
//!     cargo bench -p wharf-tests --bench throughput -- artemis latency  # under a steady load
//!     cargo bench -p wharf-tests --bench throughput -- artemis ordered  # what order_by costs
//!
//! The brokers must be running (`scripts/test` starts them); guests come
//! from `build/guests` (`scripts/build-guests`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::messaging::{Body, MessageId};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Receiver, Sender, Session};
use wharf::events::Event;
use wharf_core::config::Config;
use wharf_core::message::AmqpMessage;
use wharf_tests::bench::{self, Broker, brokers, host, host_with, median, median_ratio, rate};
use wharf_tests::{MountToml, TenantToml, TestHost, repo_root, tenants_text, unique};

/// Messages per throughput measurement (`WHARF_BENCH_MESSAGES` overrides).
fn messages() -> usize {
    bench::messages(20_000)
}
/// Link credit, for wharf and the baseline alike.
const CREDIT: u32 = 64;
/// Body size of every message.
const BODY: usize = 256;

fn message(id: String) -> AmqpMessage {
    bench::message(id, BODY, &[])
}

async fn prefill(url: &str, address: &str, n: usize) -> anyhow::Result<()> {
    bench::prefill(url, address, n, |i| message(format!("{address}.{i}"))).await
}

/// A consumer's rate, and the CPU time its process spent per message.
struct Measured {
    rate: f64,
    cpu_per_message: Duration,
}

/// CPU time (user and system, every thread) this process has used: the
/// broker is a process of its own, so over a run this is the consumer's.
fn cpu_time() -> Duration {
    // Fields 14 and 15 of /proc/self/stat, after the parenthesised name,
    // in clock ticks (USER_HZ, 100 on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|field| field.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The CPU time used per message since `since` (a [`cpu_time`]).
fn per_message(since: Duration, messages: usize) -> Duration {
    cpu_time().saturating_sub(since) / u32::try_from(messages.max(1)).unwrap_or(u32::MAX)
}

/// The baseline's receiver on `address`: its connection (`TCP_NODELAY`),
/// session and link, with the same credit as wharf's mounts.
struct NativeReceiver {
    connection: ConnectionHandle<()>,
    session: SessionHandle<()>,
    receiver: Receiver,
}

impl NativeReceiver {
    async fn attach(url: &str, address: &str) -> anyhow::Result<NativeReceiver> {
        let mut connection = bench::native_connection(url).await?;
        let mut session = Session::begin(&mut connection).await?;
        let receiver = Receiver::builder()
            .name(unique("native"))
            .source(address)
            .credit_mode(CreditMode::Auto(CREDIT))
            .attach(&mut session)
            .await?;
        Ok(NativeReceiver {
            connection,
            session,
            receiver,
        })
    }

    async fn close(mut self) {
        let _ = self.receiver.close().await;
        let _ = self.session.end().await;
        let _ = self.connection.close().await;
    }
}

/// The baseline: receive and accept every message, nothing else.
async fn native(url: &str, address: &str, n: usize) -> anyhow::Result<Measured> {
    let mut native = NativeReceiver::attach(url, address).await?;
    let (started, cpu) = (Instant::now(), cpu_time());
    for _ in 0..n {
        let delivery = native.receiver.recv::<Body<Value>>().await?;
        native.receiver.accept(&delivery).await?;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let cpu_per_message = per_message(cpu, n);
    native.close().await;
    Ok(Measured {
        rate,
        cpu_per_message,
    })
}

fn mount(name: &str, module: &str, address: &str, extra: &[&str]) -> MountToml {
    let mut mount = MountToml::new(name, module, address).with(&format!("credit = {CREDIT}"));
    for line in extra {
        mount = mount.with(line);
    }
    mount
}

/// wharf's rate over `n` prefilled messages on `mounts` mounts, each on a
/// queue of its own; the messages carry the property `key`, one of `keys`
/// in turn, when `keys` is given.
async fn wharf_rate(
    broker: &Broker,
    module: &str,
    extra: &[&str],
    mounts: usize,
    n: usize,
    top: &str,
    keys: Option<usize>,
) -> anyhow::Result<Measured> {
    let queues: Vec<String> = (0..mounts)
        .map(|_| (broker.queue)(&unique("bench")))
        .collect();
    for queue in &queues {
        match keys {
            None => prefill(&broker.url, queue, n / mounts).await?,
            Some(keys) => {
                bench::prefill(&broker.url, queue, n / mounts, |i| {
                    let key = (i % keys).to_string();
                    bench::message(format!("{queue}.{i}"), BODY, &[("key", &key)])
                })
                .await?
            }
        }
    }
    let specs = queues
        .iter()
        .enumerate()
        .map(|(i, q)| mount(&format!("m{i}"), module, q, extra))
        .collect();
    let host = host_with(broker, specs, top).await?;
    profiler("enable");
    let (cpu, handled) = (cpu_time(), host.host().handled_total());
    let rate = rate(&host, n / mounts * mounts).await?;
    let cpu_per_message = per_message(cpu, (host.host().handled_total() - handled) as usize);
    profiler("disable");
    host.stop().await?;
    Ok(Measured {
        rate,
        cpu_per_message,
    })
}

/// What exporting spans costs the Rust `ack` handler (reuse): tracing
/// off, on with every trace sampled out, and on with every trace sampled
/// and exported to a collector in a process of its own (so its work is
/// not counted as wharf's CPU time); each the median of
/// `WHARF_BENCH_ROUNDS` rounds (default 6) taken in turn, as ratios to
/// tracing off: the machine's load moves single rounds by a fifth.
async fn tracing_cost(broker: &Broker) -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt as _;
    let mut collector = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--collector")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdin = collector.stdin.as_mut().expect("piped");
    let stdout = collector.stdout.take().expect("piped");
    let mut said = tokio::io::BufReader::new(stdout).lines();
    let endpoint = said
        .next_line()
        .await?
        .ok_or_else(|| anyhow::anyhow!("the collector did not start"))?;
    let on = |sampler: &str| {
        format!(
            "[telemetry]\nendpoint = \"{endpoint}\"\nsampler = \"{sampler}\"\nexport_delay = \"200ms\"\n"
        )
    };
    let cases = [
        ("tracing off", String::new()),
        ("tracing on, every trace sampled out", on("always_off")),
        ("tracing on, every trace exported", on("always_on")),
    ];
    let mut runs = vec![Vec::new(); cases.len()];
    for round in 0..bench::rounds(6) {
        for i in balanced_order(round, cases.len()) {
            let measured = wharf_rate(
                broker,
                "ack",
                &["instance = \"reuse\""],
                1,
                messages(),
                &cases[i].1,
                None,
            )
            .await?;
            runs[i].push((measured.rate, measured.cpu_per_message.as_secs_f64()));
            collector_quiet(stdin, &mut said).await?;
        }
    }
    println!(
        "\n| Rust `ack`, reuse | msg/s (median) | vs off (median of rounds) | CPU per message | vs off |"
    );
    println!("|---|---|---|---|---|");
    for ((name, _), case) in cases.iter().zip(&runs) {
        println!(
            "| {name} | {:.0} | {:.2}× | {:.1} µs | {:.2}× |",
            median(case.iter().map(|r| r.0)),
            median_ratio(&runs[0], case, |r| r.0),
            median(case.iter().map(|r| r.1)) * 1e6,
            median_ratio(&runs[0], case, |r| r.1),
        );
    }
    for ((name, _), case) in cases.iter().zip(&runs).skip(1) {
        let each: Vec<String> = runs[0]
            .iter()
            .zip(case)
            .map(|(off, on)| format!("{:.2}", on.0 / off.0))
            .collect();
        println!("{name}: throughput vs off by round {}", each.join(", "));
    }
    drop(collector.stdin.take());
    let received = said.next_line().await?.unwrap_or_default();
    println!("({received} spans exported to the collector)");
    // Off, a delivery's only tracing work is looking for a context and
    // declining to make spans: too little for the rounds above to tell
    // apart, so it is timed on its own, against a delivery's CPU time.
    let off_work = off_tracing_work();
    let off_cpu = median(runs[0].iter().map(|r| r.1));
    println!(
        "tracing off: {:.0} ns of each delivery's {:.1} µs of CPU is tracing's ({:.3}× the CPU of none)\n",
        off_work.as_secs_f64() * 1e9,
        off_cpu * 1e6,
        1.0 + off_work.as_secs_f64() / off_cpu.max(1e-12),
    );
    Ok(())
}

/// What ordering costs the Rust `ack` handler (reuse): 1,000 keys against
/// the same mount unordered, both with 16 handlers at once, and one key
/// (every message in line) against one handler at a time; each the median
/// of `WHARF_BENCH_ROUNDS` rounds (default 6) taken in turn.
async fn ordering_cost(broker: &Broker) -> anyhow::Result<()> {
    const REUSE: &str = "instance = \"reuse\"";
    const ORDERED: &str = "order_by = \"property:key\"";
    let cases: [(&str, &[&str], Option<usize>); 4] = [
        (
            "unordered, concurrency 16",
            &[REUSE, "concurrency = 16"],
            None,
        ),
        (
            "ordered, 1,000 keys, concurrency 16",
            &[REUSE, "concurrency = 16", ORDERED],
            Some(1_000),
        ),
        (
            "unordered, concurrency 1",
            &[REUSE, "concurrency = 1"],
            None,
        ),
        (
            "ordered, 1 key, concurrency 16",
            &[REUSE, "concurrency = 16", ORDERED],
            Some(1),
        ),
    ];
    let mut runs = vec![Vec::new(); cases.len()];
    for round in 0..bench::rounds(6) {
        for i in balanced_order(round, cases.len()) {
            let (_, extra, keys) = cases[i];
            let measured = wharf_rate(broker, "ack", extra, 1, messages(), "", keys).await?;
            runs[i].push((measured.rate, measured.cpu_per_message.as_secs_f64()));
        }
    }
    println!(
        "\n| Rust `ack`, reuse | msg/s (median) | vs its baseline (median of rounds) | CPU per message | vs its baseline |"
    );
    println!("|---|---|---|---|---|");
    for (i, ((name, ..), case)) in cases.iter().zip(&runs).enumerate() {
        // Each ordered case against the unordered one before it.
        let baseline = &runs[i - i % 2];
        println!(
            "| {name} | {:.0} | {:.2}× | {:.1} µs | {:.2}× |",
            median(case.iter().map(|r| r.0)),
            median_ratio(baseline, case, |r| r.0),
            median(case.iter().map(|r| r.1)) * 1e6,
            median_ratio(baseline, case, |r| r.1),
        );
    }
    Ok(())
}

/// The order of `n` cases in `round`. A run may find the machine still
/// busy with the one before it (the broker's last acknowledgements, freed
/// memory): each case goes first in turn, and every other `n` rounds in
/// reverse order, so that over `2n` rounds each case follows each other
/// one equally often.
fn balanced_order(round: usize, n: usize) -> impl Iterator<Item = usize> {
    let first = round % n;
    let reversed = (round / n) % 2 == 1;
    (0..n).map(move |i| {
        if reversed {
            (first + n - i) % n
        } else {
            (first + i) % n
        }
    })
}

/// The time per delivery of what tracing off does on a delivery's path:
/// reading the bench's message for a publisher's context (there is none),
/// and asking for the `process` span and a child of it (`settle`), which
/// off are not made.
fn off_tracing_work() -> Duration {
    use std::hint::black_box;
    use wharf::telemetry::{Kind, Telemetry};
    use wharf_core::trace::TraceContext;
    const TIMES: u32 = 1_000_000;
    let message = message("off".to_owned());
    let telemetry = Telemetry::off();
    let started = Instant::now();
    for _ in 0..TIMES {
        let publisher = TraceContext::of(black_box(&message)).ok().flatten();
        let (trace, span) = telemetry.process(publisher.as_ref(), format_args!("process q"));
        let settle = telemetry.child(trace.as_ref(), format_args!("settle q"), Kind::Client);
        black_box((trace, span, settle));
    }
    started.elapsed() / TIMES
}

/// The child process of [`tracing_cost`]: an OTLP collector that prints
/// its endpoint, then counts the spans it decodes, printing how many it
/// has received for every line read from stdin and once more when stdin
/// closes.
async fn collector_here() -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt as _;
    let collector = wharf_tests::collector::Collector::start_counting().await?;
    println!("{}", collector.http);
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while lines.next_line().await?.is_some() {
        println!("{}", collector.count());
    }
    println!("{}", collector.count());
    Ok(())
}

/// Waits (at most a minute) until the collector has received no span
/// for half a second: a host stopped before its export queue drained
/// goes on exporting, which the next case would pay for.
async fn collector_quiet(
    stdin: &mut tokio::process::ChildStdin,
    said: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while tokio::time::Instant::now() < deadline {
        stdin.write_all(b"count\n").await?;
        let count = said.next_line().await?;
        if count.is_some() && count == last {
            return Ok(());
        }
        last = count;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("the collector was still receiving spans after a minute")
}

/// Tells a profiler started with `perf record --control=fifo:PATH -D -1` to
/// sample only while wharf consumes (`WHARF_PERF_CONTROL=PATH`).
fn profiler(command: &str) {
    if let Some(path) = std::env::var_os("WHARF_PERF_CONTROL") {
        let _ = std::fs::write(path, format!("{command}\n"));
    }
}

/// Latency from publish to accept under a steady load.
struct Latency {
    /// The rate the publisher kept up.
    rate: f64,
    p50: Duration,
    p99: Duration,
}

/// Who consumes in a latency measurement.
#[derive(Clone, Copy)]
enum Consumer<'a> {
    /// The hand-written fe2o3 loop.
    Native,
    /// One wharf mount of the Rust `ack` handler with these extra lines
    /// (its policy).
    Wharf(&'a [&'a str]),
}

/// p50 and p99 from publish to accept, publishing at `rate` a second for
/// five seconds to `consumer`. The publisher does not wait for the
/// broker's answer before the next publish, so it keeps up rates a
/// publish-and-wait loop could not.
async fn latency(broker: &Broker, consumer: Consumer<'_>, rate: f64) -> anyhow::Result<Latency> {
    let queue = (broker.queue)(&unique("latency"));
    let n = (rate * 5.0) as usize;
    // The ids of accepted messages, as they are accepted.
    let (accepted, mut accepts) = tokio::sync::mpsc::unbounded_channel::<String>();
    let (host, native) = match consumer {
        Consumer::Wharf(extra) => {
            let host = host(broker, vec![mount("m", "ack", &queue, extra)]).await?;
            let mut events = host.host().subscribe();
            tokio::spawn(async move {
                while let Ok(event) = events.recv().await {
                    if let Event::Handled(h) = event
                        && let Some(id) = h.message_id
                        && accepted.send(id).is_err()
                    {
                        break;
                    }
                }
            });
            (Some(host), None)
        }
        Consumer::Native => {
            let mut native = NativeReceiver::attach(&broker.url, &queue).await?;
            let native =
                tokio::spawn(async move {
                    for _ in 0..n {
                        let delivery = native.receiver.recv::<Body<Value>>().await?;
                        native.receiver.accept(&delivery).await?;
                        let id = delivery.message().properties.as_ref().and_then(|p| {
                            match &p.message_id {
                                Some(MessageId::String(id)) => Some(id.clone()),
                                _ => None,
                            }
                        });
                        let _ = accepted.send(id.unwrap_or_default());
                    }
                    native.close().await;
                    anyhow::Ok(())
                });
            (None, Some(native))
        }
    };
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let publishing = {
        let (url, queue, sent) = (broker.url.clone(), queue.clone(), sent.clone());
        tokio::spawn(async move {
            let mut connection = bench::native_connection(&url).await?;
            let mut session = Session::begin(&mut connection).await?;
            let mut sender =
                Sender::attach(&mut session, unique("latency"), queue.as_str()).await?;
            let started = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            let mut answers = Vec::with_capacity(n);
            for i in 0..n {
                tick.tick().await;
                let id = format!("{queue}.{i}");
                sent.lock()
                    .expect("sent")
                    .insert(id.clone(), Instant::now());
                answers.push(sender.send_payload_batchable(message(id).encode()?).await?);
            }
            let kept = n as f64 / started.elapsed().as_secs_f64();
            for answer in answers {
                answer.await?;
            }
            let _ = sender.close().await;
            let _ = session.end().await;
            let _ = connection.close().await;
            anyhow::Ok(kept)
        })
    };
    let mut latencies = Vec::with_capacity(n);
    while latencies.len() < n {
        let id = accepts
            .recv()
            .await
            .ok_or_else(|| anyhow::anyhow!("the consumer stopped"))?;
        if let Some(at) = sent.lock().expect("sent").remove(&id) {
            latencies.push(at.elapsed());
        }
    }
    let rate = publishing.await??;
    if let Some(host) = host {
        host.stop().await?;
    }
    if let Some(native) = native {
        native.await??;
    }
    latencies.sort();
    Ok(Latency {
        rate,
        p50: latencies[n / 2],
        p99: latencies[n * 99 / 100],
    })
}

/// Attach time and resident memory of `mounts` idle mounts, measured in a
/// process of their own so one count does not inherit another's memory.
async fn idle(broker: &Broker, mounts: usize) -> anyhow::Result<(Duration, u64)> {
    let output = tokio::process::Command::new(std::env::current_exe()?)
        .arg(format!("--idle={mounts}"))
        .arg(format!("--url={}", broker.url))
        .arg(format!("--broker={}", broker.name))
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "idle mounts: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut figures = stdout.split_whitespace().map(str::parse::<f64>);
    let (Some(Ok(seconds)), Some(Ok(bytes))) = (figures.next(), figures.next()) else {
        anyhow::bail!("idle mounts printed {stdout}");
    };
    Ok((Duration::from_secs_f64(seconds), bytes as u64))
}

/// The child process of [`idle`]: prints seconds to attach and bytes grown.
async fn idle_here(broker: &Broker, mounts: usize) -> anyhow::Result<()> {
    let before = resident_bytes();
    let tenants: Vec<TenantToml> = (0..mounts.div_ceil(100))
        .map(|t| {
            let mounts = (0..100.min(mounts - t * 100))
                .map(|m| {
                    mount(
                        &format!("m{m}"),
                        "ack",
                        &(broker.queue)(&unique("idle")),
                        &[],
                    )
                })
                .collect();
            TenantToml::new(&format!("t{t}"), mounts)
        })
        .collect();
    let text = tenants_text(&broker.url, "", &tenants);
    let started = Instant::now();
    let host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("bench.toml"))?).await?;
    let took = started.elapsed();
    let grown = resident_bytes().saturating_sub(before);
    println!("{} {grown}", took.as_secs_f64());
    host.stop().await?;
    Ok(())
}

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The `flaky` handlers log a line per delivery; measured here is the
    // host, not the terminal.
    bench::init_logging();
    let flag = |name: &str| {
        std::env::args().find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_owned))
    };
    if std::env::args().any(|a| a == "--collector") {
        return collector_here().await;
    }
    if let (Some(mounts), Some(url)) = (flag("idle"), flag("url")) {
        let name = flag("broker").unwrap_or_default();
        let broker = brokers()
            .into_iter()
            .find(|b| b.name == name)
            .map(|b| Broker { url, ..b })
            .ok_or_else(|| anyhow::anyhow!("no broker {name}"))?;
        return idle_here(&broker, mounts.parse()?).await;
    }
    for broker in brokers() {
        println!(
            "\n## {} ({} messages of {BODY} bytes, credit {CREDIT})\n",
            broker.name,
            messages()
        );
        let queue = (broker.queue)(&unique("native"));
        prefill(&broker.url, &queue, messages()).await?;
        let baseline = native(&broker.url, &queue, messages()).await?;
        println!("| consumer | msg/s | vs native | CPU per message | vs native |");
        println!("|---|---|---|---|---|");
        let row = |name: &str, measured: &Measured| {
            let cpu = measured.cpu_per_message;
            println!(
                "| {name} | {:.0} | {:.2}× | {:.1} µs | {:.2}× |",
                measured.rate,
                measured.rate / baseline.rate,
                cpu.as_secs_f64() * 1e6,
                cpu.as_secs_f64() / baseline.cpu_per_message.as_secs_f64().max(1e-9)
            );
        };
        row("native fe2o3 consumer (TCP_NODELAY)", &baseline);
        let reuse = ["instance = \"reuse\""];
        // Go's runtime reads the clock and random bytes as it starts.
        let go = [
            "instance = \"reuse\"",
            "[tenant.mount.grants]",
            "clocks = true",
            "random = true",
        ];
        let cases: [(&str, &str, &[&str]); 6] = [
            ("wharf, Rust `ack`, per-delivery", "ack", &[]),
            ("wharf, Rust `ack`, reuse", "ack", &reuse),
            (
                "wharf, JavaScript (StarlingMonkey) `flaky`, reuse",
                "flaky_js",
                &reuse,
            ),
            (
                "wharf, JavaScript (QuickJS) `flaky`, reuse",
                "flaky_js_qjs",
                &reuse,
            ),
            ("wharf, Python `flaky`, reuse", "flaky_python", &reuse),
            ("wharf, Go `flaky`, reuse", "flaky_go", &go),
        ];
        let only_case = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .nth(1);
        if only_case.as_deref().is_none_or(|c| c == "tracing") {
            tracing_cost(&broker).await?;
        }
        if only_case.as_deref().is_none_or(|c| c == "ordered") {
            ordering_cost(&broker).await?;
        }
        // The best rate of each policy of the Rust `ack` handler, for the
        // latency under load below.
        let mut best = [0.0f64; 2];
        for (name, module, extra) in cases {
            // `latency` needs the best rate of each policy.
            let wanted = |c: &str| name.contains(c) || (c == "latency" && module == "ack");
            if only_case.as_deref().is_some_and(|c| !wanted(c)) {
                continue;
            }
            if !repo_root()
                .join(format!("build/guests/{module}.wasm"))
                .is_file()
            {
                println!("| {name} | not built | |");
                continue;
            }
            let measured = wharf_rate(&broker, module, extra, 1, messages(), "", None).await?;
            if module == "ack" {
                best[usize::from(!extra.is_empty())] = measured.rate;
            }
            row(name, &measured);
        }
        // Each policy's load, and the native loop under the same load.
        if only_case.as_deref().is_none_or(|c| c == "latency") {
            println!("\n| consumer | load | published | p50 | p99 |\n|---|---|---|---|---|");
            for (policy, extra, best) in [
                ("per-delivery", &[][..], best[0]),
                ("reuse", &reuse, best[1]),
            ] {
                for load in [0.5, 0.9] {
                    if best == 0.0 {
                        continue;
                    }
                    for (name, consumer) in [
                        ("native fe2o3 consumer", Consumer::Native),
                        (
                            &*format!("wharf, Rust `ack`, {policy}"),
                            Consumer::Wharf(extra),
                        ),
                    ] {
                        let measured = latency(&broker, consumer, best * load).await?;
                        println!(
                            "| {name} | {:.0} % of {best:.0} msg/s ({policy}) | {:.0} msg/s | {:.2} ms | {:.2} ms |",
                            load * 100.0,
                            measured.rate,
                            measured.p50.as_secs_f64() * 1e3,
                            measured.p99.as_secs_f64() * 1e3
                        );
                    }
                }
            }
        }
        if only_case.is_some() {
            continue;
        }
        for mounts in [10, 100] {
            let measured = wharf_rate(&broker, "ack", &reuse, mounts, messages(), "", None).await?;
            row(
                &format!("wharf, Rust `ack`, reuse, {mounts} mounts on one connection"),
                &measured,
            );
        }
        for mounts in [1_000, 10_000] {
            let (took, bytes) = idle(&broker, mounts).await?;
            println!(
                "{mounts} idle mounts: attached in {:.1} s, {:.0} MiB resident",
                took.as_secs_f64(),
                bytes as f64 / (1 << 20) as f64
            );
        }
    }
    Ok(())
}
