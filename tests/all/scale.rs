//! Many tenants in one host on the real broker.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tenants_start_and_each_serves_a_message() -> anyhow::Result<()> {
    let figures = wharf_tests::scenarios::many_tenants(200).await?;
    eprintln!(
        "200 tenants: started in {:?}, a message on every mount in {:?}, test process resident {} MiB",
        figures.start,
        figures.first_messages,
        figures.resident_bytes >> 20
    );
    Ok(())
}
