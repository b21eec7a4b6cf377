//! Users of the test Artemis instances, added and removed while they run:
//! their login modules re-read the user and role files on every login.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Where `scripts/artemis` keeps brokers and downloads.
pub fn cache() -> PathBuf {
    PathBuf::from(std::env::var("WHARF_CACHE").unwrap_or_else(|_| "/var/cache/wharf".into()))
}

/// The `etc` folder of an Artemis instance: `""` is the default one, `"tls"`
/// the one `WHARF_ARTEMIS_INSTANCE=tls` names.
pub fn etc(instance: &str) -> PathBuf {
    let suffix = if instance.is_empty() {
        String::new()
    } else {
        format!("-{instance}")
    };
    cache().join(format!("artemis/instance-2.40.0{suffix}/etc"))
}

/// Adds `credentials` (lines of `artemis-users.properties` for `user`) and
/// gives `user` the role `amq`.
pub fn add(etc: &Path, user: &str, credentials: &str) -> anyhow::Result<()> {
    edit(&etc.join("artemis-users.properties"), |text| {
        format!("{}\n{credentials}", text.trim_end())
    })?;
    edit(&etc.join("artemis-roles.properties"), |text| {
        text.replacen("amq = admin", &format!("amq = admin,{user}"), 1)
    })
}

/// Removes what [`add`] added for `user`: its plain (`user = ...`) and
/// SCRAM (`user|SHA256=...`) lines, and its role.
pub fn remove(etc: &Path, user: &str) -> anyhow::Result<()> {
    edit(&etc.join("artemis-users.properties"), |text| {
        text.lines()
            .filter(|line| {
                let key = line.split(['=', '|']).next().unwrap_or_default();
                key.trim() != user
            })
            .map(|line| format!("{line}\n"))
            .collect()
    })?;
    edit(&etc.join("artemis-roles.properties"), |text| {
        text.replace(&format!(",{user}"), "")
    })
}

fn edit(path: &Path, change: impl FnOnce(&str) -> String) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    std::fs::write(path, change(&text)).with_context(|| path.display().to_string())
}
