//! RabbitMQ 4's HTTP management API, for what AMQP cannot do: declaring
//! quorum queues and streams with their arguments.

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The management API (`scripts/rabbitmq4` enables it).
fn api() -> String {
    std::env::var("WHARF_RABBITMQ4_API").unwrap_or_else(|_| "127.0.0.1:15674".into())
}

/// `guest:guest`, as HTTP basic authentication wants it.
const GUEST: &str = "Z3Vlc3Q6Z3Vlc3Q=";

async fn request(method: &str, path: &str, body: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(api())
        .await
        .context("the RabbitMQ 4 management API (scripts/rabbitmq4 start)")?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {GUEST}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .context("an HTTP status")?;
    Ok((status, response))
}

/// Declares a durable queue of `kind` (`classic`, `quorum`, `stream`) with
/// extra `arguments` (a JSON object's members, e.g. `"x-delivery-limit": 5`).
pub async fn declare(name: &str, kind: &str, arguments: &str) -> anyhow::Result<()> {
    let separator = if arguments.is_empty() { "" } else { "," };
    let body = format!(
        r#"{{"durable":true,"arguments":{{"x-queue-type":"{kind}"{separator}{arguments}}}}}"#
    );
    let (status, response) = request("PUT", &format!("/api/queues/%2F/{name}"), &body).await?;
    anyhow::ensure!(
        matches!(status, 201 | 204),
        "declare {kind} queue {name}: {response}"
    );
    Ok(())
}

/// Deletes a queue.
pub async fn delete(name: &str) -> anyhow::Result<()> {
    let (status, response) = request("DELETE", &format!("/api/queues/%2F/{name}"), "").await?;
    anyhow::ensure!(
        matches!(status, 204 | 404),
        "delete queue {name}: {response}"
    );
    Ok(())
}

/// The body of a `GET` of `path`.
pub async fn get(path: &str) -> anyhow::Result<String> {
    let (status, response) = request("GET", path, "").await?;
    anyhow::ensure!(status == 200, "GET {path}: {response}");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(body.to_owned());
    }
    // Chunked: each chunk's size in hex on a line of its own.
    let mut rest = body;
    let mut joined = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).context("a chunk size")?;
        if size == 0 {
            break;
        }
        joined.push_str(after.get(..size).context("a whole chunk")?);
        rest = after.get(size + 2..).unwrap_or("");
    }
    Ok(joined)
}

/// Binds queue `queue` to `exchange` with `key`.
pub async fn bind(exchange: &str, queue: &str, key: &str) -> anyhow::Result<()> {
    let body = format!(r#"{{"routing_key":"{key}"}}"#);
    let path = format!("/api/bindings/%2F/e/{exchange}/q/{queue}");
    let (status, response) = request("POST", &path, &body).await?;
    anyhow::ensure!(
        matches!(status, 201 | 204),
        "bind {queue} to {exchange} with {key}: {response}"
    );
    Ok(())
}
