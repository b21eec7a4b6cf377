//! Capability grants: which WASI interfaces a mount's handlers may really
//! use. Every WASI interface stays importable, because toolchains' standard
//! libraries import many they never call; an ungranted one denies at call
//! time. Clocks and random fail the call (the handler then fails and is
//! retried); the environment is empty. A mount without `grants.http` gets
//! no `wasi:http` at all: its imports are stubs that deny, so nothing of it
//! (headers, bodies, connections) is ever held on the host. Either way the
//! log names the grant the mount would need.

use std::borrow::Cow;

use std::marker::PhantomData;
use wasmtime::Engine;
use wasmtime::component::types::ComponentItem;

use wasmtime::component::{Component, HasData, Linker, Resource};
use wasmtime_wasi::WasiView;
use wasmtime_wasi::cli::WasiCliView as _;
use wasmtime_wasi::clocks::WasiClocksView as _;
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::cli::environment;
use wasmtime_wasi::p2::bindings::clocks::{monotonic_clock, wall_clock};
use wasmtime_wasi::p2::bindings::random::{insecure, insecure_seed, random};
use wasmtime_wasi::random::WasiRandomView as _;

use wharf_core::grants::Grants;

/// A WASI call the mount has not been granted. It fails the handler call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "called `{function}`, which this mount does not grant; add `{grant}` to the mount's [grants]"
)]
pub struct Denied {
    /// The WASI function, e.g. `wasi:random/random.get-random-bytes`.
    pub function: Cow<'static, str>,
    /// The grant that would allow it, e.g. `random = true`.
    pub grant: &'static str,
}

/// A store whose WASI clocks, random and environment are checked against
/// grants: what this capability needs of it.
pub(crate) trait Granted: WasiView + 'static {
    /// What the mount grants.
    fn grants(&self) -> &Grants;
    /// The handler asked for an environment and none is granted: worth a
    /// note in the log, once.
    fn note_empty_environment(&self);
}

/// Replaces the stock WASI clocks, random and environment with versions
/// that check the store's grants first.
pub(crate) fn add_to_linker<T: Granted>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    wall_clock::add_to_linker::<_, Guarded<T>>(linker, guard)?;
    monotonic_clock::add_to_linker::<_, Guarded<T>>(linker, guard)?;
    random::add_to_linker::<_, Guarded<T>>(linker, guard)?;
    insecure::add_to_linker::<_, Guarded<T>>(linker, guard)?;
    insecure_seed::add_to_linker::<_, Guarded<T>>(linker, guard)?;
    environment::add_to_linker::<_, Guarded<T>>(linker, guard)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// `base` (every interface but `wasi:http`) with every `wasi:http`
/// interface `component` imports defined as stubs that deny: the linker of
/// a mount without `grants.http`. Its resource types are those of `full`,
/// which links the real `wasi:http`, so the component's other imports
/// (streams, pollables) still match; none of them is ever constructed.
pub(crate) fn without_http<T: 'static>(
    full: &Linker<T>,
    base: &Linker<T>,
    engine: &Engine,
    component: &Component,
) -> wasmtime::Result<Linker<T>> {
    let mut linker = base.clone();
    let ty = full.substituted_component_type(component)?;
    for (name, import) in ty.imports(engine) {
        let ComponentItem::ComponentInstance(instance) = import.ty else {
            continue;
        };
        if !name.starts_with("wasi:http/") {
            continue;
        }
        let mut stubs = linker.instance(name)?;
        for (item, export) in instance.exports(engine) {
            match export.ty {
                ComponentItem::ComponentFunc(_) => {
                    let function: Cow<'static, str> = format!("{name}#{item}").into();
                    stubs.func_new(item, move |_, _, _, _| {
                        Err(wasmtime::Error::new(Denied {
                            function: function.clone(),
                            grant: "http = [\"<origin>\", ...]",
                        }))
                    })?;
                }
                // Never constructed: every function that would make one
                // denies.
                ComponentItem::Resource(resource) => {
                    stubs.resource(item, resource, |_, _| Ok(()))?;
                }
                _ => {}
            }
        }
    }
    Ok(linker)
}

struct Guarded<T>(PhantomData<T>);

impl<T: Granted> HasData for Guarded<T> {
    type Data<'a> = GuardedView<'a, T>;
}

fn guard<T: Granted>(state: &mut T) -> GuardedView<'_, T> {
    GuardedView { state }
}

/// The store, seen by the guarded WASI functions.
struct GuardedView<'a, T> {
    state: &'a mut T,
}

impl<T: Granted> GuardedView<'_, T> {
    fn clocks(&mut self, function: &'static str) -> wasmtime::Result<()> {
        self.require(self.state.grants().clocks, function, "clocks = true")
    }

    fn random(&mut self, function: &'static str) -> wasmtime::Result<()> {
        self.require(self.state.grants().random, function, "random = true")
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
            Err(wasmtime::Error::new(Denied {
                function: function.into(),
                grant,
            }))
        }
    }
}

impl<T: Granted> wall_clock::Host for GuardedView<'_, T> {
    fn now(&mut self) -> wasmtime::Result<wall_clock::Datetime> {
        self.clocks("wasi:clocks/wall-clock.now")?;
        wall_clock::Host::now(&mut self.state.clocks())
    }

    fn resolution(&mut self) -> wasmtime::Result<wall_clock::Datetime> {
        self.clocks("wasi:clocks/wall-clock.resolution")?;
        wall_clock::Host::resolution(&mut self.state.clocks())
    }
}

impl<T: Granted> monotonic_clock::Host for GuardedView<'_, T> {
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

impl<T: Granted> random::Host for GuardedView<'_, T> {
    fn get_random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        self.random("wasi:random/random.get-random-bytes")?;
        random::Host::get_random_bytes(self.state.random(), len)
    }

    fn get_random_u64(&mut self) -> wasmtime::Result<u64> {
        self.random("wasi:random/random.get-random-u64")?;
        random::Host::get_random_u64(self.state.random())
    }
}

impl<T: Granted> insecure::Host for GuardedView<'_, T> {
    fn get_insecure_random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        self.random("wasi:random/insecure.get-insecure-random-bytes")?;
        insecure::Host::get_insecure_random_bytes(self.state.random(), len)
    }

    fn get_insecure_random_u64(&mut self) -> wasmtime::Result<u64> {
        self.random("wasi:random/insecure.get-insecure-random-u64")?;
        insecure::Host::get_insecure_random_u64(self.state.random())
    }
}

impl<T: Granted> insecure_seed::Host for GuardedView<'_, T> {
    fn insecure_seed(&mut self) -> wasmtime::Result<(u64, u64)> {
        self.random("wasi:random/insecure-seed.insecure-seed")?;
        insecure_seed::Host::insecure_seed(self.state.random())
    }
}

impl<T: Granted> environment::Host for GuardedView<'_, T> {
    fn get_environment(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        if self.state.grants().env.is_empty() {
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
