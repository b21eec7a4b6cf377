use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Trap};

use super::contract::HandlerPre;
use super::disk_cache::DiskCache;
use super::grants::{self, Denied};
use super::store::StoreState;

/// The unit linear memory is sized in.
const WASM_PAGE: u64 = 64 * 1024;

/// A module that could not be made ready to run.
#[derive(Debug, thiserror::Error)]
#[error("module `{}`: {reason}", path.display())]
pub struct LoadError {
    /// The component file.
    pub path: PathBuf,
    /// What was wrong with it.
    pub reason: String,
}

/// Why a handler call produced no outcome. Each counts as `retry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// It ran past its time budget.
    Timeout(Duration),
    /// It tried to grow its memory past the budget (in bytes) and then trapped.
    OutOfMemory(u64),
    /// It recursed past the wasm stack limit.
    StackOverflow,
    /// It called a WASI function its mount does not grant.
    NotGranted(Denied),
    /// It trapped (a panic, `unreachable`, a bad memory access, ...).
    Trap(String),
    /// It could not be instantiated (its start code trapped, or the pool of
    /// instances is exhausted).
    Instantiate(String),
    /// Its return value is not a valid outcome.
    InvalidOutcome(String),
}

impl Failure {
    /// A short stable name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Timeout(_) => "timeout",
            Failure::OutOfMemory(_) => "out-of-memory",
            Failure::StackOverflow => "stack-overflow",
            Failure::NotGranted(_) => "not-granted",
            Failure::Trap(_) => "trap",
            Failure::Instantiate(_) => "instantiate",
            Failure::InvalidOutcome(_) => "invalid-outcome",
        }
    }

    /// Sorts a wasmtime error from instantiating or calling a handler.
    pub(crate) fn classify(
        error: &wasmtime::Error,
        timeout: Duration,
        otherwise: fn(String) -> Failure,
    ) -> Failure {
        if let Some(denied) = error.downcast_ref::<Denied>() {
            return Failure::NotGranted(denied.clone());
        }
        match error.downcast_ref::<Trap>() {
            Some(Trap::StackOverflow) => Failure::StackOverflow,
            Some(Trap::Interrupt) => Failure::Timeout(timeout),
            Some(trap) => otherwise(trap_words(error, *trap)),
            None if is_lift_error(error) => {
                Failure::InvalidOutcome(wharf_core::words::chain(error.chain()))
            }
            None => otherwise(wharf_core::words::chain(error.chain())),
        }
    }
}

/// A trap in words on its first line (what the guest did, and for
/// `unreachable` what that usually means), the wasm backtrace after it.
fn trap_words(error: &wasmtime::Error, trap: Trap) -> String {
    let mut text = trap
        .to_string()
        .trim_start_matches("wasm trap: ")
        .to_owned();
    if trap == Trap::UnreachableCodeReached {
        text.push_str(" (the handler panicked or aborted; its stderr says why)");
    }
    if let Some(backtrace) = error.downcast_ref::<wasmtime::WasmBacktrace>() {
        text.push_str(&format!("\n{backtrace}"));
    }
    text
}

/// A return value that cannot be lifted into an `outcome` (a bad variant
/// discriminant, say) surfaces as a plain error rather than a trap.
fn is_lift_error(error: &wasmtime::Error) -> bool {
    format!("{error:?}").contains("discriminant")
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Timeout(t) => write!(f, "ran longer than its timeout of {t:?}"),
            Failure::OutOfMemory(limit) => {
                write!(
                    f,
                    "tried to use more than its memory limit of {limit} bytes"
                )
            }
            Failure::StackOverflow => f.write_str("overflowed its stack"),
            Failure::NotGranted(denied) => denied.fmt(f),
            Failure::Trap(why) => write!(f, "trapped: {why}"),
            Failure::Instantiate(why) => write!(f, "could not be instantiated: {why}"),
            Failure::InvalidOutcome(why) => write!(f, "returned an invalid outcome: {why}"),
        }
    }
}

/// Linear memories one component may define; more is refused at load.
pub const MAX_MEMORIES_PER_COMPONENT: u32 = 8;
/// Tables one component may define; more is refused at load.
pub const MAX_TABLES_PER_COMPONENT: u32 = 16;

/// What one instance of a module takes from the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolNeeds {
    /// Linear memories.
    pub memories: u32,
    /// Tables.
    pub tables: u32,
}

/// A compiled, validated and pre-linked handler component. Clones share
/// the compiled code.
#[derive(Clone)]
pub struct Module {
    pub(super) compiled: Arc<Compiled>,
    path: Arc<Path>,
}

/// The code of a module, shared by every file with the same contents.
pub(super) struct Compiled {
    pub(super) engine: Engine,
    pre: HandlerPre,
    /// The same with `wasi:http` denied, for mounts without `grants.http`.
    pre_without_http: HandlerPre,
    version: Arc<str>,
    needs: PoolNeeds,
    initial_memory: u64,
    /// Loaded from the module cache on disk rather than compiled.
    from_disk: bool,
}

