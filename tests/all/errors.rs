//! The catalogue of errors a person meets: each one made to happen for real
//! (a config, a module, a broker, a certificate, a message, a cut
//! connection) and its text kept as a snapshot under `all/snapshots/`, so a
//! regression to `Debug` text, a cause said twice or a lost hint fails.
//! After an intended change of wording, review and accept the new text
//! with `INSTA_UPDATE=always scripts/test -- errors::` (or `cargo insta`).

use std::path::Path;

use wharf::events::Event;

use crate::client::{Client, TestMessage};
use crate::process::TempFile;
use crate::proxy::Proxy;
use crate::security::wharf;
use crate::tls_broker::{MUTUAL_TLS_PORT, TLS_PORT, running as tls_broker};
use crate::{MountToml, TestHost, artemis_url, config_text, guest, rabbitmq4_url, unique};

/// Entries `what: text`, each checked for what no message may hold, with
/// the paths and names that differ between runs replaced.
#[derive(Default)]
struct Catalogue {
    entries: Vec<String>,
    redactions: Vec<(String, String)>,
}

impl Catalogue {
    fn redact(&mut self, text: impl Into<String>, by: &str) {
        self.redactions.push((text.into(), by.to_owned()));
    }

    fn add(&mut self, what: &str, text: &str) {
        let mut text = text.trim().to_owned();
        for (from, to) in &self.redactions {
            text = text.replace(from.as_str(), to);
        }
        for debug in [
            "Some(", "None", "Os {", "os error", "Other(", "Error {", "kind:",
        ] {
            assert!(!text.contains(debug), "{what}: `{debug}` in: {text}");
        }
        // A cause said twice reads `X: X`.
        let parts: Vec<&str> = text.split(": ").collect();
        for pair in parts.windows(2) {
            assert_ne!(pair[0], pair[1], "{what}: a cause repeated in: {text}");
        }
        println!("{what}:\n{text}\n");
        self.entries.push(format!("## {what}\n{text}\n"));
    }

    fn text(&self) -> String {
        self.entries.join("\n")
    }
}

/// Adds what `wharf check` says of the config `text`, which it must refuse.
async fn check(catalogue: &mut Catalogue, what: &str, text: &str) -> anyhow::Result<()> {
    let config = TempFile::new("toml", text)?;
    catalogue.redact(config.0.display().to_string(), "<config>");
    let (ok, output) = wharf(&["check", "--config", &config.0.display().to_string()]).await?;
    assert!(!ok, "{what}: accepted:\n{output}");
    catalogue.add(what, &output);
    Ok(())
}

/// A config with one mount of `module` on the address `catalogue`, `lines` after it.
fn one_mount(module: &Path, lines: &str) -> String {
    format!(
        "[broker]\nurl = \"{}\"\n[[tenant]]\nname = \"t\"\n[[tenant.mount]]\nname = \"m\"\naddress = \"catalogue\"\nmodule = \"{}\"\n{lines}",
        artemis_url(),
        module.display()
    )
}

#[tokio::test]
async fn configs_and_modules() -> anyhow::Result<()> {
    let mut catalogue = Catalogue::default();
    let ack = guest("ack");
    catalogue.redact(ack.display().to_string(), "<ack.wasm>");
    check(
        &mut catalogue,
        "a misspelt key",
        &one_mount(&ack, "adress = \"q\"\n"),
    )
    .await?;
    check(
        &mut catalogue,
        "a value of the wrong kind",
        &one_mount(&ack, "credit = \"lots\"\n"),
    )
    .await?;
    let (ok, missing) = wharf(&["check", "--config", "/nonexistent/wharf.toml"]).await?;
    assert!(!ok);
    catalogue.add("a config file that is not there", &missing);

    let text = TempFile::new("txt", "not a module\n")?;
    catalogue.redact(text.0.display().to_string(), "<text file>");
    check(
        &mut catalogue,
        "a module that is a text file",
        &one_mount(&text.0, ""),
    )
    .await?;
    check(
        &mut catalogue,
        "a module that is not there",
        &one_mount(Path::new("/nonexistent/handler.wasm"), ""),
    )
    .await?;
    let core = TempFile::new("wasm", "")?;
    std::fs::write(&core.0, b"\0asm\x01\0\0\0")?;
    catalogue.redact(core.0.display().to_string(), "<core.wasm>");
    check(
        &mut catalogue,
        "a core module, not a component",
        &one_mount(&core.0, ""),
    )
    .await?;

    // A client certificate made the old way: X.509 v1.
    let dir = std::env::temp_dir().join(unique("wharf-v1"));
    std::fs::create_dir_all(&dir)?;
    catalogue.redact(dir.display().to_string(), "<dir>");
    let openssl = |args: &[&str]| -> anyhow::Result<()> {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .stderr(std::process::Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "openssl {args:?}");
        Ok(())
    };
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "key.pem",
        "-subj",
        "/CN=wharf",
        "-out",
        "request.csr",
    ])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "request.csr",
        "-signkey",
        "key.pem",
        "-days",
        "2",
        "-out",
        "cert.pem",
    ])?;
    let tls = format!(
        "[broker.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        dir.join("cert.pem").display(),
        dir.join("key.pem").display()
    );
    let v1 = one_mount(&ack, "")
        .replacen(&artemis_url(), &format!("amqps://127.0.0.1:{TLS_PORT}"), 1)
        .replacen("[[tenant]]", &format!("{tls}[[tenant]]"), 1);
    check(&mut catalogue, "an X.509 v1 client certificate", &v1).await?;
    std::fs::remove_dir_all(&dir)?;

    insta::assert_snapshot!("configs_and_modules", catalogue.text());
    Ok(())
}

