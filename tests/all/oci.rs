//! Modules from an OCI registry: a real registry (the CNCF Distribution registry),
//! modules pushed with `wharf push`, mounts running `oci://` references,
//! a tag moved under a running host, and registries that lie or are away.

use std::path::PathBuf;
use std::sync::Arc;

use sha2::Digest as _;

use wharf::Host;
use wharf::events::Event;
use wharf_core::config::Config;
use wharf_core::settlement::Disposition;

use crate::client::{Client, TestMessage};
use crate::registry::OciRegistry;
use crate::reload::Workspace;
use crate::{
    MountToml, TenantToml, TestHost, artemis_url, guest, http_request, tenants_text, unique,
};

/// A config whose mounts run `modules` (references), one queue each, with
/// pulled modules kept in the workspace and tags polled every 200 ms.
fn config(
    files: &Workspace,
    registry: &OciRegistry,
    mounts: &[(&str, &str, &str)],
) -> anyhow::Result<Config> {
    let host = format!(
        "module_cache = \"{}\"\n[host.registry]\nplain_http = [\"{}\"]\npoll = \"200ms\"\n",
        files.path("cache").display(),
        registry.address
    );
    let mounts = mounts
        .iter()
        .map(|(name, reference, queue)| {
            let mut mount = MountToml::new(name, "fixture_script", queue);
            mount.module = PathBuf::from(reference);
            mount
        })
        .collect();
    let text = tenants_text(&artemis_url(), &host, &[TenantToml::new("t", mounts)]);
    files.replace("wharf.toml", text.as_bytes())?;
    Ok(Config::load(&files.path("wharf.toml"))?)
}

/// The module version that handled one message sent to `queue`.
async fn handled_by(
    host: &mut TestHost,
    client: &mut Client,
    queue: &str,
) -> anyhow::Result<Arc<str>> {
    let id = unique(queue);
    client.publish(queue, TestMessage::new(&id, "x")).await?;
    let handled = host.handled(&id).await?;
    assert_eq!(
        handled.disposition,
        Some(Disposition::Accepted),
        "{handled:?}"
    );
    Ok(handled.module_version)
}

