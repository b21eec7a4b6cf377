//! Capability grants: which WASI interfaces a mount's handlers may really
//! use. Every WASI interface stays linked, because toolchains' standard
//! libraries import many they never call; an ungranted one denies at call
//! time. Clocks and random fail the call (the handler then fails and is
//! retried); the environment is empty. Either way the log names the grant
//! the mount would need.

use std::collections::BTreeMap;

use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::cli::WasiCliView as _;
use wasmtime_wasi::clocks::WasiClocksView as _;
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::cli::environment;
use wasmtime_wasi::p2::bindings::clocks::{monotonic_clock, wall_clock};
use wasmtime_wasi::p2::bindings::random::{insecure, insecure_seed, random};
use wasmtime_wasi::random::WasiRandomView as _;

use super::http::HttpGrants;
use super::store::StoreState;

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
    /// Whether the handler may `reply` to a delivery's `reply-to`.
    pub reply: bool,
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

/// A WASI call the mount has not been granted. It fails the handler call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "called `{function}`, which this mount does not grant; add `{grant} = true` to the mount's [grants]"
)]
pub struct Denied {
    /// The WASI function, e.g. `wasi:random/random.get-random-bytes`.
    pub function: &'static str,
    /// The grant key that would allow it.
    pub grant: &'static str,
}

/// Replaces the stock WASI clocks, random and environment with versions
/// that check the store's grants first.
pub(crate) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    wall_clock::add_to_linker::<_, Guarded>(linker, guard)?;
    monotonic_clock::add_to_linker::<_, Guarded>(linker, guard)?;
    random::add_to_linker::<_, Guarded>(linker, guard)?;
    insecure::add_to_linker::<_, Guarded>(linker, guard)?;
    insecure_seed::add_to_linker::<_, Guarded>(linker, guard)?;
    environment::add_to_linker::<_, Guarded>(linker, guard)?;
    linker.allow_shadowing(false);
    Ok(())
}

struct Guarded;

impl HasData for Guarded {
    type Data<'a> = GuardedView<'a>;
}

fn guard(state: &mut StoreState) -> GuardedView<'_> {
    GuardedView { state }
}

/// The store, seen by the guarded WASI functions.
struct GuardedView<'a> {
    state: &'a mut StoreState,
}

impl GuardedView<'_> {
    fn clocks(&mut self, function: &'static str) -> wasmtime::Result<()> {
        self.require(self.state.setup.grants.clocks, function, "clocks")
    }

    fn random(&mut self, function: &'static str) -> wasmtime::Result<()> {
        self.require(self.state.setup.grants.random, function, "random")
    }

    fn require(
        &mut self,
        granted: bool,
        function: &'static str,
        grant: &'static str,
    ) -> wasmtime::Result<()> {
        if granted {
            Ok(())
        } else {
            Err(wasmtime::Error::new(Denied { function, grant }))
        }
    }
}

impl wall_clock::Host for GuardedView<'_> {
    fn now(&mut self) -> wasmtime::Result<wall_clock::Datetime> {
        self.clocks("wasi:clocks/wall-clock.now")?;
        wall_clock::Host::now(&mut self.state.clocks())
    }

    fn resolution(&mut self) -> wasmtime::Result<wall_clock::Datetime> {
        self.clocks("wasi:clocks/wall-clock.resolution")?;
        wall_clock::Host::resolution(&mut self.state.clocks())
    }
}

impl monotonic_clock::Host for GuardedView<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        self.clocks("wasi:clocks/monotonic-clock.now")?;
        monotonic_clock::Host::now(&mut self.state.clocks())
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        self.clocks("wasi:clocks/monotonic-clock.resolution")?;
        monotonic_clock::Host::resolution(&mut self.state.clocks())
    }

    fn subscribe_instant(
        &mut self,
        when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.clocks("wasi:clocks/monotonic-clock.subscribe-instant")?;
        monotonic_clock::Host::subscribe_instant(&mut self.state.clocks(), when)
    }

    fn subscribe_duration(
        &mut self,
        duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.clocks("wasi:clocks/monotonic-clock.subscribe-duration")?;
        monotonic_clock::Host::subscribe_duration(&mut self.state.clocks(), duration)
    }
}

impl random::Host for GuardedView<'_> {
    fn get_random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        self.random("wasi:random/random.get-random-bytes")?;
        random::Host::get_random_bytes(self.state.random(), len)
    }

    fn get_random_u64(&mut self) -> wasmtime::Result<u64> {
        self.random("wasi:random/random.get-random-u64")?;
        random::Host::get_random_u64(self.state.random())
    }
}

impl insecure::Host for GuardedView<'_> {
    fn get_insecure_random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        self.random("wasi:random/insecure.get-insecure-random-bytes")?;
        insecure::Host::get_insecure_random_bytes(self.state.random(), len)
    }

    fn get_insecure_random_u64(&mut self) -> wasmtime::Result<u64> {
        self.random("wasi:random/insecure.get-insecure-random-u64")?;
        insecure::Host::get_insecure_random_u64(self.state.random())
    }
}

impl insecure_seed::Host for GuardedView<'_> {
    fn insecure_seed(&mut self) -> wasmtime::Result<(u64, u64)> {
        self.random("wasi:random/insecure-seed.insecure-seed")?;
        insecure_seed::Host::insecure_seed(self.state.random())
    }
}

impl environment::Host for GuardedView<'_> {
    fn get_environment(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        if self.state.setup.grants.env.is_empty() {
            self.state.note_empty_environment();
        }
        environment::Host::get_environment(&mut self.state.cli())
    }

    fn get_arguments(&mut self) -> wasmtime::Result<Vec<String>> {
        environment::Host::get_arguments(&mut self.state.cli())
    }

    fn initial_cwd(&mut self) -> wasmtime::Result<Option<String>> {
        environment::Host::initial_cwd(&mut self.state.cli())
    }
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