/// `wharf send` of one message with `args` before it; its output.
async fn send(args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["send"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--address", "catalogue", "x"]);
    let (ok, output) = wharf(&all).await?;
    anyhow::ensure!(!ok, "sent: {output}");
    Ok(output)
}

#[tokio::test]
async fn brokers_and_certificates() -> anyhow::Result<()> {
    let mut catalogue = Catalogue::default();
    let files = tls_broker()?;
    catalogue.redact(files.dir.display().to_string(), "<certificates>");

    catalogue.add(
        "a wrong password",
        &send(&["--url", "amqp://admin:wrong@127.0.0.1:5672"]).await?,
    );
    catalogue.add(
        "a broker that is not running",
        &send(&["--url", "amqp://admin:admin@127.0.0.1:1"]).await?,
    );
    let over_tls = async |catalogue: &mut Catalogue, what: &str, url: String, tls: String| {
        let text = format!("[broker]\nurl = \"{url}\"\n[broker.tls]\n{tls}");
        let config = TempFile::new("toml", &text)?;
        catalogue.redact(config.0.display().to_string(), "<config>");
        let output = send(&["--config", &config.0.display().to_string()]).await?;
        catalogue.add(what, &output);
        anyhow::Ok(())
    };
    over_tls(
        &mut catalogue,
        "a broker certificate signed by a CA wharf does not trust",
        format!("amqps://admin:admin@127.0.0.1:{TLS_PORT}"),
        format!("ca_file = \"{}\"\n", files.other_ca.display()),
    )
    .await?;
    over_tls(
        &mut catalogue,
        "mutual TLS without a client certificate",
        format!("amqps://admin:admin@127.0.0.1:{MUTUAL_TLS_PORT}"),
        format!("ca_file = \"{}\"\n", files.ca.display()),
    )
    .await?;
    over_tls(
        &mut catalogue,
        "a client certificate and no user (SASL EXTERNAL) to an acceptor without certificate login",
        format!("amqps://localhost:{TLS_PORT}"),
        format!(
            "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            files.ca.display(),
            files.client_cert.display(),
            files.client_key.display()
        ),
    )
    .await?;

    let _rabbitmq4 = crate::rabbitmq4_shared().await;
    catalogue.add(
        "an address the broker does not have",
        &wharf(&[
            "send",
            "--url",
            &rabbitmq4_url(),
            "--address",
            "/queues/wharf-catalogue-missing",
            "x",
        ])
        .await?
        .1,
    );
    // `wharf check --connect`: one mount attaches, one is refused.
    let text = format!(
        "{}[[tenant]]\nname = \"elsewhere\"\n[tenant.broker]\nurl = \"{}\"\n[[tenant.mount]]\nname = \"missing\"\naddress = \"/queues/wharf-catalogue-missing\"\nmodule = \"{}\"\n",
        one_mount(&guest("ack"), ""),
        rabbitmq4_url(),
        guest("ack").display()
    );
    let config = TempFile::new("toml", &text)?;
    catalogue.redact(config.0.display().to_string(), "<config>");
    let (ok, output) = wharf(&[
        "check",
        "--connect",
        "--config",
        &config.0.display().to_string(),
    ])
    .await?;
    assert!(!ok, "a refused mount passed:\n{output}");
    catalogue.add("wharf check --connect with a refused address", &output);

    insta::assert_snapshot!("brokers_and_certificates", catalogue.text());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn messages_handlers_and_links() -> anyhow::Result<()> {
    let mut catalogue = Catalogue::default();
    let url = artemis_url();
    let proxy = Proxy::start("127.0.0.1:5672").await?;
    let q = unique("catalogue");
    catalogue.redact(q.clone(), "<queue>");
    let proxied = proxy.url("amqp://proxy");
    catalogue.redact(proxied.trim_start_matches("amqp://"), "<proxy>");
    let mount = MountToml::new("m", "fixture_script", &q)
        .with("max_message_size = 2048\ntimeout = \"300ms\"\nmax_attempts = 1");
    let config = wharf_core::config::Config::parse(
        &config_text(&proxy.url(&url), &[mount]),
        Path::new("catalogue.toml"),
    )?;
    let mut host = TestHost::start_config(config).await?;
    let mut client = Client::connect(&url).await?;

    client
        .publish_raw(&q, vec![0x00, 0x53, 0x75, 0xa0, 0x10, 0x01])
        .await?;
    catalogue.add("a delivery that is not AMQP", &host.refused().await?);
    client
        .publish(&q, TestMessage::new("catalogue.big", &"x".repeat(4096)))
        .await?;
    catalogue.add("a delivery over max_message_size", &host.refused().await?);

    for (what, script) in [
        ("a handler that traps", "*:trap"),
        ("a handler that runs past its timeout", "*:spin"),
    ] {
        let id = unique("failing");
        client
            .publish(&q, TestMessage::new(&id, "").script(script))
            .await?;
        let handled = host.handled(&id).await?;
        let failure = handled.failure.unwrap_or_default();
        // The first line: a trap's wasm backtrace follows it.
        catalogue.add(what, failure.lines().next().unwrap_or_default());
    }

    proxy.cut();
    let down = host
        .next(|e| match e {
            Event::MountDown { error, .. } => Some(error.clone()),
            _ => None,
        })
        .await?;
    catalogue.add("the broker's connection cut", &down);

    client.close().await;
    host.stop().await?;
    insta::assert_snapshot!("messages_handlers_and_links", catalogue.text());
    Ok(())
}
