//! A deliberately small HTTP/1.1 listener, one request per connection:
//! `GET /metrics`, `GET /healthz` (liveness: the process answers, from its
//! first second, while its modules still compile) and `GET /readyz`
//! (readiness: this process can take work — its config is loaded and it is
//! connected to every broker its mounts use; a mount that does not attach,
//! such as one tenant's mistyped address, is listed with its last error but
//! keeps neither this pod nor any other tenant from serving).
//!
//! `GET /tenants` lists every mount and whether it is paused;
//! `POST /tenants/{t}/pause` and `/resume` pause or resume every mount of
//! tenant `t`, `POST /tenants/{t}/mounts/{m}/pause` and `/resume` one
//! mount. Those change what the host does, so they need a token to be
//! configured at all.
//!
//! With a token, every request but `/healthz` must carry it
//! (`Authorization: Bearer ...`); `/readyz` without it answers with the
//! verdict alone, for probes that cannot carry a secret. Connections are capped and each has a
//! deadline for its request and its answer; over the cap, the connection
//! that has waited longest for its request is closed to make way. So
//! clients that never send or never read cannot hold the listener, and a
//! liveness probe is answered under a flood of them.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::Metrics;
use crate::broker::{BrokerPool, PoolStatus};
use crate::events::LinkState as State;
use crate::sync::Locked;
use crate::tenants::Pauses;
use wharf_core::config::Secret;

/// The longest request head read; admin requests are one short line.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client may take to read the answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (each a task and a file descriptor until its
/// deadline); a further one closes the connection that has waited longest
/// for its request, or is closed at once when all of them are being
/// answered.
pub const MAX_CONNECTIONS: usize = 512;

/// What the host reports about itself: whether it is serving, the brokers
/// its mounts use, and where each mount stands.
#[derive(Default)]
pub struct Health {
    serving: AtomicBool,
    stopping: AtomicBool,
    /// The broker pools the running mounts use, by name (`default` or the
    /// tenant's); `None` until the mounts have started.
    brokers: Mutex<Option<Vec<(String, BrokerPool)>>>,
    mounts: Mutex<BTreeMap<(String, String), MountHealth>>,
}

/// One mount's state, as `/readyz` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountHealth {
    state: &'static str,
    error: Option<String>,
    /// Retrying cannot mend `error` until the config or the broker changes.
    permanent: bool,
}

impl Health {
    /// Records that the host is serving: its mounts have started.
    pub fn set_serving(&self) {
        self.serving.store(true, Ordering::Relaxed);
    }

    /// Records that the host is stopping: no longer alive nor ready.
    pub fn set_stopping(&self) {
        self.serving.store(false, Ordering::Relaxed);
        self.stopping.store(true, Ordering::Relaxed);
    }

    fn serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Records the broker pools the running mounts use, by name.
    pub fn set_brokers(&self, brokers: Vec<(String, BrokerPool)>) {
        *self.brokers.locked() = Some(brokers);
    }

    /// Records where a mount stands; a stopped mount is forgotten.
    /// `permanent`: its last failure will not mend by retrying.
    pub fn set_mount(&self, tenant: &str, mount: &str, state: &State, permanent: bool) {
        let key = (tenant.to_owned(), mount.to_owned());
        let mut mounts = self.mounts.locked();
        let last_error = mounts.get(&key).and_then(|m| m.error.clone());
        let health = match state {
            State::Attaching => MountHealth {
                state: "attaching",
                error: last_error,
                permanent,
            },
            State::Up => MountHealth {
                state: "up",
                error: None,
                permanent: false,
            },
            State::BackingOff { error, .. } => MountHealth {
                state: "backing-off",
                error: Some(error.clone()),
                permanent,
            },
            State::Stopped => {
                mounts.remove(&key);
                return;
            }
        };
        mounts.insert(key, health);
    }

    /// Whether the host can take work: serving, and connected to every
    /// broker its mounts use.
    fn ready(&self) -> bool {
        self.serving()
            && self
                .brokers
                .locked()
                .as_ref()
                .is_some_and(|pools| pools.iter().all(|(_, pool)| pool.status().connections > 0))
    }

