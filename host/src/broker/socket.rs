//! The TCP socket under every broker connection, opened by wharf itself so
//! it gets the options a message stream needs.

use std::io;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Idle time before the kernel starts probing a silent connection.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the kernel gives the connection up.
const KEEPALIVE_RETRIES: u32 = 3;

/// Connects to `host:port`, trying each address it resolves to, within
/// `timeout` in all. The socket has `TCP_NODELAY` (without it every window
/// of credit waits ~40 ms for a delayed ACK) and TCP keepalive on.
pub async fn connect(host: &str, port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let opened = tokio::time::timeout(timeout, async {
        let mut last = None;
        for address in tokio::net::lookup_host((host, port)).await? {
            match TcpStream::connect(address).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address")
        }))
    })
    .await
    .map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no connection within {timeout:?}"),
        )
    })??;
    configure(&opened)?;
    Ok(opened)
}

fn configure(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let keepalive = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_has_nodelay_and_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listener");
        let port = listener.local_addr().expect("address").port();
        let stream = connect("127.0.0.1", port, Duration::from_secs(5))
            .await
            .expect("connect");
        assert!(stream.nodelay().expect("nodelay"));
        let socket = SockRef::from(&stream);
        assert!(socket.keepalive().expect("keepalive"));
        assert_eq!(socket.tcp_keepalive_time().expect("idle"), KEEPALIVE_IDLE);
        assert_eq!(
            socket.tcp_keepalive_interval().expect("interval"),
            KEEPALIVE_INTERVAL
        );
        assert_eq!(
            socket.tcp_keepalive_retries().expect("retries"),
            KEEPALIVE_RETRIES
        );
    }

    #[tokio::test]
    async fn nobody_listening_is_an_error_not_a_hang() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
        let port = listener.local_addr().expect("address").port();
        drop(listener);
        let error = connect("127.0.0.1", port, Duration::from_secs(5))
            .await
            .expect_err("refused");
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused);
    }
}