/// A mount runs a module by tag and another the same module by digest;
/// a new module pushed to the tag reloads the first (found by polling)
/// and leaves the pinned one as it was; a config reload naming a third
/// tag pulls it.
#[tokio::test]
async fn a_moved_tag_reloads_its_mounts_and_a_digest_stays_pinned() -> anyhow::Result<()> {
    let registry = OciRegistry::start().await?;
    let files = Workspace::new()?;
    let tag = registry.reference("team/handler:stable");
    let pinned = registry.push(&guest("fixture_script"), &tag).await?;
    assert!(pinned.contains("@sha256:"), "{pinned}");
    let (by_tag, by_digest) = (unique("oci-tag"), unique("oci-digest"));
    let first_config = config(
        &files,
        &registry,
        &[("tagged", &tag, &by_tag), ("pinned", &pinned, &by_digest)],
    )?;
    let mut host = TestHost::start_config(first_config).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    let first = handled_by(&mut host, &mut client, &by_tag).await?;
    assert_eq!(handled_by(&mut host, &mut client, &by_digest).await?, first);

    // Another handler under the same tag: `ack` accepts whatever it gets.
    let moved = registry.push(&guest("ack"), &tag).await?;
    assert_ne!(moved, pinned);
    let reloaded = host
        .next(|e| match e {
            Event::ModuleReloaded {
                mount,
                version,
                error,
                ..
            } if &**mount == "tagged" => Some((version.clone(), error.clone())),
            _ => None,
        })
        .await?;
    assert_eq!(reloaded.1, None, "the new module loads");
    assert_ne!(reloaded.0, first);
    assert_eq!(
        handled_by(&mut host, &mut client, &by_tag).await?,
        reloaded.0
    );
    assert_eq!(handled_by(&mut host, &mut client, &by_digest).await?, first);
    assert!(
        !host.seen(|e| matches!(e, Event::ModuleReloaded { mount, .. } if &**mount == "pinned")),
        "a module named by digest never moves"
    );

    // A config reload naming another tag pulls it before the mount starts.
    let canary = registry.reference("team/handler:canary");
    registry.push(&guest("fixture_script"), &canary).await?;
    let by_canary = unique("oci-canary");
    config(
        &files,
        &registry,
        &[
            ("tagged", &tag, &by_tag),
            ("pinned", &pinned, &by_digest),
            ("canary", &canary, &by_canary),
        ],
    )?;
    let change = crate::reload::config_reloaded(&mut host).await?;
    assert_eq!(change.added, ["t/canary"]);
    host.next(|e| {
        matches!(e, Event::MountReady { mount, .. } if &**mount == "canary").then_some(())
    })
    .await?;
    assert_eq!(handled_by(&mut host, &mut client, &by_canary).await?, first);
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// A digest or tag the registry does not hold refuses the config, naming
/// the tenant, the mount and the reference; nothing is left in the cache.
#[tokio::test]
async fn a_module_the_registry_does_not_hold_is_refused_naming_the_mount() -> anyhow::Result<()> {
    let registry = OciRegistry::start().await?;
    let files = Workspace::new()?;
    registry
        .push(
            &guest("fixture_script"),
            &registry.reference("team/handler:v1"),
        )
        .await?;
    let wrong = registry.reference(&format!("team/handler@sha256:{}", "0".repeat(64)));
    let missing_tag = registry.reference("team/handler:v2");
    for reference in [&wrong, &missing_tag] {
        let config = config(
            &files,
            &registry,
            &[("m", reference, &unique("oci-missing"))],
        )?;
        let error = refused(config, format!("{reference} loaded")).await?;
        assert!(error.contains("tenant `t`, mount `m`"), "{error}");
        assert!(error.contains(reference.as_str()), "{error}");
        assert!(error.contains("did not serve"), "{error}");
    }
    assert!(
        std::fs::read_dir(files.path("cache/oci"))
            .map_or(true, |mut entries| entries.next().is_none()),
        "nothing written"
    );
    Ok(())
}

/// A registry serving a manifest that does not describe a module (a
/// container image's layer, or a module's size understated) is refused
/// before or while its bytes are read; a version pulled before on disk
/// does not stand in for it.
#[tokio::test]
async fn a_manifest_that_does_not_match_its_module_is_refused() -> anyhow::Result<()> {
    let registry = OciRegistry::start().await?;
    let files = Workspace::new()?;
    let tag = registry.reference("team/handler:v1");
    registry.push(&guest("fixture_script"), &tag).await?;
    let queue = unique("oci-lie");
    let host = TestHost::start_config(config(&files, &registry, &[("m", &tag, &queue)])?).await?;
    host.stop().await?;

    let module = std::fs::read(guest("fixture_script"))?;
    let digest = format!("sha256:{:x}", sha2::Sha256::digest(&module));
    for (media_type, size, says) in [
        (
            "application/vnd.oci.image.layer.v1.tar",
            module.len(),
            "exactly one",
        ),
        ("application/wasm", module.len() / 2, "more than the"),
    ] {
        put_manifest(&registry, "team/handler", "v1", media_type, &digest, size).await?;
        if size < module.len() {
            // Kept bytes that match the digest are the module, whatever
            // size a manifest gives: only a download can be too long.
            std::fs::remove_dir_all(files.path("cache/oci"))?;
        }
        let error = refused(
            config(&files, &registry, &[("m", &tag, &queue)])?,
            format!("the {media_type} manifest of {size} bytes loaded"),
        )
        .await?;
        assert!(error.contains(says), "{error}");
        assert!(error.contains("mount `m`"), "{error}");
    }
    Ok(())
}

/// A restart while the registry is away starts with the module pulled
/// last, from the cache.
#[tokio::test]
async fn a_restart_with_the_registry_away_runs_the_module_pulled_before() -> anyhow::Result<()> {
    let registry = OciRegistry::start().await?;
    let files = Workspace::new()?;
    let tag = registry.reference("team/handler:v1");
    registry.push(&guest("fixture_script"), &tag).await?;
    let queue = unique("oci-away");
    let config = config(&files, &registry, &[("m", &tag, &queue)])?;
    let mut host = TestHost::start_config(config.clone()).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    let before = handled_by(&mut host, &mut client, &queue).await?;
    host.stop().await?;
    drop(registry);

    let mut host = TestHost::start_config(config).await?;
    assert_eq!(handled_by(&mut host, &mut client, &queue).await?, before);
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// A registry that answers only `ci` (password `pw1`, bcrypt cost 4).
const USERS: &str = "ci:$2a$04$hUWad.7IJ4148iGYVOV5qOm7l.C//mU3GfcuyltGem3uyDIPdfz2a\n";

/// A registry that asks for credentials: `wharf push --credentials` and
/// `[host.registry] credentials` read them from a Docker `config.json`;
/// without them the pull is refused, naming the mount.
#[tokio::test]
async fn credentials_come_from_a_docker_config_file() -> anyhow::Result<()> {
    use base64::Engine as _;
    let registry = OciRegistry::start_with_users(Some(USERS)).await?;
    let files = Workspace::new()?;
    let auth = base64::engine::general_purpose::STANDARD.encode("ci:pw1");
    files.replace(
        "docker.json",
        serde_json::json!({"auths": {registry.address.clone(): {"auth": auth}}})
            .to_string()
            .as_bytes(),
    )?;
    let tag = registry.reference("team/handler:v1");
    let credentials = files.path("docker.json").display().to_string();
    let anonymous = registry.push(&guest("fixture_script"), &tag).await;
    assert!(anonymous.is_err(), "an anonymous push is refused");
    registry
        .push_with(
            &guest("fixture_script"),
            &tag,
            &["--credentials", &credentials],
        )
        .await?;

    let queue = unique("oci-auth");
    let error = refused(
        config(&files, &registry, &[("m", &tag, &queue)])?,
        "pulled without credentials",
    )
    .await?;
    assert!(
        error.contains("mount `m`") && error.contains("did not serve"),
        "{error}"
    );
    let mut with_credentials = config(&files, &registry, &[("m", &tag, &queue)])?;
    with_credentials.host.registry.credentials = Some(files.path("docker.json"));
    let mut host = TestHost::start_config(with_credentials).await?;
    let mut client = Client::connect(&artemis_url()).await?;
    handled_by(&mut host, &mut client, &queue).await?;
    host.stop().await?;
    client.close().await;
    Ok(())
}

/// Replaces `repository:tag` with a manifest of one layer, written by hand
/// as a lying registry would serve it.
async fn put_manifest(
    registry: &OciRegistry,
    repository: &str,
    tag: &str,
    media_type: &str,
    digest: &str,
    size: usize,
) -> anyhow::Result<()> {
    let config = b"{}";
    let config_digest = format!("sha256:{:x}", sha2::Sha256::digest(config));
    let started = http_request(
        &registry.address,
        "POST",
        &format!("/v2/{repository}/blobs/uploads/"),
        &[],
        b"",
    )
    .await?;
    let location = started
        .lines()
        .find_map(|line| line.strip_prefix("Location: "))
        .map(|l| l.trim().to_owned())
        .ok_or_else(|| anyhow::anyhow!("no upload location: {started}"))?;
    let path = location
        .split_once("/v2/")
        .map_or(location.clone(), |(_, rest)| format!("/v2/{rest}"));
    let separator = if path.contains('?') { '&' } else { '?' };
    let stored = http_request(
        &registry.address,
        "PUT",
        &format!("{path}{separator}digest={config_digest}"),
        &[("Content-Type", "application/octet-stream")],
        config,
    )
    .await?;
    anyhow::ensure!(created(&stored), "{stored}");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.wasm.config.v0+json", "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": media_type, "digest": digest, "size": size}],
    });
    let answer = http_request(
        &registry.address,
        "PUT",
        &format!("/v2/{repository}/manifests/{tag}"),
        &[("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
        &serde_json::to_vec(&manifest)?,
    )
    .await?;
    anyhow::ensure!(created(&answer), "{answer}");
    Ok(())
}

fn created(answer: &str) -> bool {
    answer
        .lines()
        .next()
        .is_some_and(|status| status.contains(" 201 "))
}

/// Why `Host::load` refuses `config`; `loaded` is the failure if it
/// loads.
async fn refused(config: Config, loaded: impl std::fmt::Display) -> anyhow::Result<String> {
    match Host::load(config).await {
        Ok(_) => anyhow::bail!("{loaded}"),
        Err(error) => Ok(error.to_string()),
    }
}
