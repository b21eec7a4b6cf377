//! Trust boundaries: secrets never reach a log, an error, a metric or
//! `wharf check`; the admin endpoint wants its token, outlasts clients
//! that never finish and answers `/healthz` under a flood of them; TLS to
//! the broker (see `tls.rs` for the TLS broker).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Command;
use wharf_core::config::Config;

use crate::artemis_users;
use crate::client::{Client, TestMessage};
use crate::process::{TempFile, wharf_binary};
use crate::{DEADLINE, MountToml, artemis_url, config_text, repo_root, unique};

/// A user of the test Artemis with a password no other text contains,
/// removed again when dropped. Artemis re-reads its user files on login.
struct ArtemisUser {
    name: String,
    password: String,
}

impl ArtemisUser {
    fn add() -> anyhow::Result<ArtemisUser> {
        let tag = unique("").replace('.', "");
        // `@` and `:` are the characters URL redaction gets wrong most.
        let user = ArtemisUser {
            name: format!("leak{tag}"),
            password: format!("Pw{tag}:s3cr@t"),
        };
        let credentials = format!("{} = {}\n", user.name, user.password);
        artemis_users::add(&artemis_users::etc(""), &user.name, &credentials)?;
        Ok(user)
    }

    /// The password as a URL carries it: `%`, `:` and `@` percent-encoded.
    fn encoded(&self) -> String {
        self.password
            .replace('%', "%25")
            .replace(':', "%3A")
            .replace('@', "%40")
    }

    /// `amqp://user:password@127.0.0.1:5672`.
    fn url(&self) -> String {
        format!("amqp://{}:{}@127.0.0.1:5672", self.name, self.encoded())
    }

    /// Every form the password could leak in.
    fn forms(&self) -> [String; 2] {
        [self.password.clone(), self.encoded()]
    }
}

impl Drop for ArtemisUser {
    fn drop(&mut self) {
        let _ = artemis_users::remove(&artemis_users::etc(""), &self.name);
    }
}

/// Runs `wharf ARGS` to its end: whether it succeeded, and what it printed
/// on stdout and stderr.
pub(crate) async fn wharf(args: &[&str]) -> anyhow::Result<(bool, String)> {
    let output = tokio::time::timeout(
        DEADLINE,
        Command::new(wharf_binary())
            .args(args)
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .context("wharf did not finish")??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.success(), text))
}

/// `wharf run` with its whole log going to a file, read back at the end.
struct Logged {
    child: tokio::process::Child,
    log: TempFile,
}

impl Logged {
    async fn start(config: &Path) -> anyhow::Result<Logged> {
        let log = TempFile::new("log", "")?;
        let child = Command::new(wharf_binary())
            .args(["--log-format", "json", "run", "--config"])
            .arg(config)
            .env("WHARF_LOG", "debug")
            .stderr(std::fs::File::create(&log.0)?)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        Ok(Logged { child, log })
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log.0).unwrap_or_default()
    }

    async fn wait_for(&self, needle: &str) -> anyhow::Result<()> {
        self.wait_for_count(needle, 1).await
    }

    async fn wait_for_count(&self, needle: &str, n: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while self.text().matches(needle).count() < n {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "no {needle:?} in the log:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    async fn stop(mut self) -> anyhow::Result<String> {
        let pid = self.child.id().context("running")?;
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await?;
        anyhow::ensure!(status.success(), "kill -TERM {pid}");
        tokio::time::timeout(DEADLINE, self.child.wait()).await??;
        Ok(self.text())
    }
}

/// A GET with an optional bearer token: the status line and the body.
pub(crate) async fn get(
    address: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(String, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: wharf\r\n{auth}\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    ))
}

fn assert_no_secret(user: &ArtemisUser, place: &str, text: &str) {
    for form in user.forms() {
        assert!(!text.contains(&form), "{place} shows the password:\n{text}");
    }
}

