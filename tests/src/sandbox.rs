//! The sandbox on its own, without a host or a broker: for tests and
//! benchmarks of what one delivery costs and does.

use std::sync::Arc;
use std::time::Duration;

use wharf::authoring::InvokeInput;
use wharf::sandbox::{
    CallLimits, Delivery, Instances, LogTags, Module, Owners, Sandbox, TenantShare,
};
use wharf_core::config::InstancePolicy;
use wharf_core::config::TenantBudget;
use wharf_core::grants::Grants;

/// Memory each instance may use.
pub const MEMORY: u64 = 256 << 20;

/// A sandbox whose pool holds `instances` instances.
pub fn sandbox(instances: u32) -> anyhow::Result<Sandbox> {
    Sandbox::new(instances)
}

/// `module`'s instances as mount `mount` would run them under `policy`,
/// granted what every toolchain's runtime may read (clocks, random).
pub fn instances(
    sandbox: &Sandbox,
    module: &Module,
    mount: &str,
    policy: InstancePolicy,
) -> Arc<Instances> {
    Arc::new(Instances::new(
        module.clone(),
        CallLimits {
            timeout: Duration::from_secs(30),
            memory: MEMORY,
        },
        policy,
        Grants {
            clocks: true,
            random: true,
            ..Grants::default()
        },
        Arc::new(LogTags {
            tenant: "sandbox".into(),
            mount: mount.into(),
        }),
        Owners::default(),
        TenantShare::new(&TenantBudget::default()),
        sandbox.slots().clone(),
    ))
}

/// Keep an instance for as long as any run lasts.
pub const KEEP: InstancePolicy = InstancePolicy::Reuse {
    max_uses: u32::MAX,
    max_idle: Duration::from_secs(3600),
};

/// A small delivery the `flaky` examples ack (and `ack` does anyway).
pub fn ok_delivery() -> Delivery {
    InvokeInput {
        body: b"ok".to_vec(),
        ..InvokeInput::default()
    }
    .delivery()
}