impl Compiled {
    /// The instance template for a mount with (`http`) or without
    /// `grants.http`.
    pub(super) fn pre(&self, http: bool) -> &HandlerPre {
        if http {
            &self.pre
        } else {
            &self.pre_without_http
        }
    }
}

impl Module {
    /// Compiles `bytes` and checks the component against the world.
    pub(super) fn compile(
        engine: &Engine,
        linker: &Linker<StoreState>,
        without_http: &Linker<StoreState>,
        path: &Path,
        bytes: &[u8],
        version: Arc<str>,
        disk: Option<(&DiskCache, &str)>,
    ) -> Result<Module, LoadError> {
        let fail = |reason: String| LoadError {
            path: path.to_owned(),
            reason,
        };
        // Text is read as WebAssembly text only from a `.wat` file: anything
        // else without the binary header is not WebAssembly at all.
        let text = path.extension().is_some_and(|ext| ext == "wat");
        if !text && !bytes.starts_with(b"\0asm") {
            return Err(fail(
                "is not WebAssembly (it does not start with the `\\0asm` header): `module` must name a compiled component, such as `target/wasm32-wasip2/release/<name>.wasm`".to_owned(),
            ));
        }
        // The version field after the header: 1 for a core module.
        if bytes.get(4..8) == Some(&[1, 0, 0, 0]) {
            return Err(fail(
                "is a core WebAssembly module, not a component: build it for `wasm32-wasip2`, or wrap it with `wharf componentize`".to_owned(),
            ));
        }
        let kept = disk.and_then(|(cache, digest)| cache.load(engine, digest));
        let from_disk = kept.is_some();
        let component = match kept {
            Some(component) => component,
            None => {
                let component = Component::new(engine, bytes).map_err(|e| {
                    fail(format!(
                        "is not a valid wasm component: {}",
                        wharf_core::words::chain(e.chain())
                    ))
                })?;
                if let Some((cache, digest)) = disk {
                    cache.save(&component, digest);
                }
                component
            }
        };
        // A component whose core modules are imported cannot be measured;
        // count it at the most a component may take.
        let (needs, initial_memory) = match component.resources_required() {
            Some(required) => {
                if required.num_memories > MAX_MEMORIES_PER_COMPONENT {
                    return Err(fail(format!(
                        "defines {} linear memories; a handler may define at most {MAX_MEMORIES_PER_COMPONENT}",
                        required.num_memories
                    )));
                }
                if required.num_tables > MAX_TABLES_PER_COMPONENT {
                    return Err(fail(format!(
                        "defines {} tables; a handler may define at most {MAX_TABLES_PER_COMPONENT}",
                        required.num_tables
                    )));
                }
                let pages = required.max_initial_memory_size.unwrap_or(0);
                let needs = PoolNeeds {
                    memories: required.num_memories,
                    tables: required.num_tables,
                };
                (needs, pages.saturating_mul(WASM_PAGE))
            }
            None => (
                PoolNeeds {
                    memories: MAX_MEMORIES_PER_COMPONENT,
                    tables: MAX_TABLES_PER_COMPONENT,
                },
                0,
            ),
        };
        let instance_pre = linker
            .instantiate_pre(&component)
            .map_err(|e| fail(format!("imports something wharf does not provide: {e:?}")))?;
        let pre = HandlerPre::new(instance_pre).map_err(|e| {
            fail(format!(
                "does not export `handle: func(d: delivery) -> outcome` of world `wharf:handler/handler`: {e:?}"
            ))
        })?;
        // What the full linker accepted, the one without `wasi:http` accepts
        // with stubs in its place.
        let pre_without_http = grants::without_http(linker, without_http, engine, &component)
            .and_then(|linker| linker.instantiate_pre(&component))
            .and_then(HandlerPre::new)
            .map_err(|e| fail(format!("cannot be linked without `wasi:http`: {e:?}")))?;
        Ok(Module {
            compiled: Arc::new(Compiled {
                engine: engine.clone(),
                pre,
                pre_without_http,
                version,
                needs,
                initial_memory,
                from_disk,
            }),
            path: path.into(),
        })
    }

    /// The module of already compiled code, loaded from `path`.
    pub(super) fn from_compiled(compiled: Arc<Compiled>, path: &Path) -> Module {
        Module {
            compiled,
            path: path.into(),
        }
    }

    /// Whether its code was loaded from the module cache on disk rather
    /// than compiled.
    pub fn from_disk_cache(&self) -> bool {
        self.compiled.from_disk
    }

    /// The component file this module was compiled from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What one instance takes from the host's instance pool.
    pub fn pool_needs(&self) -> PoolNeeds {
        self.compiled.needs
    }

    /// The linear memory the module asks for when it starts, in bytes
    /// (the largest of its memories' initial sizes).
    pub fn initial_memory(&self) -> u64 {
        self.compiled.initial_memory
    }

    /// A digest of the component's bytes: equal for equal files, so logs and
    /// events tell which version of a module handled a delivery.
    pub fn version(&self) -> &Arc<str> {
        &self.compiled.version
    }
}
