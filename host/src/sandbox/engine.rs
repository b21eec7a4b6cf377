use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::Handler;
use super::module::{LoadError, Module};
use super::store::StoreState;

/// How often the epoch advances. A running handler yields to the async
/// runtime at every tick and its deadline is checked then, so this bounds
/// both how long one guest can hold a worker thread and timeout precision.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The wasmtime engine and linker shared by every module of the host.
pub struct Sandbox {
    engine: Engine,
    linker: Linker<StoreState>,
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
        Handler::add_to_linker::<_, HasSelf<StoreState>>(&mut linker, |state| state)
            .map_err(to_anyhow)?;
        let ticker = EpochTicker::start(engine.clone());
        Ok(Sandbox {
            engine,
            linker,
            _ticker: ticker,
        })
    }

    /// Compiles a component and checks it is a handler: it exports `handle`
    /// with the world's signature and imports nothing the host lacks.
    pub fn load(&self, path: &Path) -> Result<Module, LoadError> {
        Module::load(&self.engine, &self.linker, path)
    }
}

fn config(pooling: bool) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true).epoch_interruption(true);
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        // Instances are per delivery: the pool bounds how many run at once
        // across all mounts.
        pool.total_component_instances(1000)
            .total_core_instances(4000)
            .total_memories(1000)
            .total_tables(2000);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

fn to_anyhow(e: wasmtime::Error) -> anyhow::Error {
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
