//! Noticing changed files: module files and the config file. Folders are
//! watched rather than files, so a file replaced by rename (as deploy tools
//! and editors do) is still seen, and so is a file reached through a
//! symlink that is swapped (Kubernetes mounts a ConfigMap as
//! `name -> ..data/name` and swaps `..data`): any event in a watched file's
//! folder makes the host look at the file again, and it counts as changed
//! when what it resolves to, its size or its modification time differ. A
//! burst of writes is reported once it has been quiet for a moment.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long a folder must stay quiet before its files are looked at, so a
/// file still being written is not read half-done.
const QUIET: Duration = Duration::from_millis(200);

/// What a file is now: where it resolves to, its size and modification
/// time. `None` while it does not exist.
type Signature = Option<(PathBuf, u64, Option<SystemTime>)>;

fn signature(file: &Path) -> Signature {
    let target = std::fs::canonicalize(file).ok()?;
    let metadata = std::fs::metadata(&target).ok()?;
    Some((target, metadata.len(), metadata.modified().ok()))
}

/// Watches a set of files.
pub(crate) struct FileWatcher {
    watcher: Option<notify::RecommendedWatcher>,
    folders: BTreeSet<PathBuf>,
    /// Every watched file (its folder resolved) and what it was when last
    /// looked at.
    files: HashMap<PathBuf, Signature>,
    raw: mpsc::UnboundedReceiver<PathBuf>,
    /// Folders with events, and when they were last written to.
    settling: HashMap<PathBuf, Instant>,
    /// Files found changed, not yet reported.
    changed: Vec<PathBuf>,
}

impl FileWatcher {
    /// A watcher; if the platform cannot watch files, one that never
    /// reports (logged once).
    pub(crate) fn new() -> FileWatcher {
        let (tx, raw) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if let Ok(event) = event
                && (event.kind.is_create() || event.kind.is_modify() || event.kind.is_remove())
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
            files: HashMap::new(),
            raw,
            settling: HashMap::new(),
            changed: Vec::new(),
        }
    }

    /// Watches exactly `files` from now on.
    pub(crate) fn watch<'a>(&mut self, files: impl IntoIterator<Item = &'a Path>) {
        let wanted: HashMap<PathBuf, Signature> = files
            .into_iter()
            .filter_map(canonical)
            .map(|file| {
                let known = self.files.get(&file).cloned();
                let now = known.unwrap_or_else(|| signature(&file));
                (file, now)
            })
            .collect();
        self.files = wanted;
        let Some(watcher) = &mut self.watcher else {
            return;
        };
        let folders: BTreeSet<PathBuf> = self
            .files
            .keys()
            .filter_map(|file| file.parent().map(Path::to_owned))
            .collect();
        for folder in self.folders.difference(&folders) {
            let _ = watcher.unwatch(folder);
        }
        for folder in folders.difference(&self.folders) {
            if let Err(e) = watcher.watch(folder, RecursiveMode::NonRecursive) {
                tracing::warn!(folder = %folder.display(), error = %e, "cannot watch folder; its files reload only on SIGHUP");
            }
        }
        self.folders = folders;
    }

    /// The next watched file that changed, canonical. Cancel-safe.
    pub(crate) async fn changed(&mut self) -> PathBuf {
        loop {
            if let Some(file) = self.changed.pop() {
                return file;
            }
            let next_quiet = self.settling.values().min().copied();
            tokio::select! {
                Some(path) = self.raw.recv() => {
                    if let Some(folder) = path.parent() {
                        self.settling.insert(folder.to_owned(), Instant::now() + QUIET);
                    }
                }
                () = sleep_until(next_quiet) => self.look_at_quiet_folders(),
            }
        }
    }

    /// Compares every file in folders that have gone quiet with what it was.
    fn look_at_quiet_folders(&mut self) {
        let now = Instant::now();
        let quiet: Vec<PathBuf> = self
            .settling
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(folder, _)| folder.clone())
            .collect();
        for folder in quiet {
            self.settling.remove(&folder);
            for (file, known) in &mut self.files {
                if file.parent() != Some(folder.as_path()) {
                    continue;
                }
                let now = signature(file);
                // A file that went away is not a change to act on; its
                // return is.
                if now.is_some() && now != *known {
                    self.changed.push(file.clone());
                }
                *known = now;
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
/// were written (the file itself may be missing mid-replace, or a symlink).
pub(crate) fn canonical(file: &Path) -> Option<PathBuf> {
    let folder = match file.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    Some(folder.canonicalize().ok()?.join(file.file_name()?))
}
