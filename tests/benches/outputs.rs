//! A handler that publishes one output per input, against a hand-written
//! fe2o3-amqp loop doing the same work in the same run: receive 64 inputs
//! (the credit), publish one 64-byte output each (durable, with the id and
//! on Artemis the `_AMQ_DUPL_ID` wharf gives it), wait until the broker has
//! accepted every output, then accept the inputs. That is wharf's confirm
//! path (outputs accepted before their input), batched as wharf batches the
//! deliveries in flight.
//!
//!     cargo bench -p wharf-tests --bench outputs             # Artemis, then RabbitMQ 4
//!     cargo bench -p wharf-tests --bench outputs -- artemis  # one broker
//!
//! The brokers must be running (`scripts/test` starts them); the handler is
//! `build/guests/fixture_script.wasm` (`scripts/build-guests rust`).

use std::time::Instant;

use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::{Body, Header, Outcome};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Receiver, Sender, Session};
use wharf::broker::message::{ARTEMIS_DUPLICATE_ID, AmqpMessage};
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

/// The output the loop publishes for input `i`: what wharf publishes, a
/// durable message with a derived id, on Artemis with `_AMQ_DUPL_ID`.
fn output_of(broker: &Broker, input: &str, i: usize) -> AmqpMessage {
    let id = format!("{input}.{i}/out/0");
    let dedup = [(ARTEMIS_DUPLICATE_ID, id.as_str())];
    let artemis = broker.name.contains("Artemis");
    let mut output = message(id.clone(), BODY, if artemis { &dedup } else { &[] });
    output.header = Some(Header {
        durable: true,
        ..Header::default()
    });
    output
}

/// The hand-written loop: batches of `CREDIT` inputs, their outputs
/// published and confirmed, then the inputs accepted.
async fn native(broker: &Broker, n: usize) -> anyhow::Result<f64> {
    let output = (broker.queue)(&unique("bench-native-out"));
    let input = inputs(broker, &output, n).await?;
    let mut connection = native_connection(&broker.url).await?;
    let mut session = Session::begin(&mut connection).await?;
    let mut receiver = Receiver::builder()
        .name(unique("native-in"))
        .source(input.as_str())
        .credit_mode(CreditMode::Auto(CREDIT))
        .attach(&mut session)
        .await?;
    let mut sender = Sender::attach(&mut session, unique("native-out"), output.as_str()).await?;
    let started = Instant::now();
    let mut done = 0;
    while done < n {
        let batch = (n - done).min(CREDIT as usize);
        let mut deliveries = Vec::with_capacity(batch);
        let mut confirms = Vec::with_capacity(batch);
        for i in 0..batch {
            let delivery = receiver.recv::<Body<Value>>().await?;
            let payload = output_of(broker, &input, done + i).encode()?;
            confirms.push(sender.send_payload_batchable(payload).await?);
            deliveries.push(delivery);
        }
        for confirm in confirms {
            anyhow::ensure!(
                matches!(confirm.await?, Outcome::Accepted(_)),
                "output refused"
            );
        }
        for delivery in &deliveries {
            receiver.accept(delivery).await?;
        }
        done += batch;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    let _ = sender.close().await;
    let _ = receiver.close().await;
    let _ = session.end().await;
    let _ = connection.close().await;
    Ok(rate)
}

/// wharf with the fixture handler sending one output per input.
async fn wharf(broker: &Broker, n: usize) -> anyhow::Result<f64> {
    let output = (broker.queue)(&unique("bench-wharf-out"));
    let input = inputs(broker, &output, n).await?;
    let mount = MountToml::new("m", "fixture_script", &input)
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
        let baseline = native(&broker, n).await?;
        let wharf = wharf(&broker, n).await?;
        println!("| consumer | msg/s | vs hand-written |");
        println!("|---|---|---|");
        println!(
            "| hand-written fe2o3 loop, confirm path, batches of {CREDIT} | {baseline:.0} | 1.00× |"
        );
        println!(
            "| wharf, Rust handler, confirm path | {wharf:.0} | {:.2}× |",
            wharf / baseline
        );
    }
    Ok(())
}
