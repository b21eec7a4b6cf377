//! Sending batches of spans to a collector: OTLP over HTTP (protobuf) or
//! gRPC, plain `http://`, configured as the OpenTelemetry specification's
//! exporter variables say.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Uri};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use wharf_core::config::{OtlpProtocol, Telemetry as TelemetryConfig};
use wharf_core::endpoint::percent_decode;

/// The gRPC method spans are exported with.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The most of a collector's answer that is read.
const ANSWER_LIMIT: usize = 64 * 1024;

/// Where and how batches are sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Destination {
    /// The request's URL: the traces path over HTTP, the method over gRPC.
    pub url: Uri,
    /// gRPC rather than HTTP/protobuf.
    pub grpc: bool,
    /// Headers every export carries (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_TIMEOUT`).
    pub timeout: Duration,
}

impl Destination {
    /// The destination `[telemetry]` and the environment (`set`: a
    /// variable, when set and not blank) give. A variable that cannot be
    /// read is reported in `warnings` and left out; an endpoint that is not
    /// plain `http://` is refused, naming where it came from.
    pub fn resolve(
        config: &TelemetryConfig,
        set: &dyn Fn(&str) -> Option<String>,
        warnings: &mut Vec<String>,
    ) -> Result<Destination, String> {
        let first = |names: &[&'static str]| {
            names
                .iter()
                .copied()
                .find_map(|name| set(name).map(|value| (name, value.trim().to_owned())))
        };
        let grpc = match config.protocol {
            Some(protocol) => protocol == OtlpProtocol::Grpc,
            None => match first(&[
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ]) {
                Some((_, value)) if value == "grpc" => true,
                Some((_, value)) if value == "http/protobuf" => false,
                Some((name, value)) => {
                    warnings.push(format!(
                        "{name}={value}: wharf sends http/protobuf or grpc; using http/protobuf"
                    ));
                    false
                }
                None => false,
            },
        };
        // Only the base endpoint gets the traces path; a traces endpoint,
        // in the file or its own variable, is used as it is.
        let (source, endpoint) = match (
            &config.endpoint,
            first(&["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]),
        ) {
            (Some(endpoint), _) => ("[telemetry] endpoint", with_path(endpoint, grpc)),
            (None, Some((name, endpoint))) => (name, endpoint),
            (None, None) => match first(&["OTEL_EXPORTER_OTLP_ENDPOINT"]) {
                Some((name, endpoint)) => (name, with_path(&endpoint, grpc)),
                None if grpc => ("the default endpoint", "http://localhost:4317".to_owned()),
                None => (
                    "the default endpoint",
                    "http://localhost:4318/v1/traces".to_owned(),
                ),
            },
        };
        let url = endpoint
            .parse::<Uri>()
            .map_err(|e| format!("{source} {endpoint}: {e}"))?;
        if url.scheme_str() != Some("http") || url.authority().is_none() {
            return Err(format!(
                "{source} {endpoint}: wharf exports to a plain http:// endpoint (a collector beside it forwards over TLS)"
            ));
        }
        let url = if grpc {
            let authority = url.authority().map(|a| a.as_str()).unwrap_or_default();
            format!("http://{authority}{GRPC_EXPORT}")
                .parse()
                .map_err(|e| format!("{source} {endpoint}: {e}"))?
        } else {
            url
        };
        let headers = match first(&[
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ]) {
            Some((name, list)) => headers(&list).unwrap_or_else(|bad| {
                warnings.push(format!("{name}: {bad}; sending no headers"));
                Vec::new()
            }),
            None => Vec::new(),
        };
        let timeout = match first(&[
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]) {
            Some((name, millis)) => {
                millis
                    .parse()
                    .map(Duration::from_millis)
                    .unwrap_or_else(|_| {
                        warnings.push(format!(
                            "{name}={millis} is not a whole number of milliseconds; using 10000"
                        ));
                        Duration::from_secs(10)
                    })
            }
            None => Duration::from_secs(10),
        };
        if let Some((name, compression)) = first(&[
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ])
        .filter(|(_, value)| value != "none")
        {
            warnings.push(format!(
                "{name}={compression}: wharf sends spans uncompressed"
            ));
        }
        Ok(Destination {
            url,
            grpc,
            headers,
            timeout,
        })
    }
}

/// A base URL as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it, with the traces
/// path added over HTTP when it has none.
fn with_path(endpoint: &str, grpc: bool) -> String {
    match url::Url::parse(endpoint) {
        Ok(url) if !grpc && (url.path() == "/" || url.path().is_empty()) => {
            format!("{}/v1/traces", endpoint.trim_end_matches('/'))
        }
        _ => endpoint.to_owned(),
    }
}

/// `key=value,key=value` with percent-encoded values, as the
/// `OTEL_EXPORTER_OTLP_HEADERS` variable has them.
fn headers(list: &str) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    list.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not key=value"))?;
            let name = HeaderName::try_from(name.trim())
                .map_err(|_| format!("`{}` is not a header name", name.trim()))?;
            let value = percent_decode(value.trim())
                .and_then(|value| HeaderValue::try_from(value).ok())
                .ok_or_else(|| format!("the value of `{name}` is not a header value"))?;
            Ok((name, value))
        })
        .collect()
}

/// Sends batches to one destination over connections it keeps.
pub struct Sender {
    destination: Destination,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Sender {
    /// A sender to `destination`; it connects with its first export.
    pub fn new(destination: Destination) -> Sender {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(destination.timeout));
        let client = Client::builder(TokioExecutor::new())
            .http2_only(destination.grpc)
            .build(connector);
        Sender {
            destination,
            client,
        }
    }

