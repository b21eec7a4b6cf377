//! wharf end to end: real brokers, real compiled components.
//!
//! The brokers must be running (`scripts/test` starts them): Apache Artemis
//! on `WHARF_ARTEMIS_URL` (default `amqp://admin:admin@127.0.0.1:5672`) and
//! RabbitMQ on `WHARF_RABBITMQ_URL` (default
//! `amqp://guest:guest@127.0.0.1:5673`). Guest components come from
//! `build/guests` (`scripts/build-guests`).

mod artemis;
mod client;
mod limits;
mod rabbitmq;
mod shutdown;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::sync::broadcast;
use wharf::config::Config;
use wharf::events::{Event, Handled};
use wharf::{Host, RunningHost};

/// How long any one expected thing may take on a loaded 2-core machine.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

pub(crate) fn artemis_url() -> String {
    std::env::var("WHARF_ARTEMIS_URL").unwrap_or_else(|_| "amqp://admin:admin@127.0.0.1:5672".into())
}

pub(crate) fn rabbitmq_url() -> String {
    std::env::var("WHARF_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5673".into())
}

pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// A compiled guest from `build/guests`.
pub(crate) fn guest(name: &str) -> PathBuf {
    let path = repo_root().join("build/guests").join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/build-guests",
        path.display()
    );
    path
}

/// A name no other test (or earlier run) uses.
pub(crate) fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!(
        "{prefix}.{}.{nanos}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// One `[[tenant.mount]]` table, as TOML lines after `name`/`module`/`address`.
pub(crate) struct MountToml {
    pub(crate) name: &'static str,
    pub(crate) module: PathBuf,
    pub(crate) address: String,
    pub(crate) extra: String,
}

impl MountToml {
    pub(crate) fn new(name: &'static str, module: &str, address: &str) -> MountToml {
        MountToml {
            name,
            module: guest(module),
            address: address.to_owned(),
            extra: String::new(),
        }
    }

    pub(crate) fn with(mut self, line: &str) -> MountToml {
        self.extra.push_str(line);
        self.extra.push('\n');
        self
    }
}

/// The text of a config file with one tenant `t` holding `mounts`.
pub(crate) fn config_text(url: &str, mounts: &[MountToml]) -> String {
    let mut text = format!(
        "[broker]\nurl = \"{url}\"\ncontainer_id = \"{}\"\n[host]\nshutdown_grace = \"20s\"\n[[tenant]]\nname = \"t\"\n",
        unique("wharf-test")
    );
    for m in mounts {
        text.push_str(&format!(
            "[[tenant.mount]]\nname = \"{}\"\nmodule = \"{}\"\naddress = \"{}\"\n{}",
            m.name,
            m.module.display(),
            m.address,
            m.extra
        ));
    }
    text
}

/// A host running in this process, and the stream of what it does.
pub(crate) struct TestHost {
    host: Option<RunningHost>,
    events: broadcast::Receiver<Event>,
}

impl TestHost {
    /// Starts a host and waits until every mount is attached.
    pub(crate) async fn start(url: &str, mounts: &[MountToml]) -> anyhow::Result<TestHost> {
        let text = config_text(url, mounts);
        let config = Config::parse(&text, &repo_root().join("test.toml"))?;
        let host = Host::load(config)?;
        let mut events = host.subscribe();
        let host = host.start().await?;
        let mut ready = 0;
        while ready < mounts.len() {
            if let Event::MountReady { .. } = next_event(&mut events).await? {
                ready += 1;
            }
        }
        Ok(TestHost {
            host: Some(host),
            events,
        })
    }

    /// The next handled delivery of message `id`.
    pub(crate) async fn handled(&mut self, id: &str) -> anyhow::Result<Handled> {
        loop {
            if let Event::Handled(h) = next_event(&mut self.events).await?
                && h.message_id.as_deref() == Some(id)
            {
                return Ok(h);
            }
        }
    }

    /// The next `n` handled deliveries of message `id`, by attempt: a copy
    /// may be handled before the delivery it was copied from has reported.
    pub(crate) async fn handled_n(&mut self, id: &str, n: usize) -> anyhow::Result<Vec<Handled>> {
        let mut all = Vec::with_capacity(n);
        while all.len() < n {
            all.push(self.handled(id).await?);
        }
        all.sort_by_key(|h| h.attempt);
        Ok(all)
    }

    /// The next handled delivery of message `id` on `mount`.
    pub(crate) async fn handled_on(&mut self, mount: &str, id: &str) -> anyhow::Result<Handled> {
        loop {
            let h = self.handled(id).await?;
            if &*h.mount == mount {
                return Ok(h);
            }
        }
    }

    /// Waits for the delayed copy of message `id` to be published.
    pub(crate) async fn copy_published(&mut self, id: &str) -> anyhow::Result<u32> {
        loop {
            if let Event::CopyPublished {
                message_id,
                retry_count,
                error,
                ..
            } = next_event(&mut self.events).await?
                && message_id.as_deref() == Some(id)
            {
                if let Some(error) = error {
                    bail!("copy of {id} was not published: {error}");
                }
                return Ok(retry_count);
            }
        }
    }

    /// Shuts the host down gracefully.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(host) = self.host.take() {
            tokio::time::timeout(DEADLINE, host.shutdown())
                .await
                .context("host did not stop in time")??;
        }
        Ok(())
    }
}

async fn next_event(events: &mut broadcast::Receiver<Event>) -> anyhow::Result<Event> {
    match tokio::time::timeout(DEADLINE, events.recv()).await {
        Ok(Ok(event)) => Ok(event),
        Ok(Err(e)) => bail!("event stream: {e}"),
        Err(_) => bail!("no event within {DEADLINE:?}"),
    }
}
