use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use wasmtime::component::Linker;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings;
use super::disk_cache::DiskCache;
use super::grants;
use super::instances::InstanceSlots;
use super::log::HasLog;
use super::module::{
    Compiled, LoadError, MAX_MEMORIES_PER_COMPONENT, MAX_TABLES_PER_COMPONENT, Module,
};
use super::outbox::HasOutbox;
use super::store::StoreState;
use crate::sync::Locked;
use wharf_core::config::Mount;

/// How often the epoch advances. A running handler yields to the async
/// runtime at every tick and its deadline is checked then, so this bounds
/// both how long one guest can hold a worker thread and timeout precision.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Hex digits of the content digest shown as a module's version.
const VERSION_DIGITS: usize = 12;

/// The wasmtime engine and linker shared by every module of the host.
/// Clones share them.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    linker: Linker<StoreState>,
    /// The same without `wasi:http`, whose imports each module gets as
    /// stubs that deny, for mounts without `grants.http`.
    without_http: Linker<StoreState>,
    /// Compiled code by content digest, so a module used by many mounts (or
    /// reloaded unchanged) is compiled once and kept once.
    compiled: Mutex<HashMap<String, Weak<Compiled>>>,
    /// Compiled code kept between starts, where the config asks for it.
    disk: Option<DiskCache>,
    slots: InstanceSlots,
    _ticker: EpochTicker,
}

/// Core instances one component may create.
const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 200;
/// Memories and tables per instance, on average, that the pool holds room
/// for; a component needing more takes more of the pool per instance.
const MEMORIES_PER_INSTANCE: u32 = 2;
const TABLES_PER_INSTANCE: u32 = 4;
const CORE_INSTANCES_PER_INSTANCE: u32 = 20;
/// How much of a memory, table and async stack is kept resident between
/// instances (and reset in place) rather than given back to the kernel.
const KEEP_RESIDENT: usize = 1 << 20;

/// Instances kept outside the mounts' share, for probing a module before it
/// is swapped in.
const PROBE_INSTANCES: u32 = 2;

impl Sandbox {
    /// Creates the engine: component model, epoch interruption, and the
    /// pooling allocator holding `instances` instances where its address
    /// space can be reserved (otherwise on-demand allocation). The pool is
    /// the host's ceiling, not what the mounts of one config need, so mounts
    /// added by a reload find room in it.
    pub fn new(instances: u32) -> anyhow::Result<Sandbox> {
        Sandbox::with_module_cache(instances, None)
    }

