use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::Handler;
use super::grants;
use super::module::{Compiled, LoadError, Module};
use super::store::StoreState;

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
    /// Compiled code by content digest, so a module used by many mounts (or
    /// reloaded unchanged) is compiled once and kept once.
    compiled: Mutex<HashMap<String, Weak<Compiled>>>,
    _ticker: EpochTicker,
}

impl Sandbox {
    /// Creates the engine: component model, epoch interruption, and the
    /// pooling allocator where its address space can be reserved (otherwise
    /// on-demand allocation).
    pub fn new() -> anyhow::Result<Sandbox> {
        let engine = match Engine::new(&config(true)) {
            Ok(engine) => engine,
            Err(e) => {
                tracing::warn!(error = %e, "pooling allocator unavailable; allocating instances on demand");
                Engine::new(&config(false)).map_err(to_anyhow)?
            }
        };
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(to_anyhow)?;
        grants::add_to_linker(&mut linker).map_err(to_anyhow)?;
        Handler::add_to_linker::<_, HasSelf<StoreState>>(&mut linker, |state| state)
            .map_err(to_anyhow)?;
        let ticker = EpochTicker::start(engine.clone());
        Ok(Sandbox {
            inner: Arc::new(Inner {
                engine,
                linker,
                compiled: Mutex::new(HashMap::new()),
                _ticker: ticker,
            }),
        })
    }

    /// Compiles a component and checks it is a handler: it exports `handle`
    /// with the world's signature and imports nothing the host lacks. A file
    /// whose contents were compiled before reuses that code.
    pub fn load(&self, path: &Path) -> Result<Module, LoadError> {
        let bytes = std::fs::read(path).map_err(|e| LoadError {
            path: path.to_owned(),
            reason: format!("cannot be read: {e}"),
        })?;
        let digest = format!("{:x}", Sha256::digest(&bytes));
        if let Some(compiled) = self.cached(&digest) {
            return Ok(Module::from_compiled(compiled, path));
        }
        let version: Arc<str> = digest[..VERSION_DIGITS].into();
        let module = Module::compile(
            &self.inner.engine,
            &self.inner.linker,
            path,
            &bytes,
            version,
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
        self.inner
            .compiled
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn config(pooling: bool) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true).epoch_interruption(true);
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        // Bounds how many instances exist at once across all mounts: those
        // running a delivery and those kept for reuse.
        pool.total_component_instances(1000)
            .total_core_instances(4000)
            .total_memories(1000)
            .total_tables(2000);
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
