//! Many tenants on the real broker: a tenant's throughput beside a tenant
//! whose handlers spin (as a ratio to its throughput alone, measured in the
//! same run), and what a host with many tenants costs to start and keep.
//!
//! `cargo bench -p wharf-tests --bench tenants` (brokers running, guests
//! built: `scripts/test` does both).

use wharf_tests::scenarios::{many_tenants, noisy_neighbour};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let figures = noisy_neighbour(2000, 4, 3).await?;
    println!(
        "noisy neighbour: tenant A handled {} deliveries in {:?} alone and {:?} beside tenant B's 4 spinning handlers: throughput ratio {:.2}",
        figures.messages,
        figures.alone,
        figures.beside_spinners,
        figures.ratio()
    );
    let scale = many_tenants(200).await?;
    println!(
        "{} tenants x 1 mount: started in {:?}; one message on every mount handled in {:?}; resident memory {:.1} MiB",
        scale.tenants,
        scale.start,
        scale.first_messages,
        scale.resident_bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}
