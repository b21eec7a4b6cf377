//! Capability grants: which WASI interfaces a mount's handlers may really
//! use. Every WASI interface stays linked, because toolchains' standard
//! libraries import many they never call; an ungranted one denies at call
//! time. Clocks and random fail the call (the handler then fails and is
//! retried); the environment is empty. Either way the log names the grant
//! the mount would need.

use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::cli::WasiCliView as _;
use wasmtime_wasi::clocks::WasiClocksView as _;
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::cli::environment;
use wasmtime_wasi::p2::bindings::clocks::{monotonic_clock, wall_clock};
use wasmtime_wasi::p2::bindings::random::{insecure, insecure_seed, random};
use wasmtime_wasi::random::WasiRandomView as _;

use super::store::StoreState;

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
