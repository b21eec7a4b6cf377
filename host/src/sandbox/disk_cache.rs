//! Compiled modules kept on disk between starts: a restart loads machine
//! code instead of compiling again (a JavaScript or Python component takes
//! seconds to compile). Files are named by the module's digest and a key of
//! the engine's settings, so another wasmtime or another configuration
//! never reads them; wasmtime checks that again as it loads one.

use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// A folder of compiled modules for one engine.
pub(crate) struct DiskCache {
    folder: PathBuf,
    /// The engine's settings, as a file name part.
    engine_key: String,
}

impl DiskCache {
    /// The cache in `folder` (made when missing) for `engine`.
    pub(crate) fn new(folder: &Path, engine: &Engine) -> DiskCache {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        DiskCache {
            folder: folder.to_owned(),
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    fn file(&self, digest: &str) -> PathBuf {
        self.folder
            .join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The module of `digest`, if it was kept; a file wasmtime refuses is
    /// removed (and compiled again by the caller).
    #[allow(
        unsafe_code,
        reason = "loading compiled code is unsafe: wasmtime cannot check that it is what it compiled"
    )]
    pub(crate) fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let file = self.file(digest);
        if !file.exists() {
            return None;
        }
        // SAFETY: the folder is wharf's own (the config says only wharf may
        // write there), and every file in it was written by `save` below
        // from code this engine compiled; wasmtime checks its header and
        // the engine settings it was compiled with before using it.
        match unsafe { Component::deserialize_file(engine, &file) } {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "compiled module in the cache refused; compiling again");
                let _ = std::fs::remove_file(&file);
                None
            }
        }
    }

    /// Keeps `component`, compiled from a module of `digest`: written aside,
    /// then renamed, so a reader never sees half a file. A cache that
    /// cannot be written costs only the next start's compile (logged).
    pub(crate) fn save(&self, component: &Component, digest: &str) {
        let file = self.file(digest);
        let aside = file.with_extension(format!("{}.part", std::process::id()));
        let written = std::fs::create_dir_all(&self.folder)
            .and_then(|()| {
                let bytes = component.serialize().map_err(std::io::Error::other)?;
                std::fs::write(&aside, bytes)
            })
            .and_then(|()| std::fs::rename(&aside, &file));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&aside);
            tracing::warn!(folder = %self.folder.display(), error = %e, "cannot keep a compiled module; the next start compiles it again");
        }
    }
}