    /// [`Sandbox::new`], keeping compiled modules in `module_cache` between
    /// starts.
    pub fn with_module_cache(
        instances: u32,
        module_cache: Option<&Path>,
    ) -> anyhow::Result<Sandbox> {
        let slots = InstanceSlots::new(
            instances,
            instances
                .saturating_mul(MEMORIES_PER_INSTANCE)
                .max(MAX_MEMORIES_PER_COMPONENT),
            instances
                .saturating_mul(TABLES_PER_INSTANCE)
                .max(MAX_TABLES_PER_COMPONENT),
        );
        let engine = match Engine::new(&config(Some((instances, &slots)))) {
            Ok(engine) => engine,
            Err(e) => {
                tracing::warn!(error = %e, "pooling allocator unavailable; allocating instances on demand");
                Engine::new(&config(None)).map_err(to_anyhow)?
            }
        };
        let mut without_http = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut without_http).map_err(to_anyhow)?;
        grants::add_to_linker(&mut without_http).map_err(to_anyhow)?;
        // Each import linked to its own part of the store.
        bindings::wharf::handler::log::add_to_linker::<_, HasLog>(
            &mut without_http,
            StoreState::log_view,
        )
        .map_err(to_anyhow)?;
        bindings::wharf::handler::outbox::add_to_linker::<_, HasOutbox>(
            &mut without_http,
            StoreState::outbox_view,
        )
        .map_err(to_anyhow)?;
        super::bindings_0_2::wharf::handler::log::add_to_linker::<_, HasLog>(
            &mut without_http,
            StoreState::log_view,
        )
        .map_err(to_anyhow)?;
        super::bindings_0_2::wharf::handler::outbox::add_to_linker::<_, HasOutbox>(
            &mut without_http,
            StoreState::outbox_view,
        )
        .map_err(to_anyhow)?;
        super::bindings_0_1::wharf::handler::log::add_to_linker::<_, HasLog>(
            &mut without_http,
            StoreState::log_view,
        )
        .map_err(to_anyhow)?;
        let mut linker = without_http.clone();
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(to_anyhow)?;
        let ticker = EpochTicker::start(engine.clone());
        let disk = module_cache.map(|folder| DiskCache::new(folder, &engine));
        Ok(Sandbox {
            inner: Arc::new(Inner {
                engine,
                linker,
                without_http,
                compiled: Mutex::new(HashMap::new()),
                disk,
                slots,
                _ticker: ticker,
            }),
        })
    }

    /// The pool's room, shared by every mount's instances.
    pub fn slots(&self) -> &InstanceSlots {
        &self.inner.slots
    }

    /// Compiles a component and checks it is a handler: it exports `handle`
    /// with the world's signature and imports nothing the host lacks. A file
    /// whose contents were compiled before reuses that code.
    pub fn load(&self, path: &Path) -> Result<Module, LoadError> {
        let bytes = std::fs::read(path).map_err(|e| LoadError {
            path: path.to_owned(),
            reason: format!("cannot be read: {}", wharf_core::words::io(&e)),
        })?;
        let digest = format!("{:x}", Sha256::digest(&bytes));
        if let Some(compiled) = self.cached(&digest) {
            return Ok(Module::from_compiled(compiled, path));
        }
        let version: Arc<str> = digest[..VERSION_DIGITS].into();
        let module = Module::compile(
            &self.inner.engine,
            &self.inner.linker,
            &self.inner.without_http,
            path,
            &bytes,
            version,
            self.inner
                .disk
                .as_ref()
                .map(|cache| (cache, digest.as_str())),
        )?;
        let mut cache = self.cache();
        cache.retain(|_, compiled| compiled.strong_count() > 0);
        cache.insert(digest, Arc::downgrade(&module.compiled));
        Ok(module)
    }

    fn cached(&self, digest: &str) -> Option<Arc<Compiled>> {
        self.cache().get(digest).and_then(Weak::upgrade)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<Compiled>>> {
        self.inner.compiled.locked()
    }
}

fn config(pool: Option<(u32, &InstanceSlots)>) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true).epoch_interruption(true);
    // Names compiled guest functions for `perf` (in /tmp/perf-PID.map), so
    // a profile of the host shows which handler code the time went to.
    if std::env::var_os("WHARF_PERFMAP").is_some_and(|v| v == "1") {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    if let Some((instances, slots)) = pool {
        let instances = instances.saturating_add(PROBE_INSTANCES);
        let (memories, tables) = slots.totals();
        let mut pool = PoolingAllocationConfig::default();
        // Deliveries wait for room in `slots` before they instantiate, so
        // these totals are never reached by the mounts' instances.
        pool.total_component_instances(instances)
            .total_core_instances(instances.saturating_mul(CORE_INSTANCES_PER_INSTANCE))
            .total_memories(memories.saturating_add(PROBE_INSTANCES * MAX_MEMORIES_PER_COMPONENT))
            .total_tables(tables.saturating_add(PROBE_INSTANCES * MAX_TABLES_PER_COMPONENT))
            .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
            .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
            .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
            .max_memories_per_module(MAX_MEMORIES_PER_COMPONENT)
            .max_tables_per_module(MAX_TABLES_PER_COMPONENT)
            .total_stacks(instances)
            // Reset a finished instance's memory by rewriting the pages it
            // dirtied (found with PAGEMAP_SCAN) instead of unmapping them:
            // the next instance then takes no page faults. Most of a fresh
            // instance's cost is otherwise madvise and faulting back in.
            .pagemap_scan(Enabled::Auto)
            .linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(KEEP_RESIDENT)
            .async_stack_keep_resident(KEEP_RESIDENT)
            // Every slot can hold the largest `memory` a mount may ask for, so
            // a reload raising one needs no new pool; the reservation of each
            // memory is 4 GiB anyway. The mounts' ResourceLimiter caps what is
            // used.
            .max_memory_size(usize::try_from(Mount::MAX_MEMORY).unwrap_or(usize::MAX));
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

pub(crate) fn to_anyhow(e: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("{e:?}")
}

/// Advances the engine's epoch on a dedicated thread until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wharf-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawning the epoch thread only fails when the OS is out of threads");
        EpochTicker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
