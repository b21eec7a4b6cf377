//! A TCP proxy between wharf and a broker that a test can cut (every
//! connection reset) or freeze (connections stay open but nothing gets
//! through: a half-open connection).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A proxy listening on a port of its own, forwarding to one broker.
pub struct Proxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    /// Bumped to reset every open connection.
    cuts: watch::Sender<u64>,
    /// While set, no byte is forwarded on any connection.
    frozen: AtomicBool,
    /// Connections accepted so far.
    accepted: AtomicUsize,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            cuts: watch::channel(0).0,
            frozen: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
        });
        let upstream = upstream.to_owned();
        let accepting = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                accepting.accepted.fetch_add(1, Ordering::Relaxed);
                let shared = accepting.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        forward(client, server, shared).await;
                    }
                });
            }
        });
        Ok(Proxy {
            address,
            shared,
            task,
        })
    }

    /// The URL to give wharf instead of the broker's: `url` with its host
    /// and port replaced by the proxy's.
    pub fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let credentials = rest.rsplit_once('@').map(|(c, _)| format!("{c}@"));
        format!(
            "{scheme}://{}{}",
            credentials.unwrap_or_default(),
            self.address
        )
    }

    /// Resets every open connection, as a broker restart or a network
    /// failure would. New connections are forwarded again.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// Stops forwarding without closing anything: both ends see a silent,
    /// open connection.
    pub fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::Relaxed);
    }

    /// Forwards again; connections frozen meanwhile are reset, as a real
    /// half-open connection would be once the network comes back.
    pub fn thaw(&self) {
        self.cut();
        self.shared.frozen.store(false, Ordering::Relaxed);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

async fn forward(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let mut cut = shared.cuts.subscribe();
    cut.mark_unchanged();
    // Closed with a reset, not a polite FIN: what a crashed broker or a
    // dropped route looks like.
    for socket in [&client, &server] {
        let _ = socket2::SockRef::from(socket).set_linger(Some(std::time::Duration::ZERO));
    }
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let shared_up = shared.clone();
    let up = async move { pipe(&mut client_read, &mut server_write, &shared_up).await };
    let down = async move { pipe(&mut server_read, &mut client_write, &shared).await };
    tokio::select! {
        () = up => {}
        () = down => {}
        _ = cut.changed() => {}
    }
    // Dropping both halves resets the connections.
}

async fn pipe(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A frozen link swallows what it reads: nothing arrives, nothing
        // is refused, the socket stays open.
        if shared.frozen.load(Ordering::Relaxed) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
