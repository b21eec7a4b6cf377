//! Modules pulled from OCI registries and pushed to them, in the layout
//! wasm tooling shares (a manifest whose config is
//! `application/vnd.wasm.config.v0+json` and whose one layer is
//! `application/wasm`).
//!
//! A pulled module is kept in one file per reference under the module
//! cache and replaced (write, then rename) only when the registry serves
//! other content, so the host's file watcher sees a moved tag as a changed
//! module, and a restart with the registry away starts with what was
//! pulled last. Every byte is checked against the digest that names it;
//! a registry's manifest can point only at blobs of the same repository
//! (the `urls` of foreign layers are never followed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol, Config as BlobConfig, ImageLayer};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;
use wharf_core::config::{Config, RegistrySettings};
use wharf_core::oci::{ModuleReference, Version, check_digest};

use crate::sync::Locked as _;

/// The media type of a component layer.
pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The media type of the config blob describing a component.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// Layer media types accepted on pull: the shared one, and the one older
/// tools (`wasm-to-oci`) write.
const LAYER_MEDIA_TYPES: [&str; 2] = [
    LAYER_MEDIA_TYPE,
    oci_client::manifest::WASM_LAYER_MEDIA_TYPE,
];
/// Manifests bigger than this are not a module's.
const MAX_MANIFEST_LAYERS: usize = 16;

