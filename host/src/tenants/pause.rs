//! Which mounts are paused: set by an operator through the admin listener
//! and by the config's `paused`, read by each mount's receive loop, which
//! withdraws the link's credit while its switch is on.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Mutex;

use tokio::sync::watch;

use crate::sync::Locked;
use wharf_core::config::Config;

/// A mount's pause switch and the value the config last gave it.
struct Switch {
    paused: watch::Sender<bool>,
    configured: bool,
}

/// The pause switch of every configured mount, by tenant and mount.
#[derive(Default)]
pub struct Pauses {
    switches: Mutex<BTreeMap<(String, String), Switch>>,
}

/// What [`Pauses::set`] found nothing to act on.
#[derive(Debug, thiserror::Error)]
pub enum NoSuchMount {
    /// No tenant of that name has mounts.
    #[error("no tenant `{0}`")]
    Tenant(String),
    /// The tenant has no mount of that name.
    #[error("tenant `{tenant}` has no mount `{mount}`")]
    Mount {
        /// The tenant asked for.
        tenant: String,
        /// The mount asked for.
        mount: String,
    },
}

impl Pauses {
    /// Brings the switches in line with `config`: a new mount starts as
    /// its `paused` says, a mount whose `paused` changed takes the new
    /// value, and every other keeps what an operator set. Mounts no longer
    /// configured are forgotten.
    pub(crate) fn configure(&self, config: &Config) {
        let wanted: BTreeMap<(String, String), bool> = config
            .mounts()
            .map(|(tenant, mount)| ((tenant.name.clone(), mount.name.clone()), mount.paused))
            .collect();
        let mut switches = self.switches.locked();
        switches.retain(|key, _| wanted.contains_key(key));
        for (key, configured) in wanted {
            match switches.entry(key) {
                Entry::Occupied(mut entry) => {
                    let switch = entry.get_mut();
                    if switch.configured != configured {
                        switch.configured = configured;
                        switch.paused.send_replace(configured);
                    }
                }
                Entry::Vacant(entry) => {
                    entry.insert(Switch {
                        paused: watch::Sender::new(configured),
                        configured,
                    });
                }
            }
        }
    }

    /// The switch the mount's receive loop watches; an unconfigured mount
    /// gets one that stays off.
    pub(crate) fn watch(&self, tenant: &str, mount: &str) -> watch::Receiver<bool> {
        self.switches
            .locked()
            .get(&(tenant.to_owned(), mount.to_owned()))
            .map_or_else(
                || watch::Sender::new(false).subscribe(),
                |s| s.paused.subscribe(),
            )
    }

    /// Pauses (or resumes) `mount` of `tenant`, or every mount of the
    /// tenant when `mount` is `None`; the names of the mounts it acted on.
    pub fn set(
        &self,
        tenant: &str,
        mount: Option<&str>,
        paused: bool,
    ) -> Result<Vec<String>, NoSuchMount> {
        let switches = self.switches.locked();
        let named: Vec<(&(String, String), &Switch)> = switches
            .iter()
            .filter(|((t, m), _)| t == tenant && mount.is_none_or(|mount| m == mount))
            .collect();
        if named.is_empty() {
            let tenant_known = switches.keys().any(|(t, _)| t == tenant);
            return Err(match mount {
                Some(mount) if tenant_known => NoSuchMount::Mount {
                    tenant: tenant.to_owned(),
                    mount: mount.to_owned(),
                },
                _ => NoSuchMount::Tenant(tenant.to_owned()),
            });
        }
        Ok(named
            .into_iter()
            .map(|((_, name), switch)| {
                switch.paused.send_replace(paused);
                name.clone()
            })
            .collect())
    }

    /// Every configured mount and whether it is asked to be paused.
    pub fn all(&self) -> Vec<(String, String, bool)> {
        self.switches
            .locked()
            .iter()
            .map(|((tenant, mount), switch)| {
                (tenant.clone(), mount.clone(), *switch.paused.borrow())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mounts: &[(&str, bool)]) -> Config {
        let dir = std::env::temp_dir().join(format!("wharf-pause-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("h.wasm"), b"").expect("module file");
        let mut text =
            "[broker]\nurl = \"amqp://127.0.0.1\"\n[[tenant]]\nname = \"t\"\n".to_owned();
        for (name, paused) in mounts {
            text += &format!(
                "[[tenant.mount]]\nname = \"{name}\"\nmodule = \"h.wasm\"\naddress = \"{name}\"\npaused = {paused}\n"
            );
        }
        Config::parse(&text, &dir.join("wharf.toml")).expect("config")
    }

    #[test]
    fn an_operators_switch_holds_until_the_config_changes_its_mount() {
        let pauses = Pauses::default();
        pauses.configure(&config(&[("a", false), ("b", true)]));
        let (a, b) = (pauses.watch("t", "a"), pauses.watch("t", "b"));
        assert!(!*a.borrow() && *b.borrow());
        assert_eq!(pauses.set("t", Some("a"), true).expect("known"), ["a"]);
        assert!(*a.borrow());
        // The same config again: the operator's pause holds.
        pauses.configure(&config(&[("a", false), ("b", true)]));
        assert!(*a.borrow() && *b.borrow());
        // `b`'s `paused` changed: the config's value wins, on the switch
        // its receive loop already watches.
        pauses.configure(&config(&[("a", false), ("b", false)]));
        assert!(*a.borrow() && !*b.borrow());
        assert_eq!(pauses.set("t", None, false).expect("known"), ["a", "b"]);
        assert!(!*a.borrow());
    }

    #[test]
    fn unknown_names_are_said_as_such() {
        let pauses = Pauses::default();
        pauses.configure(&config(&[("a", false)]));
        let e = pauses.set("t", Some("x"), true).expect_err("no mount x");
        assert_eq!(e.to_string(), "tenant `t` has no mount `x`");
        let e = pauses.set("u", None, true).expect_err("no tenant u");
        assert_eq!(e.to_string(), "no tenant `u`");
        // A removed mount is forgotten.
        pauses.configure(&config(&[("b", false)]));
        assert_eq!(pauses.all(), [("t".to_owned(), "b".to_owned(), false)]);
    }
}
