//! Capability grants: what a mount's handlers may use beyond computing on
//! their delivery, as the config declares it. The sandbox enforces them.

mod destinations;
mod http;

use std::collections::BTreeMap;

pub use destinations::{AddressOwners, Refusal, ReplyGrant, system_name};
pub use http::{BadHttpPattern, Guarded, Host, HttpGrants, HttpPattern, Target, guarded};

/// What a mount's handlers may use beyond computing on their delivery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// `wasi:clocks/wall-clock` and `wasi:clocks/monotonic-clock`.
    pub clocks: bool,
    /// `wasi:random/random`, `insecure` and `insecure-seed`.
    pub random: bool,
    /// The environment variables `wasi:cli/environment` returns.
    pub env: BTreeMap<String, String>,
    /// Where the handler's stdout and stderr go.
    pub output: Output,
    /// Addresses the handler may `send` to.
    pub send: Vec<AddressPattern>,
    /// Whether, and where, the handler may `reply` to a delivery's
    /// `reply-to`.
    pub reply: ReplyGrant,
    /// How much one delivery may publish.
    pub outputs: OutputLimits,
    /// Whom the handler may call over HTTP.
    pub http: HttpGrants,
}

/// An address, or with `*` standing for any run of characters a family of
/// them (`orders.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressPattern(String);

impl AddressPattern {
    /// The pattern `text`.
    pub fn new(text: impl Into<String>) -> AddressPattern {
        AddressPattern(text.into())
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it names exactly one address.
    pub fn is_literal(&self) -> bool {
        !self.0.contains('*')
    }

    /// Whether `address` is one the pattern names.
    pub fn matches(&self, address: &str) -> bool {
        let mut parts = self.0.split('*');
        let first = parts.next().unwrap_or_default();
        let Some(mut rest) = address.strip_prefix(first) else {
            return false;
        };
        let parts: Vec<&str> = parts.collect();
        let Some((last, middle)) = parts.split_last() else {
            return rest.is_empty();
        };
        for part in middle {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last)
    }
}

/// The most one delivery may publish through the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    /// Messages.
    pub max_outputs: u32,
    /// Bytes of bodies, properties and addresses together.
    pub max_output_bytes: u64,
}

impl OutputLimits {
    /// Default `max_outputs` of a mount.
    pub const DEFAULT_MAX_OUTPUTS: u32 = 100;
    /// Default `max_output_bytes` of a mount.
    pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1 << 20;
}

impl Default for OutputLimits {
    fn default() -> OutputLimits {
        OutputLimits {
            max_outputs: OutputLimits::DEFAULT_MAX_OUTPUTS,
            max_output_bytes: OutputLimits::DEFAULT_MAX_OUTPUT_BYTES,
        }
    }
}

/// Where a handler's stdout and stderr go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    /// Into the host log, line by line, tagged with tenant and mount.
    #[default]
    Log,
    /// Nowhere.
    Drop,
}

#[cfg(test)]
mod tests {
    use super::AddressPattern;

    #[test]
    fn patterns_match_by_wildcard() {
        let cases = [
            ("audit", "audit", true),
            ("audit", "audits", false),
            ("orders.*", "orders.eu", true),
            ("orders.*", "orders.", true),
            ("orders.*", "order", false),
            ("*", "anything", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxcyyb", false),
            ("*.dlq", "orders.dlq", true),
            ("ab*ba", "aba", false),
        ];
        for (pattern, address, expected) in cases {
            assert_eq!(
                AddressPattern::new(pattern).matches(address),
                expected,
                "{pattern} ~ {address}"
            );
        }
    }
}
