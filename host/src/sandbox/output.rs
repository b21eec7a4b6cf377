//! A guest's stdout and stderr, routed line by line into the host log.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::task::{Context, Poll};
use tokio::time::Instant;
use wharf_core::config::LogLevel;

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::sync::Locked;
use wharf_core::text::shown_up_to;

/// Bytes of output kept per stream and delivery; the rest is counted and
/// dropped, so a chatty or hostile guest cannot flood the log.
const MAX_OUTPUT: usize = 64 * 1024;

/// Longest guest log line kept (from the `log` import or its output
/// streams); the rest is cut so a handler cannot flood the host's log.
pub(crate) const MAX_LOG_LINE: usize = 4096;

/// The most a guest may write in one call (WASI's `check-write`).
const MAX_WRITE: usize = 64 * 1024;

/// One guest output stream (`stdout` or `stderr`) of one instance.
#[derive(Clone)]
pub(crate) struct LogOutput {
    lines: Arc<Mutex<Lines>>,
}

impl LogOutput {
    /// The `stream` of an instance whose lines go to `log` (nowhere when
    /// `discard`); bytes over the allowance are counted in `dropped`.
    pub(crate) fn new(
        stream: &'static str,
        log: GuestLog,
        discard: bool,
        dropped: Arc<AtomicU64>,
    ) -> LogOutput {
        LogOutput {
            lines: Arc::new(Mutex::new(Lines {
                discard,
                log,
                dropped_total: dropped,
                stream,
                pending: Vec::new(),
                kept: 0,
                dropped: 0,
            })),
        }
    }

    /// Emits the last unfinished line and reports what was dropped; the
    /// next delivery starts with a full allowance.
    pub(crate) fn end_call(&self) {
        self.lines().end_call();
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Lines> {
        self.lines.locked()
    }
}

struct Lines {
    log: GuestLog,
    /// Bytes dropped, across calls, until the host asks.
    dropped_total: Arc<AtomicU64>,
    stream: &'static str,
    /// The mount routes output nowhere.
    discard: bool,
    pending: Vec<u8>,
    kept: usize,
    dropped: usize,
}

impl Lines {
    fn write(&mut self, bytes: &[u8]) {
        if self.discard {
            return;
        }
        let room = MAX_OUTPUT.saturating_sub(self.kept);
        let (keep, drop) = bytes.split_at(bytes.len().min(room));
        self.kept += keep.len();
        self.dropped += drop.len();
        self.pending.extend_from_slice(keep);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            self.emit(&line[..end]);
        }
        if self.pending.len() > MAX_LOG_LINE {
            let line = std::mem::take(&mut self.pending);
            self.emit(&line);
        }
    }

    fn emit(&mut self, line: &[u8]) {
        if !self.log.take(line.len()) {
            self.dropped += line.len();
            return;
        }
        let text = String::from_utf8_lossy(line);
        tracing::info!(
            target: "wharf::guest",
            stream = self.stream,
            "{}",
            shown_up_to(&text, MAX_LOG_LINE)
        );
    }
}

impl Lines {
    fn end_call(&mut self) {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.emit(&line);
        }
        if self.dropped > 0 {
            self.dropped_total
                .fetch_add(self.dropped as u64, Ordering::Relaxed);
            tracing::warn!(
                stream = self.stream,
                dropped_bytes = self.dropped,
                "handler output past its allowance ({MAX_OUTPUT} bytes per stream and delivery, the tenant's log_rate) was dropped"
            );
        }
        self.kept = 0;
        self.dropped = 0;
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        self.end_call();
    }
}

impl IsTerminal for LogOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    /// Writes go straight into the buffer: the default adapter hands every
    /// write to a background task and waits for it, which makes a chatty
    /// handler crawl.
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for LogOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for LogOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.lines().write(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(MAX_WRITE)
    }
}

impl AsyncWrite for LogOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.lines().write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What a tenant's handlers may log: bytes per second (a bucket holding
/// one second's worth, so a burst of that much passes) and the most severe
/// level.
#[derive(Clone)]
pub struct GuestLog {
    bucket: Arc<Mutex<Bucket>>,
    /// The most severe level a line is logged at.
    pub level: LogLevel,
}

struct Bucket {
    per_second: f64,
    bytes: f64,
    filled: Instant,
}

impl GuestLog {
    /// `per_second` bytes a second, lines logged at most at `level`.
    pub fn new(per_second: u64, level: LogLevel) -> GuestLog {
        let per_second = per_second as f64;
        GuestLog {
            bucket: Arc::new(Mutex::new(Bucket {
                per_second,
                bytes: per_second,
                filled: Instant::now(),
            })),
            level,
        }
    }

    /// Whether a line of `bytes` may be logged now; if so it is counted.
    pub(crate) fn take(&self, bytes: usize) -> bool {
        let mut bucket = self.bucket.locked();
        let now = Instant::now();
        let refill = now.duration_since(bucket.filled).as_secs_f64() * bucket.per_second;
        bucket.bytes = (bucket.bytes + refill).min(bucket.per_second);
        bucket.filled = now;
        let bytes = bytes as f64;
        if bytes <= bucket.bytes {
            bucket.bytes -= bytes;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_past_the_rate_is_dropped_and_the_rate_comes_back() {
        let log = GuestLog::new(1000, LogLevel::Warn);
        assert!(log.take(600));
        assert!(log.take(400));
        assert!(
            !log.take(100),
            "more than a second's worth went through at once"
        );
        tokio::time::advance(std::time::Duration::from_millis(200)).await;
        assert!(log.take(200), "nothing came back after 200 ms");
        assert!(!log.take(1), "more came back than 200 ms hold");
    }
}
