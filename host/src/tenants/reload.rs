//! What a new config changes: a pure plan from the mounts running and the
//! mounts wanted, carried out step by step through [`Steps`], so what a
//! reload does when some of it fails is decided here, not in the control
//! task.

use std::collections::{BTreeMap, BTreeSet};

use crate::events::ConfigChange;
use wharf_core::config::{Broker, Config, Mount, TenantBudget};

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
            Some(new) if differs(new, old) => Change::Replace,
            Some(_) => Change::Keep,
        };
        changes.insert(key.clone(), change);
    }
    for key in wanted.keys() {
        changes.entry(key.clone()).or_insert(Change::Add);
    }
    changes
}

/// Whether a mount changed in a way its links must be attached again for:
/// `paused` does not count, the mount's switch carries it over.
fn differs(new: &(Mount, Placement), old: &(Mount, Placement)) -> bool {
    let mut new = new.clone();
    new.0.paused = old.0.paused;
    new != *old
}

/// One step of a reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// The tenant's budget or broker changed: its mounts attached from here
    /// on get new ones (the old mounts keep theirs until they drain).
    NewTenantState(String),
    /// Attach a new mount.
    Attach(MountKey),
    /// Attach the changed mount, then drain the old one; if the new one
    /// cannot attach, the old one keeps serving.
    Replace(MountKey),
    /// Drain and detach the mounts no longer wanted, together.
    Detach(Vec<MountKey>),
    /// Forget tenants left without mounts, and their budgets.
    ForgetIdleTenants,
}

/// The steps from `running` to `wanted`, in order: budgets swapped before
/// the mounts that use them attach, every new or changed mount attached
/// before anything is drained, removed mounts drained last.
pub(crate) fn plan(
    running: &BTreeMap<MountKey, (Mount, Placement)>,
    wanted: &BTreeMap<MountKey, (Mount, Placement)>,
) -> Vec<Step> {
    let changes = diff(running, wanted);
    let moved: BTreeSet<&String> = running
        .iter()
        .filter_map(|((tenant, _), (_, old))| {
            let new = wanted
                .iter()
                .find(|((t, _), _)| t == tenant)
                .map(|(_, (_, placement))| placement)?;
            (new != old).then_some(tenant)
        })
        .collect();
    let mut steps: Vec<Step> = moved
        .into_iter()
        .map(|tenant| Step::NewTenantState(tenant.clone()))
        .collect();
    let mut detach = Vec::new();
    for (key, change) in changes {
        match change {
            Change::Add => steps.push(Step::Attach(key)),
            Change::Replace => steps.push(Step::Replace(key)),
            Change::Remove => detach.push(key),
            Change::Keep => {}
        }
    }
    if !detach.is_empty() {
        steps.push(Step::Detach(detach));
    }
    steps.push(Step::ForgetIdleTenants);
    steps
}

/// What carries out a reload's steps.
pub(crate) trait Steps {
    /// Makes new state (budget, broker pool) for `tenant`.
    fn new_tenant_state(&mut self, tenant: &str);
    /// Attaches a new mount.
    async fn attach(&mut self, key: &MountKey) -> Result<(), String>;
    /// Attaches a changed mount in place of the old one; on an error the
    /// old one still serves.
    async fn replace(&mut self, key: &MountKey) -> Result<(), String>;
    /// Drains and detaches mounts.
    async fn detach(&mut self, keys: &[MountKey]);
    /// Forgets tenants without mounts.
    fn forget_idle_tenants(&mut self);
}

