//! Noticing changed files: module files and the config file. Folders are
//! watched rather than files, so a file replaced by rename (as deploy tools
//! and editors do) is still seen; a burst of writes to one file is reported
//! once it has been quiet for a moment.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long a file must stay unchanged before it is reported, so a file
/// still being written is not read half-done.
const QUIET: Duration = Duration::from_millis(200);

/// Watches a set of files.
pub(crate) struct FileWatcher {
    watcher: Option<notify::RecommendedWatcher>,
    folders: BTreeSet<PathBuf>,
    raw: mpsc::UnboundedReceiver<PathBuf>,
    /// Changed files and when they were last written to.
    settling: HashMap<PathBuf, Instant>,
}

impl FileWatcher {
    /// A watcher; if the platform cannot watch files, one that never
    /// reports (logged once).
    pub(crate) fn new() -> FileWatcher {
        let (tx, raw) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if let Ok(event) = event
                && (event.kind.is_create() || event.kind.is_modify())
            {
                for path in event.paths {
                    let _ = tx.send(path);
                }
            }
        });
        let watcher = match watcher {
            Ok(watcher) => Some(watcher),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch files; modules and config reload only on SIGHUP");
                None
            }
        };
        FileWatcher {
            watcher,
            folders: BTreeSet::new(),
            raw,
            settling: HashMap::new(),
        }
    }

    /// Watches exactly `files` from now on.
    pub(crate) fn watch<'a>(&mut self, files: impl IntoIterator<Item = &'a Path>) {
        let Some(watcher) = &mut self.watcher else {
            return;
        };
        let wanted: BTreeSet<PathBuf> = files
            .into_iter()
            .filter_map(|file| canonical(file)?.parent().map(Path::to_owned))
            .collect();
        for folder in self.folders.difference(&wanted) {
            let _ = watcher.unwatch(folder);
        }
        for folder in wanted.difference(&self.folders) {
            if let Err(e) = watcher.watch(folder, RecursiveMode::NonRecursive) {
                tracing::warn!(folder = %folder.display(), error = %e, "cannot watch folder; its files reload only on SIGHUP");
            }
        }
        self.folders = wanted;
    }

    /// The next file that changed and has since been quiet, canonical.
    /// Cancel-safe.
    pub(crate) async fn changed(&mut self) -> PathBuf {
        loop {
            let next_quiet = self.settling.values().min().copied();
            tokio::select! {
                Some(path) = self.raw.recv() => {
                    self.settling.insert(path, Instant::now() + QUIET);
                }
                () = sleep_until(next_quiet) => {
                    let now = Instant::now();
                    if let Some(path) = self
                        .settling
                        .iter()
                        .find(|(_, at)| **at <= now)
                        .map(|(path, _)| path.clone())
                    {
                        self.settling.remove(&path);
                        return path;
                    }
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `file` with its folder resolved, so paths compare equal however they
/// were written (the file itself may be missing mid-replace).
pub(crate) fn canonical(file: &Path) -> Option<PathBuf> {
    let folder = match file.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    Some(folder.canonicalize().ok()?.join(file.file_name()?))
}
