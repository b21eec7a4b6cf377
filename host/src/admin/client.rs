//! The other end of the admin listener, for `wharf pause` and `wharf
//! resume`: one plain HTTP/1.1 request, its answer read to the end.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The longest answer read; the listener's are a line of JSON.
const MAX_ANSWER: u64 = 1024 * 1024;

/// Why a request to the admin listener got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The URL is not `http://host:port`.
    #[error("`{0}` is not an admin listener's URL (http://host:port)")]
    Url(String),
    /// Connecting, sending or reading failed.
    #[error("{url}: {reason}")]
    Io {
        /// The listener.
        url: String,
        /// Why, in words.
        reason: String,
    },
    /// No answer in time.
    #[error("{0}: no answer within {1:?}")]
    TimedOut(String, Duration),
    /// The answer is not HTTP.
    #[error("{0}: the answer is not HTTP")]
    NotHttp(String),
}

/// Sends `method path` with `token` to the listener at `url` and returns
/// the answer's status code and body.
pub async fn request(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<(u16, String), AdminError> {
    let address = url
        .strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|rest| !rest.is_empty() && !rest.contains('/'))
        .ok_or_else(|| AdminError::Url(url.to_owned()))?;
    let io = |e: std::io::Error| AdminError::Io {
        url: url.to_owned(),
        reason: wharf_core::words::io(&e),
    };
    let exchange = async {
        let mut stream = TcpStream::connect(address).await.map_err(io)?;
        let authorization = token
            .map(|token| format!("Authorization: Bearer {token}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.map_err(io)?;
        let mut answer = Vec::new();
        stream
            .take(MAX_ANSWER)
            .read_to_end(&mut answer)
            .await
            .map_err(io)?;
        Ok::<_, AdminError>(answer)
    };
    let answer = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| AdminError::TimedOut(url.to_owned(), timeout))??;
    let text = String::from_utf8_lossy(&answer);
    let not_http = || AdminError::NotHttp(url.to_owned());
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(not_http)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(not_http)?;
    Ok((status, body.to_owned()))
}
