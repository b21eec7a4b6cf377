//! TLS and SASL on a real broker: server-authenticated TLS with SASL PLAIN,
//! mutual TLS with SASL EXTERNAL, the certificates wharf must refuse, and
//! SCRAM.

use std::time::Duration;

use anyhow::Context as _;
use wharf::broker::{BrokerConnection, ConnectOptions};
use wharf_core::config::{Broker, Config, SaslMechanism, TlsFiles};
use wharf_core::endpoint::Endpoint;

use crate::client::{Client, TestMessage};
use crate::tls_broker::{
    EXPIRED_PORT, MUTUAL_TLS_PORT, PLAIN_PORT, SCRAM_PORT, TLS_PORT, add_scram_user,
    running as tls_broker,
};
use crate::{MountToml, TestHost, config_text, repo_root, unique};

fn plain_url() -> String {
    format!("amqp://admin:admin@127.0.0.1:{PLAIN_PORT}")
}

/// A host with one `ack` mount behind `broker_lines`, a message published
/// on the plain port, and the handled delivery.
async fn handled_over(url: &str, broker_lines: &str) -> anyhow::Result<()> {
    let queue = unique("tls");
    let text = config_text(url, &[MountToml::new("m", "ack", &queue)]).replacen(
        "[host]",
        &format!("{broker_lines}[host]"),
        1,
    );
    let mut host =
        TestHost::start_config(Config::parse(&text, &repo_root().join("tls.toml"))?).await?;
    let mut client = Client::connect(&plain_url()).await?;
    let id = unique("tls-message");
    client
        .publish(&queue, TestMessage::new(&id, "over TLS"))
        .await?;
    let handled = host.handled(&id).await?;
    assert_eq!(handled.outcome, wharf_core::settlement::Outcome::Ack);
    client.close().await;
    host.stop().await
}

#[tokio::test]
async fn tls_with_plain_reaches_a_broker_whose_ca_is_given() -> anyhow::Result<()> {
    let files = tls_broker()?;
    handled_over(
        &format!("amqps://admin:admin@127.0.0.1:{TLS_PORT}"),
        &format!("[broker.tls]\nca_file = \"{}\"\n", files.ca.display()),
    )
    .await
}

#[tokio::test]
async fn mutual_tls_logs_in_with_external_by_the_client_certificate() -> anyhow::Result<()> {
    let files = tls_broker()?;
    handled_over(
        &format!("amqps://localhost:{MUTUAL_TLS_PORT}"),
        &format!(
            "[broker.tls]\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            files.ca.display(),
            files.client_cert.display(),
            files.client_key.display()
        ),
    )
    .await
}

/// Opens a connection as the host would; the error's text when it fails.
/// Connects as the host would to `broker`'s first node and begins a
/// session (some brokers refuse a login only there): the error's text, or
/// an error when the broker took it all.
pub(crate) async fn refusal(mut broker: Broker) -> anyhow::Result<String> {
    broker.connect_timeout = Duration::from_secs(20);
    let url = broker.urls.first().context("a broker URL")?;
    let endpoint = Endpoint::parse(url).map_err(anyhow::Error::msg)?;
    let mut connection = match BrokerConnection::open(&endpoint, &ConnectOptions::of(&broker)).await
    {
        Ok(connection) => connection,
        Err(e) => return Ok(e.to_string()),
    };
    let begun = connection.begin_session().await;
    connection.close(Duration::from_secs(5)).await;
    match begun {
        Ok(_) => anyhow::bail!("{endpoint} was accepted"),
        Err(e) => Ok(e.to_string()),
    }
}

/// [`refusal`] of the broker at `url` over TLS with `tls`.
async fn tls_refusal(url: &str, tls: TlsFiles) -> anyhow::Result<String> {
    let mut broker = Broker::at(url);
    broker.tls = Some(tls);
    refusal(broker).await
}