#[tokio::test]
async fn no_secret_reaches_a_log_an_error_a_metric_or_check() -> anyhow::Result<()> {
    let user = ArtemisUser::add()?;
    let queue = unique("leak");
    let admin_port = free_port()?;
    let password_file = TempFile::new("secret", &format!("{}\n", user.password))?;
    let mount = MountToml::new("m", "ack", &queue);
    let in_url = format!(
        "{}[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n",
        config_text(&user.url(), std::slice::from_ref(&mount))
    );
    let in_file = config_text("amqp://127.0.0.1:5672", std::slice::from_ref(&mount)).replacen(
        "[host]",
        &format!(
            "user = \"{}\"\npassword_file = \"{}\"\n[host]",
            user.name,
            password_file.0.display()
        ),
        1,
    );
    let wrong = config_text(
        &user.url().replace("s3cr", "wrong-s3cr"),
        std::slice::from_ref(&mount),
    );

    // wharf check: good configs, and broken ones that quote the password.
    for (name, text) in [
        ("in the URL", in_url.clone()),
        ("in a file", in_file.clone()),
        (
            "an unterminated URL",
            format!(
                "[broker]\nurl = \"amqp://{}:{}@127.0.0.1\n",
                user.name, user.password
            ),
        ),
        (
            "a URL with a bad scheme",
            format!(
                "[broker]\nurl = \"amqpx://{}:{}@127.0.0.1\"\n",
                user.name, user.password
            ),
        ),
        (
            "a URL that is not a string",
            format!("[broker]\nurl = [\"{}\", 5]\n", user.url()),
        ),
    ] {
        let config = TempFile::new("toml", &text)?;
        let (ok, output) =
            wharf(&["check", "--config", config.0.to_str().context("path")?]).await?;
        println!("wharf check, password {name}: ok={ok}\n{output}");
        assert_no_secret(
            &user,
            &format!("wharf check with the password {name}"),
            &output,
        );
    }

    // wharf run: a working config, with deliveries and the admin pages.
    let config = TempFile::new("toml", &in_url)?;
    let running = Logged::start(&config.0).await?;
    running.wait_for("mount attached").await?;
    let mut client = Client::connect(&artemis_url()).await?;
    client
        .publish(&queue, TestMessage::new("leak-1", "x"))
        .await?;
    // wharf send, accepted and refused.
    let (ok, output) = wharf(&["send", "--url", &user.url(), "--address", &queue, "x"]).await?;
    assert!(ok, "{output}");
    assert_no_secret(&user, "wharf send", &output);
    let wrong_url = user.url().replace("s3cr", "wrong-s3cr");
    let (ok, output) = wharf(&["send", "--url", &wrong_url, "--address", &queue, "x"]).await?;
    assert!(!ok, "a wrong password is refused");
    assert_no_secret(&user, "wharf send with a wrong password", &output);
    running.wait_for_count("\"handled\"", 2).await?;
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], admin_port));
    for path in ["/metrics", "/readyz", "/healthz"] {
        let (status, body) = get(address, path, None).await?;
        assert_no_secret(&user, path, &body);
        assert!(status.contains("200"), "{path}: {status}");
    }
    let log = running.stop().await?;
    assert_no_secret(&user, "the log of a working wharf run", &log);

    // wharf run: a password the broker refuses, so errors are logged, once
    // at error level as one that retrying will not mend, and /readyz says
    // the mount needs a fix.
    let refused_admin = free_port()?;
    let config = TempFile::new(
        "toml",
        &format!("{wrong}[admin]\nlisten = \"127.0.0.1:{refused_admin}\"\n"),
    )?;
    let refused = Logged::start(&config.0).await?;
    refused.wait_for("Retrying will not mend this").await?;
    let (status, body) = get(
        std::net::SocketAddr::from(([127, 0, 0, 1], refused_admin)),
        "/readyz",
        None,
    )
    .await?;
    assert!(status.contains("503"), "{status}");
    assert!(body.contains("\"needs_a_fix\":true"), "{body}");
    assert_no_secret(&user, "/readyz of a refused login", &body);
    let log = refused.stop().await?;
    assert_no_secret(&user, "the log of a refused wharf run", &log);

    // The events stream: a mount that cannot log in says why.
    let config = Config::parse(&wrong, &repo_root().join("leak.toml"))?;
    let mut host = crate::TestHost::start_unattached(config).await?;
    let down = host
        .next(|e| matches!(e, wharf::events::Event::MountDown { .. }).then(|| format!("{e:?}")))
        .await?;
    assert_no_secret(&user, "a MountDown event", &down);
    host.stop().await?;
    println!(
        "no password in: 5 wharf check runs, 2 wharf run logs, /metrics, /readyz, /healthz, 2 wharf send runs, a MountDown event"
    );
    client.close().await;
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[tokio::test]
async fn the_admin_endpoint_wants_its_token_and_outlasts_clients_that_never_finish()
-> anyhow::Result<()> {
    let token = unique("token");
    let token_file = TempFile::new("token", &token)?;
    let queue = unique("admin");
    let text = format!(
        "{}[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n",
        config_text(&artemis_url(), &[MountToml::new("m", "ack", &queue)]),
        token_file.0.display()
    );
    let host =
        crate::TestHost::start_config(Config::parse(&text, &repo_root().join("t.toml"))?).await?;
    let address = host.host().admin_address().context("admin listener")?;

    let (status, _) = get(address, "/metrics", None).await?;
    assert!(status.contains("401"), "no token: {status}");
    // A probe without the token gets the verdict, not the mounts' states.
    let (status, body) = get(address, "/readyz", Some("wrong")).await?;
    assert!(
        status.contains("200") && body == "ready\n",
        "a probe without the token: {status} {body}"
    );
    let (status, body) = get(address, "/readyz", Some(&token)).await?;
    assert!(
        status.contains("200") && body.contains("\"mounts_not_attached\""),
        "with the token, the mounts' states: {status} {body}"
    );
    let (status, body) = get(address, "/metrics", Some(&token)).await?;
    assert!(
        status.contains("200") && body.contains("wharf_"),
        "{status}"
    );
    let (status, _) = get(address, "/healthz", None).await?;
    assert!(status.contains("200"), "liveness needs no token: {status}");

    // Twice as many clients as the listener serves at once, each sending
    // half a request and then nothing.
    let mut slow = Vec::new();
    for _ in 0..2 * wharf::admin::MAX_CONNECTIONS {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\n").await?;
        slow.push(stream);
    }
    // A real request gets through once the listener cut them off.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let served_after = tokio::time::Instant::now();
    loop {
        match get(address, "/metrics", Some(&token)).await {
            Ok((status, _)) if status.contains("200") => break,
            _ => anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the listener never served again"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waited = served_after.elapsed();
    // Every slow client was closed by the listener, not left open.
    let mut closed = 0;
    for mut stream in slow {
        let mut buf = [0u8; 64];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await {
            closed += 1;
        }
    }
    println!(
        "admin: {} slow clients, a request served after {waited:?}, {closed} slow clients closed by the listener",
        2 * wharf::admin::MAX_CONNECTIONS
    );
    assert_eq!(closed, 2 * wharf::admin::MAX_CONNECTIONS);
    host.stop().await?;
    Ok(())
}

/// Keeps `count` clients connected to `address`, each sending half a
/// request and then nothing, re-opening every one the listener closes,
/// until dropped.
fn flood(address: std::net::SocketAddr, count: usize) -> tokio::task::JoinSet<()> {
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..count {
        clients.spawn(async move {
            loop {
                let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
                    continue;
                };
                if stream
                    .write_all(b"GET /metrics HTTP/1.1\r\n")
                    .await
                    .is_err()
                {
                    continue;
                }
                // Until the listener closes it.
                let _ = stream.read(&mut [0u8; 64]).await;
            }
        });
    }
    clients
}

#[tokio::test]
async fn healthz_answers_within_a_second_while_200_slow_clients_hold_the_admin_port()
-> anyhow::Result<()> {
    let queue = unique("admin-flood");
    let text = format!(
        "{}[admin]\nlisten = \"127.0.0.1:0\"\n",
        config_text(&artemis_url(), &[MountToml::new("m", "ack", &queue)]),
    );
    let host =
        crate::TestHost::start_config(Config::parse(&text, &repo_root().join("t.toml"))?).await?;
    let address = host.host().admin_address().context("admin listener")?;
    let clients = flood(address, 200);
    let mut slowest = Duration::ZERO;
    const PROBES: usize = 20;
    for _ in 0..PROBES {
        let asked = tokio::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(1), get(address, "/healthz", None))
            .await
            .context("/healthz took more than 1 s")??;
        slowest = slowest.max(asked.elapsed());
        assert!(answer.0.contains("200"), "{answer:?}");
    }
    drop(clients);
    println!(
        "admin: 200 slow clients re-opened as closed, {PROBES} /healthz answered, slowest in {slowest:?}"
    );
    host.stop().await?;
    Ok(())
}