    /// [`Health::ready`], with each broker's connections, the mounts not
    /// attached and the mounts `paused`, as JSON.
    fn readiness(&self, paused: &[(String, String)]) -> (bool, String) {
        let statuses: Option<Vec<(String, PoolStatus)>> =
            self.brokers.locked().as_ref().map(|pools| {
                pools
                    .iter()
                    .map(|(name, pool)| (name.clone(), pool.status()))
                    .collect()
            });
        let connected = statuses
            .as_ref()
            .is_some_and(|statuses| statuses.iter().all(|(_, status)| status.connections > 0));
        let brokers: Option<Vec<serde_json::Value>> = statuses.map(|statuses| {
            statuses
                .into_iter()
                .map(|(name, status)| {
                    serde_json::json!({
                        "broker": name,
                        "connections": status.connections,
                        "last_error": status.last_error,
                    })
                })
                .collect()
        });
        let mounts = self.mounts.locked();
        let not_attached: Vec<serde_json::Value> = mounts
            .iter()
            .filter(|(_, m)| m.state != "up")
            .map(|((tenant, mount), m)| {
                serde_json::json!({
                    "tenant": tenant,
                    "mount": mount,
                    "state": m.state,
                    "last_error": m.error,
                    "needs_a_fix": m.permanent,
                })
            })
            .collect();
        let ready = self.serving() && connected;
        let paused: Vec<serde_json::Value> = paused
            .iter()
            .map(|(tenant, mount)| serde_json::json!({ "tenant": tenant, "mount": mount }))
            .collect();
        let body = serde_json::json!({
            "ready": ready,
            "brokers": brokers,
            "mounts_not_attached": not_attached,
            "mounts_paused": paused,
        });
        (ready, format!("{body}\n"))
    }
}

/// The running admin listener; stops when dropped.
pub struct AdminServer {
    address: SocketAddr,
    stop: CancellationToken,
}

