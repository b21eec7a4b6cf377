//! A real OCI registry for the tests: the CNCF Distribution registry
//! (built by `scripts/registry`), on a port of its own, in memory, gone
//! when dropped. Modules are pushed with the `wharf push`
//! command itself.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

use crate::process::wharf_binary;
use crate::{DEADLINE, http_request, repo_root, unique};

/// A registry serving plain HTTP on 127.0.0.1.
pub struct OciRegistry {
    /// `127.0.0.1:PORT`.
    pub address: String,
    _server: Child,
}

impl OciRegistry {
    /// Starts a registry open to anyone and waits until it answers.
    pub async fn start() -> anyhow::Result<OciRegistry> {
        OciRegistry::start_with_users(None).await
    }

    /// Starts a registry that answers only the users of `htpasswd` (lines
    /// of `user:bcrypt-hash`), or anyone.
    pub async fn start_with_users(htpasswd: Option<&str>) -> anyhow::Result<OciRegistry> {
        let binary = std::process::Command::new(repo_root().join("scripts/registry")).output()?;
        anyhow::ensure!(
            binary.status.success(),
            "scripts/registry: {}",
            String::from_utf8_lossy(&binary.stderr)
        );
        let binary = String::from_utf8(binary.stdout)?.trim().to_owned();
        let port = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await?
            .local_addr()?
            .port();
        let address = format!("127.0.0.1:{port}");
        let config = std::env::temp_dir().join(format!("{}.yml", unique("wharf-registry")));
        let mut text = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  inmemory: {{}}\nhttp:\n  addr: {address}\n"
        );
        if let Some(users) = htpasswd {
            let file = config.with_extension("htpasswd");
            std::fs::write(&file, users)?;
            text += &format!(
                "auth:\n  htpasswd:\n    realm: wharf\n    path: {}\n",
                file.display()
            );
        }
        std::fs::write(&config, text)?;
        let server = Command::new(&binary)
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("{binary} did not start"))?;
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while answers_http(&address).await.is_err() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the registry on {address} did not answer"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(OciRegistry {
            address,
            _server: server,
        })
    }

    /// `oci://ADDRESS/repository:tag`.
    pub fn reference(&self, repository_and_tag: &str) -> String {
        format!("oci://{}/{repository_and_tag}", self.address)
    }

    /// Pushes `module` as `reference` with `wharf push`, and returns the
    /// reference by digest it prints.
    pub async fn push(&self, module: &Path, reference: &str) -> anyhow::Result<String> {
        self.push_with(module, reference, &[]).await
    }

    /// [`OciRegistry::push`] with more arguments to `wharf push`.
    pub async fn push_with(
        &self,
        module: &Path,
        reference: &str,
        arguments: &[&str],
    ) -> anyhow::Result<String> {
        let output = Command::new(wharf_binary())
            .arg("push")
            .arg("--plain-http")
            .args(arguments)
            .arg(module)
            .arg(reference)
            .output()
            .await?;
        anyhow::ensure!(
            output.status.success(),
            "wharf push {reference}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let printed = String::from_utf8(output.stdout)?;
        printed
            .split_whitespace()
            .last()
            .map(str::to_owned)
            .with_context(|| format!("wharf push printed nothing: {printed:?}"))
    }
}

/// Whether `GET /v2/` answers at `address` (any HTTP status).
async fn answers_http(address: &str) -> anyhow::Result<()> {
    let answer = http_request(address, "GET", "/v2/", &[], b"").await?;
    anyhow::ensure!(answer.starts_with("HTTP/1."), "not HTTP");
    Ok(())
}