#[tokio::test]
async fn certificates_wharf_must_not_trust_are_refused_saying_why() -> anyhow::Result<()> {
    let files = tls_broker()?;
    let trusting = |ca: &std::path::Path| TlsFiles {
        ca_file: Some(ca.to_owned()),
        ..TlsFiles::default()
    };
    let tls = format!("amqps://admin:admin@127.0.0.1:{TLS_PORT}");

    let unknown_ca = tls_refusal(&tls, trusting(&files.other_ca)).await?;
    println!("a CA wharf does not trust: {unknown_ca}");
    assert!(
        unknown_ca.contains("not signed by a CA wharf trusts"),
        "{unknown_ca}"
    );

    let expired = tls_refusal(
        &format!("amqps://admin:admin@127.0.0.1:{EXPIRED_PORT}"),
        trusting(&files.ca),
    )
    .await?;
    println!("an expired certificate: {expired}");
    assert!(expired.contains("has expired"), "{expired}");

    let wrong_name = tls_refusal(
        &tls,
        TlsFiles {
            server_name: Some("broker.example".into()),
            ..trusting(&files.ca)
        },
    )
    .await?;
    println!("a certificate for another name: {wrong_name}");
    assert!(
        wrong_name.contains("not valid for `broker.example`"),
        "{wrong_name}"
    );

    let platform_roots = tls_refusal(&tls, TlsFiles::default()).await?;
    println!("the platform's CAs only: {platform_roots}");
    assert!(platform_roots.contains("TLS"), "{platform_roots}");

    let no_client_certificate = tls_refusal(
        &format!("amqps://admin:admin@127.0.0.1:{MUTUAL_TLS_PORT}"),
        trusting(&files.ca),
    )
    .await?;
    println!("mutual TLS without a client certificate: {no_client_certificate}");
    assert!(
        no_client_certificate.contains("refused wharf's client certificate"),
        "{no_client_certificate}"
    );
    Ok(())
}

#[tokio::test]
async fn wharf_send_publishes_over_tls_with_a_configs_broker() -> anyhow::Result<()> {
    let files = tls_broker()?;
    let queue = unique("tls-send");
    let config = crate::process::TempFile::new(
        "toml",
        &format!(
            "[broker]\nurl = \"amqps://localhost:{MUTUAL_TLS_PORT}\"\nsasl = \"external\"\n[broker.tls]\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            files.ca.display(),
            files.client_cert.display(),
            files.client_key.display()
        ),
    )?;
    let loaded = Config::load(&config.0)?;
    assert_eq!(loaded.broker.credentials.mechanism, SaslMechanism::External);
    let (sent, output) = crate::security::wharf(&[
        "send",
        "--config",
        config.0.to_str().context("path")?,
        "--address",
        &queue,
        "hello over mutual TLS",
    ])
    .await?;
    anyhow::ensure!(sent, "wharf send: {output}");
    let mut client = Client::connect(&plain_url()).await?;
    let mut watcher = client.watch(&queue).await?;
    let (_, message) = watcher.next().await?;
    assert_eq!(crate::client::body_text(&message), "hello over mutual TLS");
    watcher.close().await;
    client.close().await;
    Ok(())
}

#[tokio::test]
async fn scram_logs_in_without_sending_the_password() -> anyhow::Result<()> {
    let user = unique("scram").replace('.', "");
    let password = unique("pw").replace('.', "");
    add_scram_user(&user, &password)?;
    for mechanism in ["scram-sha-256", "scram-sha-512"] {
        handled_over(
            &format!("amqp://{user}:{password}@127.0.0.1:{SCRAM_PORT}"),
            &format!("sasl = \"{mechanism}\"\n"),
        )
        .await
        .with_context(|| mechanism.to_owned())?;
    }
    let mut broker = Broker::at(&format!(
        "amqp://{user}:wrong-{password}@127.0.0.1:{SCRAM_PORT}"
    ));
    broker.credentials.mechanism = SaslMechanism::ScramSha256;
    let refused = refusal(broker).await?;
    println!("SCRAM with a wrong password: {refused}");
    Ok(())
}
