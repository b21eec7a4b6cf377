use std::sync::Arc;
use std::time::Instant;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::wharf::handler::log::{Host as LogHost, Level};
use super::module::LogTags;
use super::output::LogOutput;

/// Longest guest log line kept (from the `log` import or its output
/// streams); the rest is cut so a handler cannot flood the host's log.
pub(crate) const MAX_LOG_LINE: usize = 4096;

/// Everything one handler instance's store holds.
pub(crate) struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) memory: MemoryLimit,
    pub(crate) deadline: Instant,
    tags: Arc<LogTags>,
}

impl StoreState {
    pub(crate) fn new(tags: Arc<LogTags>, memory_limit: u64, deadline: Instant) -> StoreState {
        // Deny by default: no preopened directories, no environment, no
        // arguments, no sockets. Output goes to the host log.
        let wasi = WasiCtx::builder()
            .stdout(LogOutput::new(tags.clone(), "stdout"))
            .stderr(LogOutput::new(tags.clone(), "stderr"))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        StoreState {
            wasi,
            table: ResourceTable::new(),
            memory: MemoryLimit::new(memory_limit),
            deadline,
            tags,
        }
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl LogHost for StoreState {
    fn log(&mut self, level: Level, message: String) {
        let message = truncate(&message, MAX_LOG_LINE);
        let (tenant, mount) = (&*self.tags.tenant, &*self.tags.mount);
        match level {
            Level::Trace => tracing::trace!(target: "wharf::guest", tenant, mount, "{message}"),
            Level::Debug => tracing::debug!(target: "wharf::guest", tenant, mount, "{message}"),
            Level::Info => tracing::info!(target: "wharf::guest", tenant, mount, "{message}"),
            Level::Warn => tracing::warn!(target: "wharf::guest", tenant, mount, "{message}"),
            Level::Error => tracing::error!(target: "wharf::guest", tenant, mount, "{message}"),
        }
    }
}

pub(crate) fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Caps the linear memory of an instance (all its memories together) and
/// remembers whether the cap was hit, so a trap that follows a refused
/// allocation is reported as out of memory.
pub(crate) struct MemoryLimit {
    limit: u64,
    used: u64,
    pub(crate) refused: bool,
}

impl MemoryLimit {
    fn new(limit: u64) -> MemoryLimit {
        MemoryLimit {
            limit,
            used: 0,
            refused: false,
        }
    }
}

impl ResourceLimiter for MemoryLimit {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let used = self.used.saturating_sub(current as u64) + desired as u64;
        if used > self.limit {
            self.refused = true;
            return Ok(false);
        }
        self.used = used;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a million entries is far beyond
        // any real handler and keeps a runaway one from eating host memory.
        Ok(desired <= 1_000_000)
    }
}

impl super::bindings::wharf::handler::types::Host for StoreState {}
