//! Human-readable durations ("5s", "250ms") and sizes ("64MiB") in config files.

use std::time::Duration;

use serde::{Deserialize, Deserializer, de::Error as _};

/// Parses a duration such as `"5s"`, `"250ms"` or `"1m 30s"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration ({e}); write e.g. \"5s\" or \"250ms\""))
}

/// Parses a size in bytes such as `"64MiB"`, `"512KiB"`, `"1GB"` or `"4096"`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let unit_bytes: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(size_error(text)),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_bytes))
        .ok_or_else(|| size_error(text))
}

/// Parses cores as thousandths of a core: `"250m"`, `"0.25"` or `"2"`.
pub fn parse_cpu(text: &str) -> Result<u32, String> {
    let error = || format!("`{text}` is not a number of cores; write e.g. 0.5, 2 or \"250m\"");
    let trimmed = text.trim();
    let millis = match trimmed.strip_suffix('m') {
        Some(millis) => millis.parse::<u32>().map_err(|_| error())?,
        None => {
            let cores = trimmed.parse::<f64>().map_err(|_| error())?;
            let millis = (cores * 1000.0).round();
            if !(0.0..=f64::from(u32::MAX)).contains(&millis) {
                return Err(error());
            }
            millis as u32
        }
    };
    Ok(millis)
}

fn size_error(text: &str) -> String {
    format!("`{text}` is not a size; write e.g. \"64MiB\", \"512KiB\" or a number of bytes")
}

pub(crate) fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match u32::deserialize(d)? {
        0 => Err(D::Error::custom("must be at least 1")),
        n => Ok(n),
    }
}

pub(crate) fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match toml::Value::deserialize(d)? {
        toml::Value::Integer(n) => u64::try_from(n).map_err(|_| D::Error::custom("is negative")),
        toml::Value::String(text) => parse_size(&text).map_err(D::Error::custom),
        other => Err(D::Error::custom(format!(
            "expected a size such as \"64MiB\", found {}",
            other.type_str()
        ))),
    }
}

pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    parse_duration(&String::deserialize(d)?).map_err(D::Error::custom)
}

pub(crate) fn optional_duration<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores() {
        assert_eq!(parse_cpu("250m"), Ok(250));
        assert_eq!(parse_cpu("0.25"), Ok(250));
        assert_eq!(parse_cpu("2"), Ok(2000));
        assert_eq!(parse_cpu("0"), Ok(0));
        assert!(parse_cpu("-1").is_err());
        assert!(parse_cpu("NaN").is_err());
        assert!(parse_cpu("half").is_err());
        assert!(parse_cpu("1.5m").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("64 megs").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999GiB").is_err());
    }
}
