//! The defaults of the config's keys, written as the file would write
//! them: the configuration reference (and the README's table, which a test
//! holds to it) is made from the same constants the loader uses.

use std::time::Duration;

use super::{Broker, HostSettings, LogLevel, Mount, TenantBudget};
use crate::grants::OutputLimits;

/// Every key whose default is a fixed value, with that value as a config
/// file would write it (`30s`, `64MiB`, `warn`).
pub fn reference() -> Vec<(&'static str, String)> {
    vec![
        (
            "broker.connect_timeout",
            duration(Broker::DEFAULT_CONNECT_TIMEOUT),
        ),
        (
            "broker.idle_timeout",
            duration(Broker::DEFAULT_IDLE_TIMEOUT),
        ),
        (
            "broker.attach_timeout",
            duration(Broker::DEFAULT_ATTACH_TIMEOUT),
        ),
        (
            "broker.publish_timeout",
            duration(Broker::DEFAULT_PUBLISH_TIMEOUT),
        ),
        (
            "broker.reconnect_initial",
            duration(Broker::DEFAULT_RECONNECT_INITIAL),
        ),
        (
            "broker.reconnect_max",
            duration(Broker::DEFAULT_RECONNECT_MAX),
        ),
        (
            "host.shutdown_grace",
            duration(HostSettings::DEFAULT_SHUTDOWN_GRACE),
        ),
        (
            "host.max_instances",
            HostSettings::DEFAULT_MAX_INSTANCES.to_string(),
        ),
        (
            "host.max_buffered",
            size(HostSettings::DEFAULT_MAX_BUFFERED),
        ),
        ("mount.credit", Mount::DEFAULT_CREDIT.to_string()),
        ("mount.concurrency", Mount::DEFAULT_CONCURRENCY.to_string()),
        ("mount.timeout", duration(Mount::DEFAULT_TIMEOUT)),
        ("mount.memory", size(Mount::DEFAULT_MEMORY)),
        (
            "mount.max_retry_delay",
            duration(Mount::DEFAULT_MAX_RETRY_DELAY),
        ),
        (
            "mount.instance_max_uses",
            Mount::DEFAULT_INSTANCE_MAX_USES.to_string(),
        ),
        (
            "mount.instance_max_idle",
            duration(Mount::DEFAULT_INSTANCE_MAX_IDLE),
        ),
        (
            "mount.max_outputs",
            OutputLimits::DEFAULT_MAX_OUTPUTS.to_string(),
        ),
        (
            "mount.max_output_bytes",
            size(OutputLimits::DEFAULT_MAX_OUTPUT_BYTES),
        ),
        (
            "mount.max_message_size",
            size(Mount::DEFAULT_MAX_MESSAGE_SIZE),
        ),
        (
            "tenant.max_buffered",
            size(TenantBudget::DEFAULT_MAX_BUFFERED),
        ),
        ("tenant.log_rate", size(TenantBudget::DEFAULT_LOG_RATE)),
        (
            "tenant.log_level",
            level(TenantBudget::DEFAULT_LOG_LEVEL).to_owned(),
        ),
        (
            "tenant.max_http_connections",
            TenantBudget::DEFAULT_MAX_HTTP_CONNECTIONS.to_string(),
        ),
    ]
}

/// `d` in the largest unit that writes it whole: `100ms`, `30s`, `1h`.
fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let units = [(3_600_000, "h"), (60_000, "m"), (1_000, "s"), (1, "ms")];
    let (unit, name) = units
        .into_iter()
        .find(|(unit, _)| ms.is_multiple_of(*unit) && ms >= *unit)
        .unwrap_or((1, "ms"));
    format!("{}{name}", ms / unit)
}

/// `bytes` in the largest binary unit that writes it whole: `64KiB`, `1GiB`.
fn size(bytes: u64) -> String {
    let units = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match units
        .into_iter()
        .find(|(unit, _)| bytes.is_multiple_of(*unit) && bytes >= *unit)
    {
        Some((unit, name)) => format!("{}{name}", bytes / unit),
        None => bytes.to_string(),
    }
}

fn level(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
        LogLevel::Trace => "trace",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_duration, parse_size};

    #[test]
    fn every_default_reads_back_as_itself() {
        for (key, written) in reference() {
            if let Ok(d) = parse_duration(&written) {
                assert_eq!(duration(d), written, "{key}");
            } else if let Ok(n) = parse_size(&written) {
                assert_eq!(size(n), written, "{key}");
            }
        }
    }

    /// The README's configuration table gives each of these defaults as
    /// the constants the loader uses.
    #[test]
    fn the_readme_table_shows_the_defaults_the_loader_uses() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
            .expect("README.md");
        for (key, written) in reference() {
            let row = format!("| `{key}` | ");
            let line = readme
                .lines()
                .find(|line| line.starts_with(&row))
                .unwrap_or_else(|| panic!("the README's table has no row for `{key}`"));
            let shown = line[row.len()..].split(" |").next().unwrap_or_default();
            assert_eq!(shown, format!("`{written}`"), "README row of `{key}`");
        }
    }
}