impl AdminServer {
    /// Binds `address` and serves in the background; with a `token`,
    /// requests other than `/healthz` must carry it.
    pub async fn start(
        address: SocketAddr,
        token: Option<Secret>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        pauses: Arc<Pauses>,
    ) -> std::io::Result<AdminServer> {
        let listener = TcpListener::bind(address).await?;
        let address = listener.local_addr()?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let admin = Arc::new(Admin {
            token,
            metrics,
            health,
            pauses,
        });
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let reading = Arc::new(Reading::default());
        // Connections that made way for themselves and wait for the slot.
        let queue = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stopped.cancelled() => break,
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        // Over the cap, the connection that has waited
                        // longest for its request makes way: slow clients
                        // then hold a slot only until newer ones arrive, and
                        // a probe that sends at once is always answered.
                        let slot = slots.clone().try_acquire_owned().ok();
                        let queued = match slot {
                            Some(_) => None,
                            None => match queue.clone().try_acquire_owned() {
                                Ok(queued) if reading.evict_oldest() => Some(queued),
                                // Every slot is answering: dropped unanswered.
                                _ => continue,
                            },
                        };
                        let (admin, reading, slots) = (admin.clone(), reading.clone(), slots.clone());
                        tokio::spawn(async move {
                            // The slot the evicted connection gives back.
                            let slot = match slot {
                                Some(slot) => slot,
                                None => {
                                    let freed = tokio::time::timeout(READ_TIMEOUT, slots.acquire_owned());
                                    match freed.await {
                                        Ok(Ok(slot)) => slot,
                                        _ => return,
                                    }
                                }
                            };
                            drop(queued);
                            admin.answer(stream, &reading).await;
                            drop(slot);
                        });
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

/// The connections still waiting for their request, oldest first, each
/// with the token that closes it to make way for a newer one.
#[derive(Default)]
struct Reading {
    waiting: Mutex<(u64, VecDeque<(u64, CancellationToken)>)>,
}

impl Reading {
    fn enter(&self) -> (u64, CancellationToken) {
        let mut waiting = self.waiting.locked();
        let id = waiting.0;
        waiting.0 += 1;
        let token = CancellationToken::new();
        waiting.1.push_back((id, token.clone()));
        (id, token)
    }

    fn leave(&self, id: u64) {
        let mut waiting = self.waiting.locked();
        waiting.1.retain(|(waiting, _)| *waiting != id);
    }

    /// Closes the connection that has waited longest; false when none is
    /// waiting.
    fn evict_oldest(&self) -> bool {
        let mut waiting = self.waiting.locked();
        match waiting.1.pop_front() {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}

/// What the listener serves, and to whom.
struct Admin {
    token: Option<Secret>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    pauses: Arc<Pauses>,
}

impl Admin {
    async fn answer(&self, mut stream: TcpStream, reading: &Reading) {
        let (id, evicted) = reading.enter();
        let read = tokio::time::timeout(READ_TIMEOUT, read_request(&mut stream));
        let request = tokio::select! {
            () = evicted.cancelled() => None,
            read = read => read.ok().flatten(),
        };
        reading.leave(id);
        let Some(request) = request else {
            return;
        };
        let (status, content_type, body) = self.respond(&request);
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
            body.len(),
            if status.starts_with("401") {
                "WWW-Authenticate: Bearer\r\n"
            } else {
                ""
            }
        );
        let _ = tokio::time::timeout(WRITE_TIMEOUT, async {
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
            stream.shutdown().await
        })
        .await;
    }

    fn respond(&self, request: &Request) -> (&'static str, &'static str, String) {
        if request.method == Method::Post {
            return self.control(request);
        }
        if request.path == "/healthz" {
            return if !self.health.stopping() {
                ("200 OK", "text/plain", "ok\n".to_owned())
            } else {
                (
                    "503 Service Unavailable",
                    "text/plain",
                    "stopping\n".to_owned(),
                )
            };
        }
        let authorized = self.token.as_ref().is_none_or(|token| {
            request
                .bearer
                .as_deref()
                .is_some_and(|given| same_secret(given, token.expose()))
        });
        if request.path == "/readyz" && !authorized {
            // A probe carries no token (Kubernetes' cannot read a Secret):
            // it gets the verdict; the mounts' states need the token.
            return match self.health.ready() {
                true => ("200 OK", "text/plain", "ready\n".to_owned()),
                false => (
                    "503 Service Unavailable",
                    "text/plain",
                    "not ready\n".to_owned(),
                ),
            };
        }
        if !authorized {
            return unauthorized();
        }
        match request.path.as_str() {
            "/metrics" => (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.metrics.encode(),
            ),
            "/readyz" => {
                let paused: Vec<(String, String)> = self
                    .pauses
                    .all()
                    .into_iter()
                    .filter(|(_, _, paused)| *paused)
                    .map(|(tenant, mount, _)| (tenant, mount))
                    .collect();
                match self.health.readiness(&paused) {
                    (true, body) => ("200 OK", "application/json", body),
                    (false, body) => ("503 Service Unavailable", "application/json", body),
                }
            }
            "/tenants" => {
                let mounts: Vec<serde_json::Value> = self
                    .pauses
                    .all()
                    .into_iter()
                    .map(|(tenant, mount, paused)| {
                        serde_json::json!({ "tenant": tenant, "mount": mount, "paused": paused })
                    })
                    .collect();
                json("200 OK", &serde_json::json!({ "mounts": mounts }))
            }
            _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
        }
    }

    /// A `POST`: pauses or resumes a tenant's mounts. It changes what the
    /// host does, so it needs a configured token, and carrying it.
    fn control(&self, request: &Request) -> (&'static str, &'static str, String) {
        let Some(token) = &self.token else {
            return json(
                "403 Forbidden",
                &serde_json::json!({
                    "error": "pausing and resuming need `token` in [admin]"
                }),
            );
        };
        let carried = request.bearer.as_deref();
        if !carried.is_some_and(|given| same_secret(given, token.expose())) {
            return unauthorized();
        }
        let segments: Vec<&str> = request.path.split('/').skip(1).collect();
        let target = match segments.as_slice() {
            ["tenants", tenant, action] => Some((*tenant, None, *action)),
            ["tenants", tenant, "mounts", mount, action] => Some((*tenant, Some(*mount), *action)),
            _ => None,
        };
        let switch = target.and_then(|(tenant, mount, action)| match action {
            "pause" => Some((tenant, mount, true)),
            "resume" => Some((tenant, mount, false)),
            _ => None,
        });
        let Some((tenant, mount, paused)) = switch else {
            return json(
                "404 Not Found",
                &serde_json::json!({ "error": "not found" }),
            );
        };
        match self.pauses.set(tenant, mount, paused) {
            Ok(mounts) => {
                tracing::info!(
                    tenant,
                    mounts = mounts.join(", "),
                    "{} through the admin listener",
                    if paused { "pause" } else { "resume" }
                );
                json(
                    "200 OK",
                    &serde_json::json!({ "tenant": tenant, "mounts": mounts, "paused": paused }),
                )
            }
            Err(e) => json(
                "404 Not Found",
                &serde_json::json!({ "error": e.to_string() }),
            ),
        }
    }
}

fn unauthorized() -> (&'static str, &'static str, String) {
    (
        "401 Unauthorized",
        "text/plain",
        "unauthorized\n".to_owned(),
    )
}

fn json(status: &'static str, body: &serde_json::Value) -> (&'static str, &'static str, String) {
    (status, "application/json", format!("{body}\n"))
}

/// Compares in time that does not depend on where the two differ.
fn same_secret(given: &str, expected: &str) -> bool {
    let (given, expected) = (given.as_bytes(), expected.as_bytes());
    let differ = given
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    differ == 0 && given.len() == expected.len()
}

/// What the listener reads of a request.
struct Request {
    method: Method,
    path: String,
    bearer: Option<String>,
}

/// The methods the listener answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Get,
    Post,
}

/// The method, path and bearer token of a `GET` or `POST` request, once
/// its head has arrived (a body is not read: none is needed).
async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 || head.len() + n > MAX_REQUEST {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let mut lines = std::str::from_utf8(&head).ok()?.lines();
    let mut parts = lines.next()?.split(' ');
    let method = match parts.next()? {
        "GET" => Method::Get,
        "POST" => Method::Post,
        _ => return None,
    };
    let path = parts.next()?;
    let path = path.split('?').next().unwrap_or(path).to_owned();
    let bearer = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        let scheme = value.get(..7)?;
        (name.trim().eq_ignore_ascii_case("authorization")
            && scheme.eq_ignore_ascii_case("bearer "))
        .then(|| value[7..].trim().to_owned())
    });
    Some(Request {
        method,
        path,
        bearer,
    })
}