/// Carries out `plan`: a step that fails is reported and the rest go on,
/// so one mount the broker refuses holds up no other.
pub(crate) async fn carry_out(plan: Vec<Step>, steps: &mut impl Steps) -> ConfigChange {
    let label = |(tenant, mount): &MountKey| format!("{tenant}/{mount}");
    let mut change = ConfigChange::default();
    let mut errors = Vec::new();
    for step in plan {
        match step {
            Step::NewTenantState(tenant) => steps.new_tenant_state(&tenant),
            Step::Attach(key) => match steps.attach(&key).await {
                Ok(()) => change.added.push(label(&key)),
                Err(error) => errors.push(format!("{}: {error}", label(&key))),
            },
            Step::Replace(key) => match steps.replace(&key).await {
                Ok(()) => change.replaced.push(label(&key)),
                Err(error) => errors.push(format!("{}: {error}", label(&key))),
            },
            Step::Detach(keys) => {
                steps.detach(&keys).await;
                change.removed.extend(keys.iter().map(label));
            }
            Step::ForgetIdleTenants => steps.forget_idle_tenants(),
        }
    }
    if !errors.is_empty() {
        change.error = Some(errors.join("\n"));
    }
    change
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

    #[test]
    fn pausing_in_the_config_keeps_the_mount_attached() {
        let text = mounts(&[("a", "", &[("m", "q")])]);
        let paused = text.replace("address = \"q\"", "address = \"q\"\npaused = true");
        assert!(config(&paused).mounts().all(|(_, m)| m.paused));
        let changes = diff(&wanted(&config(&text)), &wanted(&config(&paused)));
        assert_eq!(changes.get(&key("a", "m")), Some(&Change::Keep));
    }

    #[test]
    fn a_plan_swaps_budgets_then_attaches_then_drains() {
        let old = config(&mounts(&[
            ("a", "", &[("keep", "k"), ("change", "c1"), ("gone", "g")]),
            ("b", "", &[("m", "b1")]),
        ]));
        let new = config(&mounts(&[
            ("a", "", &[("keep", "k"), ("change", "c2"), ("new", "n")]),
            ("b", "max_running = 2", &[("m", "b1")]),
        ]));
        assert_eq!(
            plan(&wanted(&old), &wanted(&new)),
            [
                Step::NewTenantState("b".to_owned()),
                Step::Replace(key("a", "change")),
                Step::Attach(key("a", "new")),
                Step::Replace(key("b", "m")),
                Step::Detach(vec![key("a", "gone")]),
                Step::ForgetIdleTenants,
            ]
        );
    }

    /// Carries steps out on paper: which mounts run, what was done, and
    /// which mounts the broker refuses.
    #[derive(Default)]
    struct OnPaper {
        running: BTreeSet<MountKey>,
        done: Vec<String>,
        refused: BTreeSet<MountKey>,
    }

    impl Steps for OnPaper {
        fn new_tenant_state(&mut self, tenant: &str) {
            self.done.push(format!("new state {tenant}"));
        }

        async fn attach(&mut self, key: &MountKey) -> Result<(), String> {
            self.done.push(format!("attach {}/{}", key.0, key.1));
            if self.refused.contains(key) {
                return Err("the broker refused the link".to_owned());
            }
            self.running.insert(key.clone());
            Ok(())
        }

        async fn replace(&mut self, key: &MountKey) -> Result<(), String> {
            self.done.push(format!("replace {}/{}", key.0, key.1));
            if self.refused.contains(key) {
                return Err("the broker refused the link; the old mount keeps serving".to_owned());
            }
            Ok(())
        }

        async fn detach(&mut self, keys: &[MountKey]) {
            for key in keys {
                self.done.push(format!("detach {}/{}", key.0, key.1));
                self.running.remove(key);
            }
        }

        fn forget_idle_tenants(&mut self) {
            self.done.push("forget idle tenants".to_owned());
        }
    }

    #[tokio::test]
    async fn a_reload_that_half_fails_carries_out_the_rest_and_names_what_failed() {
        let old = config(&mounts(&[(
            "a",
            "",
            &[("keep", "k"), ("change", "c1"), ("gone", "g")],
        )]));
        let new = config(&mounts(&[
            ("a", "", &[("keep", "k"), ("change", "c2"), ("new", "n")]),
            ("c", "", &[("m", "c")]),
        ]));
        let mut paper = OnPaper {
            running: wanted(&old).into_keys().collect(),
            refused: [key("a", "change"), key("c", "m")].into(),
            ..OnPaper::default()
        };
        let change = carry_out(plan(&wanted(&old), &wanted(&new)), &mut paper).await;
        assert_eq!(
            paper.done,
            [
                "replace a/change",
                "attach a/new",
                "attach c/m",
                "detach a/gone",
                "forget idle tenants",
            ]
        );
        assert_eq!(change.added, ["a/new"]);
        assert!(change.replaced.is_empty());
        assert_eq!(change.removed, ["a/gone"]);
        let error = change.error.expect("the failures are reported");
        assert!(
            error.contains("a/change: the broker refused the link; the old mount keeps serving"),
            "{error}"
        );
        assert!(error.contains("c/m: the broker refused"), "{error}");
        // The refused replacement left the old mount serving; the refused
        // new mount never ran.
        assert_eq!(
            paper.running,
            [key("a", "change"), key("a", "keep"), key("a", "new")].into()
        );
    }
}
