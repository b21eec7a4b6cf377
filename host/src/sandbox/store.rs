use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::cpu::{CpuLane, CpuUse};
use super::grants::Granted;
use super::http::{HttpConnections, HttpGate};
use super::log::LogView;
use super::outbox::{Outbox, OutboxView, Owners};
use super::output::{GuestLog, LogOutput};
use super::tags::LogTags;
use wharf_core::grants::{Grants, HttpGrants, Output};

/// Resources (streams, pollables, HTTP headers, requests, bodies) one
/// instance may hold at once; a handler creating more gets an error.
pub const MAX_RESOURCES: usize = 1024;

/// The most one header map (`wasi:http` fields) may take on the host, in
/// wasmtime's accounting (a little more than its size on the wire).
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// What every instance of one mount's module shares.
pub(crate) struct InstanceSetup {
    pub(crate) tags: Arc<LogTags>,
    pub(crate) grants: Grants,
    /// What the tenants of this host own, which replies must not reach.
    pub(crate) owners: Owners,
    /// The tenant's outbound HTTP connections.
    pub(crate) connections: HttpConnections,
    /// What the tenant's handlers may log.
    pub(crate) log: GuestLog,
    /// Whether the empty environment has been noted in the log yet.
    empty_environment_noted: AtomicBool,
    /// Output bytes over the per-delivery allowance, not yet reported.
    output_dropped: Arc<AtomicU64>,
    /// What the mount grants of `wasi:http`, for each instance's gate.
    http: Arc<HttpGrants>,
}

impl InstanceSetup {
    pub(crate) fn new(
        tags: Arc<LogTags>,
        grants: Grants,
        owners: Owners,
        connections: HttpConnections,
        log: GuestLog,
    ) -> InstanceSetup {
        InstanceSetup {
            tags,
            http: Arc::new(grants.http.clone()),
            grants,
            owners,
            connections,
            log,
            empty_environment_noted: AtomicBool::new(false),
            output_dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Output bytes dropped since the last time this was asked.
    pub(crate) fn take_output_dropped(&self) -> u64 {
        self.output_dropped.swap(0, Ordering::Relaxed)
    }
}

/// Everything one handler instance's store holds.
pub(crate) struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) memory: MemoryLimit,
    pub(crate) deadline: Instant,
    pub(crate) setup: Arc<InstanceSetup>,
    pub(crate) cpu: CpuUse,
    stdout: LogOutput,
    stderr: LogOutput,
    /// Bytes logged through the `log` import during this call.
    logged: usize,
    /// What the call has sent.
    pub(crate) outbox: Outbox,
    http: WasiHttpCtx,
    pub(crate) http_gate: HttpGate,
}

impl StoreState {
    pub(crate) fn new(setup: Arc<InstanceSetup>, memory_limit: u64, lane: CpuLane) -> StoreState {
        let output = |stream| {
            let discard = setup.grants.output == Output::Drop;
            LogOutput::new(
                stream,
                setup.log.clone(),
                discard,
                setup.output_dropped.clone(),
            )
        };
        let (stdout, stderr) = (output("stdout"), output("stderr"));
        // Deny by default: no preopened directories, no arguments, no
        // sockets; only the granted environment. Clocks and random are
        // checked against the grants when called (see `grants`).
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .envs(&setup.grants.env.iter().collect::<Vec<_>>())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let http_gate = HttpGate::new(setup.http.clone(), setup.connections.clone());
        StoreState {
            wasi,
            table: {
                let mut table = ResourceTable::new();
                table.set_max_capacity(MAX_RESOURCES);
                table
            },
            memory: MemoryLimit::new(memory_limit),
            deadline: Instant::now(),
            setup,
            cpu: CpuUse::new(lane),
            stdout,
            stderr,
            logged: 0,
            outbox: Outbox::default(),
            http: {
                let mut http = WasiHttpCtx::new();
                http.set_field_size_limit(MAX_HEADER_BYTES);
                http
            },
            http_gate,
        }
    }

    /// Readies a (possibly reused) instance for the next delivery.
    pub(crate) fn begin_call(&mut self, deadline: Instant) {
        self.deadline = deadline;
        self.memory.refused = false;
        self.logged = 0;
        self.cpu.reset();
    }

    /// Flushes the delivery's output and reports what was dropped, so each
    /// delivery has its own output allowance.
    pub(crate) fn end_call(&mut self) {
        self.cpu.reset();
        self.http_gate.trace = super::http::HttpTrace::default();
        self.stdout.end_call();
        self.stderr.end_call();
    }
}

impl StoreState {
    /// What the `log` import sees of the store.
    pub(crate) fn log_view(&mut self) -> LogView<'_> {
        LogView {
            logged: &mut self.logged,
            log: &self.setup.log,
            dropped: &self.setup.output_dropped,
        }
    }

    /// What the `outbox` import sees of the store.
    pub(crate) fn outbox_view(&mut self) -> OutboxView<'_> {
        OutboxView {
            outbox: &mut self.outbox,
            grants: &self.setup.grants,
            owners: &self.setup.owners,
            tenant: &self.setup.tags.tenant,
            log: &self.setup.log,
        }
    }
}

impl Granted for StoreState {
    fn grants(&self) -> &Grants {
        &self.setup.grants
    }

    fn note_empty_environment(&self) {
        if !self
            .setup
            .empty_environment_noted
            .swap(true, Ordering::Relaxed)
        {
            tracing::info!(
                "the handler read wasi:cli/environment, which is empty unless the mount grants `env`"
            );
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

impl WasiHttpView for StoreState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_gate,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::super::bindings::wharf::handler::log::{Host as _, Level};
    use super::super::log::MAX_LOG_PER_CALL;
    use super::*;
    use wharf_core::config::LogLevel;

    #[test]
    fn each_delivery_has_its_own_log_allowance() {
        let tags = Arc::new(LogTags {
            tenant: "t".into(),
            mount: "m".into(),
        });
        let setup = Arc::new(InstanceSetup::new(
            tags,
            Grants::default(),
            Owners::default(),
            HttpConnections::new(1),
            GuestLog::new(1 << 20, LogLevel::Error),
        ));
        let mut state = StoreState::new(setup.clone(), 1 << 20, CpuLane::new(None));
        state.begin_call(Instant::now());
        let line = "x".repeat(MAX_LOG_PER_CALL);
        state.log_view().log(Level::Info, line.clone());
        state.log_view().log(Level::Info, line.clone());
        assert_eq!(setup.take_output_dropped(), MAX_LOG_PER_CALL as u64);
        state.end_call();
        state.begin_call(Instant::now());
        state.log_view().log(Level::Info, line);
        assert_eq!(
            setup.take_output_dropped(),
            0,
            "the next delivery starts afresh"
        );
    }
}
