//! The `log` import: a handler's lines in the host's log, within the
//! delivery's allowance and the tenant's rate, escaped and capped in level.

use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::component::HasData;

use super::bindings::wharf::handler::log::{Host, Level};
use super::output::{GuestLog, MAX_LOG_LINE};
use wharf_core::config::LogLevel;
use wharf_core::text::shown_up_to;

/// Bytes of `log` calls kept per delivery; the rest is counted and dropped.
pub(crate) const MAX_LOG_PER_CALL: usize = 64 * 1024;

/// What the `log` import sees of the store.
pub(crate) struct LogView<'a> {
    /// Bytes logged during this call.
    pub(crate) logged: &'a mut usize,
    /// The tenant's rate and level cap.
    pub(crate) log: &'a GuestLog,
    /// Where bytes over either bound are counted.
    pub(crate) dropped: &'a AtomicU64,
}

/// The `log` import's part of the store.
pub(crate) struct HasLog;

impl HasData for HasLog {
    type Data<'a> = LogView<'a>;
}

impl Host for LogView<'_> {
    fn log(&mut self, level: Level, message: String) {
        let room = MAX_LOG_PER_CALL.saturating_sub(*self.logged);
        // Charged what reaches the log: a line is cut to MAX_LOG_LINE.
        if message.len() > room || !self.log.take(message.len().min(MAX_LOG_LINE)) {
            self.dropped
                .fetch_add(message.len() as u64, Ordering::Relaxed);
            return;
        }
        *self.logged += message.len();
        // Escaped, so a guest cannot forge log lines or drive the
        // operator's terminal.
        let message = shown_up_to(&message, MAX_LOG_LINE);
        // Its tenant and mount are those of the span it is logged in.
        match capped(level, self.log.level) {
            Level::Trace => tracing::trace!(target: "wharf::guest", "{message}"),
            Level::Debug => tracing::debug!(target: "wharf::guest", "{message}"),
            Level::Info => tracing::info!(target: "wharf::guest", "{message}"),
            Level::Warn => tracing::warn!(target: "wharf::guest", "{message}"),
            Level::Error => tracing::error!(target: "wharf::guest", "{message}"),
        }
    }
}

/// `level`, or `cap` where `level` is more severe.
fn capped(level: Level, cap: LogLevel) -> Level {
    let severity = |level: Level| match level {
        Level::Error => LogLevel::Error,
        Level::Warn => LogLevel::Warn,
        Level::Info => LogLevel::Info,
        Level::Debug => LogLevel::Debug,
        Level::Trace => LogLevel::Trace,
    };
    if severity(level) >= cap {
        return level;
    }
    match cap {
        LogLevel::Error => Level::Error,
        LogLevel::Warn => Level::Warn,
        LogLevel::Info => Level::Info,
        LogLevel::Debug => Level::Debug,
        LogLevel::Trace => Level::Trace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_more_severe_than_the_cap_is_logged_at_the_cap() {
        let at = |level, cap| format!("{:?}", capped(level, cap));
        assert_eq!(at(Level::Error, LogLevel::Warn), "Level::Warn");
        assert_eq!(at(Level::Warn, LogLevel::Warn), "Level::Warn");
        assert_eq!(at(Level::Info, LogLevel::Warn), "Level::Info");
        assert_eq!(at(Level::Error, LogLevel::Error), "Level::Error");
        assert_eq!(at(Level::Debug, LogLevel::Info), "Level::Debug");
        assert_eq!(at(Level::Trace, LogLevel::Error), "Level::Trace");
    }

    #[test]
    fn the_log_import_keeps_a_delivery_within_its_allowance() {
        let log = GuestLog::new(1 << 20, LogLevel::Error);
        let dropped = AtomicU64::new(0);
        let mut logged = 0;
        let line = "x".repeat(1000);
        for _ in 0..100 {
            let mut view = LogView {
                logged: &mut logged,
                log: &log,
                dropped: &dropped,
            };
            Host::log(&mut view, Level::Info, line.clone());
        }
        // 65 lines fit the 64 KiB allowance; the other 35 are counted.
        assert_eq!(dropped.load(Ordering::Relaxed), 35 * 1000);
    }
}