/// Why a module could not be pulled or pushed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry could not be reached or did not answer as asked:
    /// a module pulled before may still serve.
    #[error("the registry did not serve it: {0}")]
    Unreachable(String),
    /// The registry answered with something that is not this module:
    /// nothing pulled before is used instead.
    #[error("{0}")]
    Refused(String),
    /// The credentials file cannot be read.
    #[error("registry credentials `{}`: {reason}", path.display())]
    Credentials {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The cache folder cannot be written.
    #[error("module cache `{}`: {source}", path.display())]
    Cache {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl From<oci_client::errors::OciDistributionError> for RegistryError {
    fn from(error: oci_client::errors::OciDistributionError) -> RegistryError {
        RegistryError::Unreachable(error.to_string())
    }
}

/// What a pull found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The digest of the module's bytes (its layer).
    pub digest: String,
    /// The manifest's digest: what the tag resolved to.
    pub manifest: String,
    /// Whether the file was written (new or other content).
    pub changed: bool,
}

/// Pulls and pushes modules, as `[host.registry]` says.
#[derive(Clone)]
pub struct Registry {
    settings: RegistrySettings,
    /// A client per registry, with the credentials it was made with: the
    /// OCI client keeps a registry's first credentials for good, so new
    /// ones (a rotated Secret) get a new client.
    clients: Arc<Mutex<HashMap<String, (RegistryAuth, Client)>>>,
}

impl Registry {
    /// A registry client for `settings`.
    pub fn new(settings: &RegistrySettings) -> Registry {
        // reqwest's TLS takes the process's provider; the AMQP side brings
        // its own, so this only matters here. Already set is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Registry {
            settings: settings.clone(),
            clients: Arc::default(),
        }
    }

    /// The client for `registry`, with its credentials as the credentials
    /// file gives them now.
    fn client(&self, registry: &str) -> Result<(Client, RegistryAuth), RegistryError> {
        let auth = self.auth(registry)?;
        let mut clients = self.clients.locked();
        if let Some((made_with, client)) = clients.get(registry)
            && *made_with == auth
        {
            return Ok((client.clone(), auth));
        }
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.settings.plain_http.clone()),
            // Modules are not multi-platform images: an index is refused.
            platform_resolver: None,
            // One PUT per blob: every registry takes it (chunked uploads
            // are answered differently by each), and modules are small.
            use_monolithic_push: true,
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(60)),
            user_agent: concat!("wharf/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        });
        clients.insert(registry.to_owned(), (auth.clone(), client.clone()));
        Ok((client, auth))
    }

    /// The digest of the manifest a tag names now, as the registry says
    /// (`HEAD`): enough to tell whether it moved, not to trust content.
    pub async fn manifest_digest(
        &self,
        reference: &ModuleReference,
    ) -> Result<String, RegistryError> {
        let (client, auth) = self.client(&reference.registry)?;
        Ok(client
            .fetch_manifest_digest(&to_reference(reference), &auth)
            .await?)
    }

    /// Makes `file` hold the module `reference` names now: resolves a tag,
    /// checks the manifest and the module against their digests and the
    /// size limit, and replaces the file only if its content differs.
    pub async fn pull(
        &self,
        reference: &ModuleReference,
        file: &Path,
    ) -> Result<Pulled, RegistryError> {
        let refused = RegistryError::Refused;
        let target = to_reference(reference);
        let (client, auth) = self.client(&reference.registry)?;
        let (manifest_bytes, _) = client
            .pull_manifest_raw(&target, &auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await?;
        let manifest = sha256(&manifest_bytes);
        if let Version::Digest(wanted) = &reference.version
            && *wanted != manifest
        {
            return Err(refused(format!(
                "the registry served a manifest whose digest is {manifest}, not the one named"
            )));
        }
        let layer =
            module_layer(&manifest_bytes, self.settings.max_module_size).map_err(refused)?;
        if file_digest(file).await.as_deref() == Some(layer.digest.as_str()) {
            return Ok(Pulled {
                digest: layer.digest,
                manifest,
                changed: false,
            });
        }
        let stream = client
            .pull_blob_stream(&target, layer.digest.as_str())
            .await?
            .stream;
        write_checked(stream, &layer, file).await?;
        Ok(Pulled {
            digest: layer.digest,
            manifest,
            changed: true,
        })
    }

    /// Pushes `component` as `reference` and returns the manifest's digest
    /// the registry now serves for it.
    pub async fn push(
        &self,
        component: Vec<u8>,
        reference: &ModuleReference,
    ) -> Result<String, RegistryError> {
        let config = wasm_config(&component).map_err(RegistryError::Refused)?;
        let target = to_reference(reference);
        let (client, auth) = self.client(&reference.registry)?;
        let layer = ImageLayer::new(component, LAYER_MEDIA_TYPE.to_owned(), None);
        let config = BlobConfig::new(config, CONFIG_MEDIA_TYPE.to_owned(), None);
        client.push(&target, &[layer], config, &auth, None).await?;
        let (manifest, _) = client
            .pull_manifest_raw(&target, &auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await?;
        Ok(sha256(&manifest))
    }

    /// The credentials for `registry` from the credentials file (read
    /// now, so a rotated Secret takes effect), or anonymous.
    fn auth(&self, registry: &str) -> Result<RegistryAuth, RegistryError> {
        let Some(path) = &self.settings.credentials else {
            return Ok(RegistryAuth::Anonymous);
        };
        let failed = |reason: String| RegistryError::Credentials {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        credentials_for(&text, registry).map_err(failed)
    }
}

/// Pulls every module the config names from a registry, once per
/// reference, into the files the config keeps them in. A registry that
/// cannot be reached leaves a module pulled before in place (logged); a
/// module never pulled, or content that is not the module named, fails
/// the mounts using it.
pub async fn pull_all(
    registry: &Registry,
    config: &Config,
) -> Result<(), Vec<(ModuleReference, RegistryError)>> {
    let mut errors = Vec::new();
    for (reference, file) in pulled_modules(config) {
        match registry.pull(&reference, &file).await {
            Ok(pulled) => log_pulled(&reference, &pulled, "module pulled"),
            Err(error @ RegistryError::Unreachable(_)) if file.is_file() => {
                tracing::warn!(
                    module = %reference,
                    "{error}; the version pulled before serves"
                );
            }
            Err(error) => errors.push((reference, error)),
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Each reference the config's mounts pull from, with its file.
pub fn pulled_modules(config: &Config) -> HashMap<ModuleReference, PathBuf> {
    config
        .mounts()
        .filter_map(|(_, mount)| Some((mount.pulled_from.clone()?, mount.module.clone())))
        .collect()
}

/// Says what a tag resolved to (`what` when that is new content).
fn log_pulled(reference: &ModuleReference, pulled: &Pulled, what: &str) {
    if pulled.changed {
        tracing::info!(
            module = %reference,
            manifest = %pulled.manifest,
            digest = %pulled.digest,
            "{what}"
        );
    } else {
        tracing::debug!(module = %reference, manifest = %pulled.manifest, "module unchanged");
    }
}

/// Resolves the config's tags every `[host.registry] poll` until `stop`:
/// a tag whose manifest changed is pulled, which replaces its file, which
/// the host's watcher reloads like any changed module. `modules` follows
/// the config in force.
pub async fn poll_tags(
    registry: Registry,
    mut modules: tokio::sync::watch::Receiver<HashMap<ModuleReference, PathBuf>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut every = tokio::time::interval(registry.settings.poll);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    // The manifest each tag named when last looked at.
    let mut seen: HashMap<ModuleReference, String> = HashMap::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let tags: Vec<(ModuleReference, PathBuf)> = modules
            .borrow_and_update()
            .iter()
            .filter(|(reference, _)| reference.is_tag())
            .map(|(r, f)| (r.clone(), f.clone()))
            .collect();
        seen.retain(|reference, _| tags.iter().any(|(r, _)| r == reference));
        for (reference, file) in tags {
            let checked = tokio::select! {
                _ = stop.cancelled() => return,
                checked = check_tag(&registry, &reference, &file, seen.get(&reference)) => checked,
            };
            match checked {
                Ok(manifest) => {
                    seen.insert(reference, manifest);
                }
                Err(error) => {
                    tracing::warn!(module = %reference, "module tag not checked: {error}")
                }
            }
        }
    }
}

/// Asks where a tag points and, if not at `last`, pulls it; returns the
/// manifest it names now.
async fn check_tag(
    registry: &Registry,
    reference: &ModuleReference,
    file: &Path,
    last: Option<&String>,
) -> Result<String, RegistryError> {
    let now = registry.manifest_digest(reference).await?;
    if last == Some(&now) {
        return Ok(now);
    }
    let pulled = registry.pull(reference, file).await?;
    log_pulled(reference, &pulled, "module tag moved; reloading");
    Ok(pulled.manifest)
}

fn to_reference(reference: &ModuleReference) -> Reference {
    let (registry, repository) = (reference.registry.clone(), reference.repository.clone());
    match &reference.version {
        Version::Tag(tag) => Reference::with_tag(registry, repository, tag.clone()),
        Version::Digest(digest) => Reference::with_digest(registry, repository, digest.clone()),
    }
}

/// The one module layer of a manifest, checked before any of its bytes
/// are fetched.
struct Layer {
    digest: String,
    size: u64,
}

fn module_layer(manifest: &[u8], max_size: u64) -> Result<Layer, String> {
    let manifest: OciImageManifest = serde_json::from_slice(manifest).map_err(|e| {
        format!("the registry served a manifest that is not an OCI image manifest: {e}")
    })?;
    if manifest.layers.len() > MAX_MANIFEST_LAYERS {
        return Err(format!(
            "the manifest has {} layers; a module has one",
            manifest.layers.len()
        ));
    }
    let mut wasm = manifest
        .layers
        .iter()
        .filter(|layer| LAYER_MEDIA_TYPES.contains(&layer.media_type.as_str()));
    let (Some(layer), None) = (wasm.next(), wasm.next()) else {
        return Err(format!(
            "the manifest does not have exactly one `{LAYER_MEDIA_TYPE}` layer (it is not a wasm artefact: push modules with `wharf push`)"
        ));
    };
    check_digest(&layer.digest).map_err(|why| format!("the module's layer digest {why}"))?;
    let size = u64::try_from(layer.size)
        .map_err(|_| "the module's layer has a negative size".to_owned())?;
    if size > max_size {
        return Err(format!(
            "the module is {size} bytes, more than `[host.registry] max_module_size` ({max_size})"
        ));
    }
    Ok(Layer {
        digest: layer.digest.clone(),
        size,
    })
}

/// Writes a module's bytes beside `file`, checked against the layer's size
/// (while reading) and digest, then renames them over `file`; nothing is
/// left behind when a check fails.
async fn write_checked(
    mut stream: futures_util::stream::BoxStream<'static, Result<bytes::Bytes, std::io::Error>>,
    layer: &Layer,
    file: &Path,
) -> Result<(), RegistryError> {
    let folder = file.parent().unwrap_or(Path::new("."));
    let cache = |source| RegistryError::Cache {
        path: folder.to_owned(),
        source,
    };
    tokio::fs::create_dir_all(folder).await.map_err(cache)?;
    let partial = partial_name(file);
    let written = async {
        let mut out = tokio::fs::File::create(&partial).await.map_err(cache)?;
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| RegistryError::Unreachable(e.to_string()))?;
            size += chunk.len() as u64;
            if size > layer.size {
                return Err(RegistryError::Refused(format!(
                    "the registry sent more than the {} bytes the manifest gives",
                    layer.size
                )));
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(cache)?;
        }
        let got = format!("sha256:{:x}", hasher.finalize());
        if got != layer.digest {
            return Err(RegistryError::Refused(format!(
                "the module's bytes have the digest {got}, not the manifest's {}",
                layer.digest
            )));
        }
        out.sync_all().await.map_err(cache)?;
        tokio::fs::rename(&partial, file).await.map_err(cache)
    }
    .await;
    if written.is_err() {
        let _ = tokio::fs::remove_file(&partial).await;
    }
    written
}

/// The digest of what `file` holds now, if it can be read.
async fn file_digest(file: &Path) -> Option<String> {
    let bytes = tokio::fs::read(file).await.ok()?;
    Some(sha256(&bytes))
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// A file beside `file` to write into before the rename: unique per pull,
/// so two pulls of one reference never write into each other.
fn partial_name(file: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{n}.partial", std::process::id()));
    file.with_file_name(name)
}

/// A Docker `config.json`'s entry for `registry`: `auth` (base64 of
/// `user:password`), or `username` and `password`.
fn credentials_for(text: &str, registry: &str) -> Result<RegistryAuth, String> {
    #[derive(Deserialize)]
    struct DockerConfig {
        #[serde(default)]
        auths: HashMap<String, Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        auth: Option<String>,
        username: Option<String>,
        password: Option<String>,
    }
    let config: DockerConfig =
        serde_json::from_str(text).map_err(|e| format!("not a Docker config.json: {e}"))?;
    // Keys may be written as URLs (`https://ghcr.io/v1/`).
    let host_of = |key: &str| {
        let key = key.split_once("://").map_or(key, |(_, rest)| rest);
        key.split('/').next().unwrap_or(key).to_owned()
    };
    let Some(entry) = config
        .auths
        .iter()
        .find(|(key, _)| host_of(key) == registry)
    else {
        return Ok(RegistryAuth::Anonymous);
    };
    let entry = entry.1;
    if let Some(auth) = &entry.auth {
        use base64::Engine as _;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| format!("`auths.{registry}.auth` is not base64"))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| format!("`auths.{registry}.auth` is not `user:password`"))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or_else(|| format!("`auths.{registry}.auth` is not `user:password`"))?;
        return Ok(RegistryAuth::Basic(user.to_owned(), password.to_owned()));
    }
    match (&entry.username, &entry.password) {
        (Some(user), Some(password)) => Ok(RegistryAuth::Basic(user.clone(), password.clone())),
        _ => Err(format!(
            "`auths.{registry}` has neither `auth` nor `username` and `password`"
        )),
    }
}

/// The config blob wasm tooling writes beside a component: what it is
/// (`wasip2`), its layer's digest, and the names it imports and exports.
fn wasm_config(component: &[u8]) -> Result<Vec<u8>, String> {
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        use wasmparser::Payload;
        match payload.map_err(|e| format!("not a wasm component: {e}"))? {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != wasmparser::Encoding::Component {
                    return Err(
                        "not a wasm component (a core module: build it as a component)".to_owned(),
                    );
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(section) if depth == 1 => {
                for import in section {
                    let import = import.map_err(|e| format!("not a wasm component: {e}"))?;
                    imports.push(import.name.name.to_owned());
                }
            }
            Payload::ComponentExportSection(section) if depth == 1 => {
                for export in section {
                    let export = export.map_err(|e| format!("not a wasm component: {e}"))?;
                    exports.push(export.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    let created = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let config = serde_json::json!({
        "created": created,
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [sha256(component)],
        "component": { "imports": imports, "exports": exports, "target": null },
    });
    serde_json::to_vec(&config).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_found_by_registry_in_either_spelling() {
        let file = r#"{"auths": {
            "https://ghcr.io/v1/": {"auth": "dXNlcjpwYXNzOndvcmQ="},
            "127.0.0.1:5000": {"username": "ci", "password": "secret"}
        }}"#;
        assert_eq!(
            credentials_for(file, "ghcr.io").expect("valid"),
            RegistryAuth::Basic("user".into(), "pass:word".into())
        );
        assert_eq!(
            credentials_for(file, "127.0.0.1:5000").expect("valid"),
            RegistryAuth::Basic("ci".into(), "secret".into())
        );
        assert_eq!(
            credentials_for(file, "quay.io").expect("valid"),
            RegistryAuth::Anonymous
        );
        let bad = credentials_for(r#"{"auths": {"r": {"auth": "%%"}}}"#, "r").expect_err("refused");
        assert!(bad.contains("auths.r.auth"), "{bad}");
        assert!(
            credentials_for("[", "r")
                .expect_err("refused")
                .contains("Docker config.json")
        );
    }

    fn manifest(layers: &[(&str, i64)]) -> Vec<u8> {
        let layers: Vec<_> = layers
            .iter()
            .map(|(media_type, size)| {
                serde_json::json!({
                    "mediaType": media_type,
                    "digest": format!("sha256:{}", "a".repeat(64)),
                    "size": size,
                })
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "config": {
                "mediaType": CONFIG_MEDIA_TYPE,
                "digest": format!("sha256:{}", "b".repeat(64)),
                "size": 2,
            },
            "layers": layers,
        }))
        .expect("valid")
    }

    #[test]
    fn a_manifest_must_hold_one_module_within_the_limit() {
        let one = module_layer(&manifest(&[(LAYER_MEDIA_TYPE, 10)]), 10).expect("valid");
        assert_eq!(one.size, 10);
        let too_big = module_layer(&manifest(&[(LAYER_MEDIA_TYPE, 11)]), 10)
            .err()
            .expect("valid");
        assert!(too_big.contains("max_module_size"), "{too_big}");
        let image = module_layer(
            &manifest(&[("application/vnd.oci.image.layer.v1.tar", 1)]),
            10,
        )
        .err()
        .expect("valid");
        assert!(image.contains("exactly one"), "{image}");
        let two = manifest(&[(LAYER_MEDIA_TYPE, 1), (LAYER_MEDIA_TYPE, 1)]);
        assert!(module_layer(&two, 10).is_err());
        let negative = module_layer(&manifest(&[(LAYER_MEDIA_TYPE, -1)]), 10)
            .err()
            .expect("valid");
        assert!(negative.contains("negative"), "{negative}");
    }
}
