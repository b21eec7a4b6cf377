use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store, Trap, UpdateDeadline};

use super::bindings::{Handler, HandlerPre};
use super::store::StoreState;
use super::{Delivery, Outcome};

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
            Failure::Trap(_) => "trap",
            Failure::Instantiate(_) => "instantiate",
            Failure::InvalidOutcome(_) => "invalid-outcome",
        }
    }
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
            Failure::Trap(why) => write!(f, "trapped: {why}"),
            Failure::Instantiate(why) => write!(f, "could not be instantiated: {why}"),
            Failure::InvalidOutcome(why) => write!(f, "returned an invalid outcome: {why}"),
        }
    }
}

/// Whose handler is running; tags its log lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTags {
    /// The tenant's name.
    pub tenant: Arc<str>,
    /// The mount's name.
    pub mount: Arc<str>,
}

/// The budget of one handler call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Wall-clock time for instantiation and the call together.
    pub timeout: Duration,
    /// Linear memory of the instance, in bytes.
    pub memory: u64,
}

/// A compiled, validated and pre-linked handler component.
#[derive(Clone)]
pub struct Module {
    engine: Engine,
    pre: HandlerPre<StoreState>,
    path: Arc<Path>,
}

impl Module {
    pub(super) fn load(
        engine: &Engine,
        linker: &Linker<StoreState>,
        path: &Path,
    ) -> Result<Module, LoadError> {
        let fail = |reason: String| LoadError {
            path: path.to_owned(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot be read: {e}")))?;
        let component = Component::new(engine, &bytes)
            .map_err(|e| fail(format!("is not a valid wasm component: {e:?}")))?;
        let instance_pre = linker
            .instantiate_pre(&component)
            .map_err(|e| fail(format!("imports something wharf does not provide: {e:?}")))?;
        let pre = HandlerPre::new(instance_pre).map_err(|e| {
            fail(format!(
                "does not export `handle: func(d: delivery) -> outcome` of world `wharf:handler/handler`: {e:?}"
            ))
        })?;
        Ok(Module {
            engine: engine.clone(),
            pre,
            path: path.into(),
        })
    }

    /// The component file this module was compiled from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs one delivery in a fresh instance, so nothing a handler leaves in
    /// memory reaches the next delivery.
    pub async fn call(
        &self,
        delivery: &Delivery,
        limits: CallLimits,
        tags: Arc<LogTags>,
    ) -> Result<Outcome, Failure> {
        let deadline = Instant::now() + limits.timeout;
        let mut store = Store::new(&self.engine, StoreState::new(tags, limits.memory, deadline));
        store.limiter(|state| &mut state.memory);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|ctx| {
            if Instant::now() >= ctx.data().deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        // The epoch check only fires while wasm runs; a guest parked in a
        // host call (a WASI sleep) is caught by this outer timer.
        let run = async {
            let handler: Handler = self
                .pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| classify(&e, limits, Failure::Instantiate))?;
            handler
                .call_handle(&mut store, delivery)
                .await
                .map_err(|e| classify(&e, limits, Failure::Trap))
        };
        let result = tokio::time::timeout(limits.timeout, run)
            .await
            .unwrap_or(Err(Failure::Timeout(limits.timeout)));
        match result {
            Err(Failure::Trap(_) | Failure::Instantiate(_)) if store.data().memory.refused => {
                Err(Failure::OutOfMemory(limits.memory))
            }
            other => other,
        }
    }
}

fn classify(
    error: &wasmtime::Error,
    limits: CallLimits,
    otherwise: fn(String) -> Failure,
) -> Failure {
    match error.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => Failure::StackOverflow,
        Some(Trap::Interrupt) => Failure::Timeout(limits.timeout),
        Some(_) => otherwise(format!("{error:?}")),
        None if is_lift_error(error) => Failure::InvalidOutcome(format!("{error:?}")),
        None => otherwise(format!("{error:?}")),
    }
}

/// A return value that cannot be lifted into an `outcome` (a bad variant
/// discriminant, say) surfaces as a plain error rather than a trap.
fn is_lift_error(error: &wasmtime::Error) -> bool {
    format!("{error:?}").contains("discriminant")
}
