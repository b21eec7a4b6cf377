//! What a new config changes: a pure comparison of the mounts running and
//! the mounts wanted.

use std::collections::BTreeMap;

use crate::config::{Broker, Config, Mount, TenantBudget};

/// `(tenant, mount)`.
pub(crate) type MountKey = (String, String);

/// What a mount runs with beyond its own table: its tenant's budget and
/// broker. A change to either replaces all the tenant's mounts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Placement {
    pub(crate) budget: TenantBudget,
    pub(crate) broker: Option<Broker>,
}

/// What to do with one mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// New: attach it.
    Add,
    /// Gone: drain and detach it.
    Remove,
    /// Changed: attach the new one, then drain the old.
    Replace,
    /// Unchanged: leave it alone.
    Keep,
}

/// Every mount of `config`, with its placement.
pub(crate) fn wanted(config: &Config) -> BTreeMap<MountKey, (Mount, Placement)> {
    config
        .mounts()
        .map(|(tenant, mount)| {
            let placement = Placement {
                budget: tenant.budget,
                broker: tenant.broker.clone(),
            };
            (
                (tenant.name.clone(), mount.name.clone()),
                (mount.clone(), placement),
            )
        })
        .collect()
}

/// The change for every mount running or wanted.
pub(crate) fn diff(
    running: &BTreeMap<MountKey, (Mount, Placement)>,
    wanted: &BTreeMap<MountKey, (Mount, Placement)>,
) -> BTreeMap<MountKey, Change> {
    let mut changes = BTreeMap::new();
    for (key, old) in running {
        let change = match wanted.get(key) {
            None => Change::Remove,
            Some(new) if new != old => Change::Replace,
            Some(_) => Change::Keep,
        };
        changes.insert(key.clone(), change);
    }
    for key in wanted.keys() {
        changes.entry(key.clone()).or_insert(Change::Add);
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        let dir = std::env::temp_dir().join(format!("wharf-reload-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("h.wasm"), b"").expect("module file");
        Config::parse(text, &dir.join("wharf.toml")).expect("config")
    }

    /// A tenant's name, extra TOML lines, and `(mount, address)` pairs.
    type TenantSpec<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    fn mounts(tenants: &[TenantSpec<'_>]) -> String {
        let mut text = "[broker]\nurl = \"amqp://127.0.0.1\"\n".to_owned();
        for (tenant, extra, mounts) in tenants {
            text.push_str(&format!("[[tenant]]\nname = \"{tenant}\"\n{extra}\n"));
            for (mount, address) in *mounts {
                text.push_str(&format!(
                    "[[tenant.mount]]\nname = \"{mount}\"\nmodule = \"h.wasm\"\naddress = \"{address}\"\n"
                ));
            }
        }
        text
    }

    fn key(tenant: &str, mount: &str) -> MountKey {
        (tenant.to_owned(), mount.to_owned())
    }

    #[test]
    fn adds_removes_replaces_and_keeps() {
        let old = config(&mounts(&[(
            "a",
            "",
            &[("keep", "k"), ("change", "c1"), ("gone", "g")],
        )]));
        let new = config(&mounts(&[(
            "a",
            "",
            &[("keep", "k"), ("change", "c2"), ("new", "n")],
        )]));
        let changes = diff(&wanted(&old), &wanted(&new));
        assert_eq!(changes[&key("a", "keep")], Change::Keep);
        assert_eq!(changes[&key("a", "change")], Change::Replace);
        assert_eq!(changes[&key("a", "gone")], Change::Remove);
        assert_eq!(changes[&key("a", "new")], Change::Add);
        assert_eq!(changes.len(), 4);
    }

    #[test]
    fn a_tenant_budget_or_broker_change_replaces_all_its_mounts_only() {
        let old = config(&mounts(&[
            ("a", "", &[("m1", "a1"), ("m2", "a2")]),
            ("b", "", &[("m", "b1")]),
        ]));
        let new = config(&mounts(&[
            ("a", "max_running = 2", &[("m1", "a1"), ("m2", "a2")]),
            ("b", "", &[("m", "b1")]),
        ]));
        let changes = diff(&wanted(&old), &wanted(&new));
        assert_eq!(changes[&key("a", "m1")], Change::Replace);
        assert_eq!(changes[&key("a", "m2")], Change::Replace);
        assert_eq!(changes[&key("b", "m")], Change::Keep);
        let moved = config(&mounts(&[
            ("a", "", &[("m1", "a1"), ("m2", "a2")]),
            (
                "b",
                "[tenant.broker]\nurl = \"amqp://other\"",
                &[("m", "b1")],
            ),
        ]));
        let changes = diff(&wanted(&old), &wanted(&moved));
        assert_eq!(changes[&key("b", "m")], Change::Replace);
        assert_eq!(changes[&key("a", "m1")], Change::Keep);
    }

    #[test]
    fn the_same_config_changes_nothing() {
        let text = mounts(&[("a", "", &[("m", "q")])]);
        let changes = diff(&wanted(&config(&text)), &wanted(&config(&text)));
        assert!(changes.values().all(|c| *c == Change::Keep));
    }
}
