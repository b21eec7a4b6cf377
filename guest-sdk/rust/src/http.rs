//! Outbound HTTP through `wasi:http`, one blocking call at a time.
//!
//! The host makes the request only to origins the mount's `grants.http`
//! lists; anything else fails with [`HttpError::Denied`]. The mount's
//! `timeout` covers the whole call. HTTP calls are not part of the
//! delivery's settlement: a handler that retries calls again.
//!
//! ```no_run
//! use wharf_guest::{http, Delivery, Outcome};
//!
//! fn handle(d: Delivery) -> Outcome {
//!     match http::get("http://127.0.0.1:8080/prices") {
//!         Ok(response) if response.status == 200 => Outcome::Ack,
//!         Ok(_) | Err(_) => Outcome::Retry,
//!     }
//! }
//! # wharf_guest::handler!(handle);
//! ```

use std::fmt;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasip2::io::streams::StreamError;

/// A response, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The header fields, names in lower case.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (any case), as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// The body as text, if it is UTF-8.
    pub fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The mount's `grants.http` does not list the origin, or the address
    /// it resolves to is one handlers may not reach.
    Denied,
    /// The URL is not `http://` or `https://` with a host.
    BadUrl(String),
    /// The request could not be made or answered (connection, TLS,
    /// protocol); the text is the host's error code.
    Failed(String),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Denied => f.write_str("denied: not in the mount's grants.http"),
            HttpError::BadUrl(url) => write!(f, "not an http(s) URL: {url}"),
            HttpError::Failed(why) => write!(f, "request failed: {why}"),
        }
    }
}

impl std::error::Error for HttpError {}

impl From<ErrorCode> for HttpError {
    fn from(code: ErrorCode) -> HttpError {
        match code {
            ErrorCode::HttpRequestDenied => HttpError::Denied,
            other => HttpError::Failed(format!("{other:?}")),
        }
    }
}

/// `GET url`.
pub fn get(url: &str) -> Result<Response, HttpError> {
    request("GET", url, &[], &[])
}

/// `POST url` with `body` of type `content_type`.
pub fn post(url: &str, content_type: &str, body: &[u8]) -> Result<Response, HttpError> {
    request("POST", url, &[("content-type", content_type)], body)
}

/// Any request: `method` (`GET`, `POST`, ...), `url`, header fields and a
/// body (empty for none).
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, HttpError> {
    let bad_url = || HttpError::BadUrl(url.to_owned());
    let (scheme, rest) = url.split_once("://").ok_or_else(bad_url)?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => return Err(bad_url()),
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(bad_url());
    }
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    let fields: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
        .collect();
    let fields = Fields::from_list(&fields)
        .map_err(|e| HttpError::Failed(format!("header fields: {e:?}")))?;
    let outgoing = OutgoingRequest::new(fields);
    let refused = |what: &str| HttpError::Failed(format!("the host refused the {what}"));
    outgoing
        .set_method(&method_of(method))
        .map_err(|()| refused("method"))?;
    outgoing
        .set_scheme(Some(&scheme))
        .map_err(|()| refused("scheme"))?;
    outgoing
        .set_authority(Some(authority))
        .map_err(|()| refused("authority"))?;
    outgoing
        .set_path_with_query(Some(&path))
        .map_err(|()| refused("path"))?;
    let outgoing_body = outgoing.body().map_err(|()| refused("body"))?;
    let pending = outgoing_handler::handle(outgoing, None)?;
    {
        let stream = outgoing_body.write().map_err(|()| refused("body"))?;
        // The host takes at most 4096 bytes per blocking write.
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(stream_error)?;
        }
    }
    OutgoingBody::finish(outgoing_body, None)?;
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(code.into()),
        Some(Err(())) | None => return Err(HttpError::Failed("no response".to_owned())),
    };
    let status = response.status();
    let headers = response.headers().entries();
    let incoming = response.consume().map_err(|()| refused("response body"))?;
    let mut body = Vec::new();
    {
        let stream = incoming.stream().map_err(|()| refused("response body"))?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => body.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(e) => return Err(stream_error(e)),
            }
        }
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn method_of(method: &str) -> Method {
    match method.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "OPTIONS" => Method::Options,
        other => Method::Other(other.to_owned()),
    }
}

fn stream_error(error: StreamError) -> HttpError {
    match error {
        StreamError::Closed => HttpError::Failed("the stream closed".to_owned()),
        StreamError::LastOperationFailed(e) => HttpError::Failed(e.to_debug_string()),
    }
}
