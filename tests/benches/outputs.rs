//! A handler that publishes one output per input, against hand-written
//! fe2o3-amqp loops doing the same work in the same run, each receiving 64
//! inputs (the credit) at a time and publishing one 64-byte output each
//! (durable, with the id wharf gives it):
//!
//! - the confirm path: publish the outputs (on Artemis with the
//!   `_AMQ_DUPL_ID` wharf gives them), wait until the broker has accepted
//!   every one, then accept the inputs;
//! - the transaction path, on brokers with transactions (Artemis): declare
//!   a transaction, post the outputs in it, wait for the broker to take
//!   each, accept the inputs in it, commit.
//!
//! Both batch as wharf batches the deliveries in flight.
//!
//!     cargo bench -p wharf-tests --bench outputs             # Artemis, then RabbitMQ 4
//!     cargo bench -p wharf-tests --bench outputs -- artemis  # one broker
//!
//! The brokers must be running (`scripts/test` starts them); the handler is
//! `build/guests/fixture_script.wasm` (`scripts/build-guests rust`).

use std::time::Instant;

use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::transaction::{
    Controller, Transaction, TransactionBase, TransactionDischarge, TransactionRetirement,
};
use fe2o3_amqp::types::messaging::{Body, Header, Outcome};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Receiver, Sender, Session};
use wharf_core::message::{ARTEMIS_DUPLICATE_ID, AmqpMessage};
use wharf_tests::MountToml;
use wharf_tests::bench::{self, Broker, brokers, host, message, native_connection, prefill, rate};
use wharf_tests::unique;

/// Inputs per measurement (`WHARF_BENCH_MESSAGES` overrides).
fn messages() -> usize {
    bench::messages(10_000)
}
/// Link credit, for wharf and the baseline alike: also the baseline's batch.
const CREDIT: u32 = 64;
/// Body size of inputs and outputs.
const BODY: usize = 64;

/// Prefills `n` inputs on a fresh queue whose script makes the fixture
/// handler send one output to `output` and ack. Returns the input queue.
async fn inputs(broker: &Broker, output: &str, n: usize) -> anyhow::Result<String> {
    let input = (broker.queue)(&unique("bench-in"));
    let script = format!("*:send={output},ack");
    prefill(&broker.url, &input, n, |i| {
        message(format!("{input}.{i}"), BODY, &[("script", &script)])
    })
    .await?;
    Ok(input)
}

/// The output a loop publishes for input `i`: what wharf publishes, a
/// durable message with a derived id, with `_AMQ_DUPL_ID` when `dedup`.
fn output_of(input: &str, i: usize, dedup: bool) -> AmqpMessage {
    let id = format!("{input}.{i}/out/0");
    let property = [(ARTEMIS_DUPLICATE_ID, id.as_str())];
    let mut output = message(id.clone(), BODY, if dedup { &property } else { &[] });
    output.header = Some(Header {
        durable: true,
        ..Header::default()
    });
    output
}

/// Whether the broker has AMQP transactions (and duplicate detection).
fn is_artemis(broker: &Broker) -> bool {
    broker.name.contains("Artemis")
}

/// A hand-written loop's links: `n` inputs on a fresh queue, read with
/// `CREDIT`, and a sender to their output queue, all on one session.
struct NativeLinks {
    input: String,
    connection: fe2o3_amqp::connection::ConnectionHandle<()>,
    session: fe2o3_amqp::session::SessionHandle<()>,
    receiver: Receiver,
    sender: Sender,
}

impl NativeLinks {
    async fn open(broker: &Broker, n: usize) -> anyhow::Result<NativeLinks> {
        let output = (broker.queue)(&unique("bench-native-out"));
        let input = inputs(broker, &output, n).await?;
        let mut connection = native_connection(&broker.url).await?;
        let mut session = Session::begin(&mut connection).await?;
        let receiver = Receiver::builder()
            .name(unique("native-in"))
            .source(input.as_str())
            .credit_mode(CreditMode::Auto(CREDIT))
            .attach(&mut session)
            .await?;
        let sender = Sender::attach(&mut session, unique("native-out"), output.as_str()).await?;
        Ok(NativeLinks {
            input,
            connection,
            session,
            receiver,
            sender,
        })
    }

    async fn close(mut self) {
        let _ = self.sender.close().await;
        let _ = self.receiver.close().await;
        let _ = self.session.end().await;
        let _ = self.connection.close().await;
    }
}