    /// How many bytes of room a request needs before its message (gRPC's
    /// message header).
    pub fn prefix(&self) -> usize {
        if self.destination.grpc { 5 } else { 0 }
    }

    /// Sends the request at `start` in `message` (its first
    /// [`Sender::prefix`] bytes kept as room), within the destination's
    /// timeout.
    pub async fn send(&self, mut message: Vec<u8>, start: usize) -> Result<(), String> {
        if self.destination.grpc {
            // Uncompressed (a zero flag), then the length.
            let len = u32::try_from(message.len() - start - 5).map_err(|_| "a batch over 4 GiB")?;
            message[start] = 0;
            message[start + 1..start + 5].copy_from_slice(&len.to_be_bytes());
        }
        let message = Bytes::from(message).slice(start..);
        let timeout = self.destination.timeout;
        match tokio::time::timeout(timeout, self.exchange(message)).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            )),
        }
    }

    async fn exchange(&self, message: Bytes) -> Result<(), String> {
        let grpc = self.destination.grpc;
        let mut request = Request::post(self.destination.url.clone());
        if let Some(headers) = request.headers_mut() {
            for (name, value) in &self.destination.headers {
                headers.insert(name, value.clone());
            }
        }
        let request = if grpc {
            request
                .header("content-type", "application/grpc")
                .header("te", "trailers")
        } else {
            request.header("content-type", "application/x-protobuf")
        }
        .body(Full::new(message))
        .map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| with_causes(&e))?;
        let status = response.status();
        let early_status = response.headers().get("grpc-status").cloned();
        let grpc_message = response.headers().get("grpc-message").cloned();
        // A collector answers with a few bytes; more is not read.
        let body = Limited::new(response.into_body(), ANSWER_LIMIT)
            .collect()
            .await
            .map_err(|e| with_causes(&*e))?;
        if !status.is_success() {
            let text = body.to_bytes();
            let text = String::from_utf8_lossy(&text[..text.len().min(200)]).into_owned();
            return Err(format!("the collector answered {status}: {text}"));
        }
        if !grpc {
            return Ok(());
        }
        let trailers = body.trailers();
        let code = early_status.or_else(|| trailers.and_then(|t| t.get("grpc-status")).cloned());
        let message = grpc_message
            .or_else(|| trailers.and_then(|t| t.get("grpc-message")).cloned())
            .map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned())
            .unwrap_or_default();
        match code.as_ref().map(HeaderValue::as_bytes) {
            Some(b"0") => Ok(()),
            Some(code) => Err(format!(
                "the collector answered gRPC status {}: {message}",
                String::from_utf8_lossy(code)
            )),
            None => Err("the collector's answer has no gRPC status".to_owned()),
        }
    }
}

/// An error and what caused it, on one line.
fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(config: &str, env: &[(&str, &str)]) -> (Result<Destination, String>, Vec<String>) {
        let config: TelemetryConfig = toml::from_str(config).expect("a [telemetry] section");
        let mut warnings = Vec::new();
        let set = |name: &str| {
            env.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        };
        (Destination::resolve(&config, &set, &mut warnings), warnings)
    }

    #[test]
    fn the_endpoint_comes_from_the_file_then_the_traces_variable_then_the_base_one() {
        let url = |config: &str, env: &[(&str, &str)]| {
            resolve(config, env).0.expect("valid").url.to_string()
        };
        assert_eq!(url("", &[]), "http://localhost:4318/v1/traces");
        assert_eq!(
            url("protocol = \"grpc\"", &[]),
            format!("http://localhost:4317{GRPC_EXPORT}")
        );
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        assert_eq!(url("", &base), "http://c:4318/v1/traces");
        let both = [
            base[0],
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/mine"),
        ];
        assert_eq!(url("", &both), "http://t:1/mine", "used as it is");
        assert_eq!(
            url("endpoint = \"http://f:2/\"", &both),
            "http://f:2/v1/traces"
        );
        assert_eq!(
            url("endpoint = \"http://f:2/otlp/v1/traces\"", &[]),
            "http://f:2/otlp/v1/traces"
        );
        let grpc = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://g:4317"),
        ];
        assert_eq!(url("", &grpc), format!("http://g:4317{GRPC_EXPORT}"));
        let refused = resolve("endpoint = \"https://c:4318\"", &[]).0;
        let refused = refused.expect_err("plain http only");
        assert!(
            refused.contains("[telemetry] endpoint https://c:4318"),
            "{refused}"
        );
    }

    #[test]
    fn headers_timeout_and_protocol_are_read_and_bad_values_warned_about() {
        let (destination, warnings) = resolve(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b%2Cc, tenant=x"),
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ],
        );
        let destination = destination.expect("valid");
        assert_eq!(destination.headers.len(), 2);
        assert_eq!(destination.headers[0].0, "api-key");
        assert_eq!(destination.headers[0].1, "a b,c");
        assert_eq!(destination.timeout, Duration::from_millis(2500));
        assert!(!destination.grpc);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("http/json") && warnings[1].contains("gzip"));

        let (destination, warnings) = resolve(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
            ],
        );
        let destination = destination.expect("valid");
        assert!(destination.headers.is_empty());
        assert_eq!(destination.timeout, Duration::from_secs(10));
        assert_eq!(warnings.len(), 2, "{warnings:?}");
    }
}
