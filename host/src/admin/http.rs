//! A deliberately small HTTP/1.1 listener, one request per connection:
//! `GET /metrics`, `GET /healthz` (liveness: the process is serving) and
//! `GET /readyz` (readiness: every mount is attached; otherwise a JSON list
//! of the mounts that are not, with their last error).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::Metrics;
use crate::events::LinkState as State;

/// The longest request head read; admin requests are one short line.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What the host reports about itself: whether it is alive, and where
/// each mount stands.
#[derive(Default)]
pub struct Health {
    serving: AtomicBool,
    mounts: Mutex<BTreeMap<(String, String), MountHealth>>,
}

/// One mount's state, as `/readyz` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountHealth {
    state: &'static str,
    error: Option<String>,
}

impl Health {
    /// Records whether the host is serving (false once it is stopping).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::Relaxed);
    }

    fn serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Records where a mount stands; a stopped mount is forgotten.
    pub fn set_mount(&self, tenant: &str, mount: &str, state: &State) {
        let key = (tenant.to_owned(), mount.to_owned());
        let mut mounts = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
        let last_error = mounts.get(&key).and_then(|m| m.error.clone());
        let health = match state {
            State::Attaching => MountHealth {
                state: "attaching",
                error: last_error,
            },
            State::Up => MountHealth {
                state: "up",
                error: None,
            },
            State::BackingOff { error, .. } => MountHealth {
                state: "backing-off",
                error: Some(error.clone()),
            },
            State::Stopped => {
                mounts.remove(&key);
                return;
            }
        };
        mounts.insert(key, health);
    }

    /// Whether every mount is attached, and a JSON list of those that are
    /// not.
    fn readiness(&self) -> (bool, String) {
        let mounts = self.mounts.lock().unwrap_or_else(|p| p.into_inner());
        let waiting: Vec<serde_json::Value> = mounts
            .iter()
            .filter(|(_, m)| m.state != "up")
            .map(|((tenant, mount), m)| {
                serde_json::json!({
                    "tenant": tenant,
                    "mount": mount,
                    "state": m.state,
                    "last_error": m.error,
                })
            })
            .collect();
        let ready = self.serving() && waiting.is_empty();
        let body = serde_json::json!({ "ready": ready, "not_ready": waiting });
        (ready, format!("{body}\n"))
    }
}

/// The running admin listener; stops when dropped.
pub struct AdminServer {
    address: SocketAddr,
    stop: CancellationToken,
}

impl AdminServer {
    /// Binds `address` and serves in the background.
    pub async fn start(
        address: SocketAddr,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> std::io::Result<AdminServer> {
        let listener = TcpListener::bind(address).await?;
        let address = listener.local_addr()?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stopped.cancelled() => break,
                    accepted = listener.accept() => {
                        if let Ok((stream, _)) = accepted {
                            tokio::spawn(answer(stream, metrics.clone(), health.clone()));
                        }
                    }
                }
            }
        });
        Ok(AdminServer { address, stop })
    }

    /// The address it listens on (useful with port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn answer(mut stream: TcpStream, metrics: Arc<Metrics>, health: Arc<Health>) {
    let Ok(Some(path)) = tokio::time::timeout(READ_TIMEOUT, request_path(&mut stream)).await else {
        return;
    };
    let (status, content_type, body) = match path.as_str() {
        "/metrics" => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" if health.serving() => ("200 OK", "text/plain", "ok\n".to_owned()),
        "/healthz" => (
            "503 Service Unavailable",
            "text/plain",
            "stopping\n".to_owned(),
        ),
        "/readyz" => match health.readiness() {
            (true, body) => ("200 OK", "application/json", body),
            (false, body) => ("503 Service Unavailable", "application/json", body),
        },
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// The path of a `GET` request, once its head has arrived.
async fn request_path(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 || head.len() + n > MAX_REQUEST {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = std::str::from_utf8(&head).ok()?.lines().next()?;
    let mut parts = line.split(' ');
    match (parts.next(), parts.next()) {
        (Some("GET"), Some(path)) => Some(path.split('?').next().unwrap_or(path).to_owned()),
        _ => None,
    }
}