/// The hand-written confirm loop: batches of `CREDIT` inputs, their
/// outputs published and confirmed, then the inputs accepted.
async fn native_confirm(broker: &Broker, n: usize) -> anyhow::Result<f64> {
    let mut links = NativeLinks::open(broker, n).await?;
    let started = Instant::now();
    let mut done = 0;
    while done < n {
        let batch = (n - done).min(CREDIT as usize);
        let mut deliveries = Vec::with_capacity(batch);
        let mut confirms = Vec::with_capacity(batch);
        for i in 0..batch {
            let delivery = links.receiver.recv::<Body<Value>>().await?;
            let payload = output_of(&links.input, done + i, is_artemis(broker)).encode()?;
            confirms.push(links.sender.send_payload_batchable(payload).await?);
            deliveries.push(delivery);
        }
        for confirm in confirms {
            anyhow::ensure!(
                matches!(confirm.await?, Outcome::Accepted(_)),
                "output refused"
            );
        }
        for delivery in &deliveries {
            links.receiver.accept(delivery).await?;
        }
        done += batch;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    links.close().await;
    Ok(rate)
}

/// The hand-written transaction loop: batches of `CREDIT` inputs, their
/// outputs posted in a transaction and taken, the inputs accepted in it,
/// committed.
async fn native_transaction(broker: &Broker, n: usize) -> anyhow::Result<f64> {
    let mut links = NativeLinks::open(broker, n).await?;
    let controller = Controller::attach(&mut links.session, unique("native-txn")).await?;
    let started = Instant::now();
    let mut done = 0;
    while done < n {
        let batch = (n - done).min(CREDIT as usize);
        let mut deliveries = Vec::with_capacity(batch);
        for _ in 0..batch {
            deliveries.push(links.receiver.recv::<Body<Value>>().await?);
        }
        let txn = Transaction::declare(&controller, None).await?;
        let mut posted = Vec::with_capacity(batch);
        for i in 0..batch {
            let payload = output_of(&links.input, done + i, false).encode()?;
            posted.push(
                links
                    .sender
                    .post_payload_batchable(payload, txn.txn_id().clone())
                    .await?,
            );
        }
        for outcome in posted {
            anyhow::ensure!(
                matches!(outcome.await?, Outcome::Accepted(_)),
                "output refused"
            );
        }
        for delivery in &deliveries {
            txn.accept(&mut links.receiver, delivery).await?;
        }
        txn.commit().await?;
        done += batch;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let _ = controller.close().await;
    links.close().await;
    Ok(rate)
}

/// wharf with the fixture handler sending one output per input, committed
/// as `outputs` says (by default, as the broker allows).
async fn wharf(broker: &Broker, n: usize, outputs: Option<&str>) -> anyhow::Result<f64> {
    let output = (broker.queue)(&unique("bench-wharf-out"));
    let input = inputs(broker, &output, n).await?;
    let mut mount = MountToml::new("m", "fixture_script", &input);
    if let Some(path) = outputs {
        mount = mount.with(&format!("outputs = \"{path}\""));
    }
    let mount = mount
        .with(&format!("credit = {CREDIT}"))
        .with("[tenant.mount.grants]")
        .with(&format!("send = [\"{output}\"]"));
    let host = host(broker, vec![mount]).await?;
    let rate = rate(&host, n).await?;
    host.stop().await?;
    Ok(rate)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bench::init_logging();
    for broker in brokers() {
        let n = messages();
        println!(
            "\n## {}: one {BODY}-byte output per input ({n} inputs, credit {CREDIT})\n",
            broker.name
        );
        let baseline = native_confirm(&broker, n).await?;
        let confirmed = wharf(&broker, n, Some("confirm")).await?;
        println!("| consumer | msg/s | vs its hand-written loop |");
        println!("|---|---|---|");
        println!(
            "| hand-written fe2o3 loop, confirm path, batches of {CREDIT} | {baseline:.0} | 1.00× |"
        );
        println!(
            "| wharf, Rust handler, confirm path | {confirmed:.0} | {:.2}× |",
            confirmed / baseline
        );
        if is_artemis(&broker) {
            let baseline = native_transaction(&broker, n).await?;
            let committed = wharf(&broker, n, None).await?;
            println!(
                "| hand-written fe2o3 loop, transaction path, {CREDIT} inputs per transaction | {baseline:.0} | 1.00× |"
            );
            println!(
                "| wharf, Rust handler, transaction path | {committed:.0} | {:.2}× |",
                committed / baseline
            );
            println!(
                "\nwharf's transaction path against its confirm path: {:.2}×",
                committed / confirmed
            );
        }
    }
    Ok(())
}
