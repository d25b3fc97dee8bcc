//! Watching what is in force: the config file and the runbook directories. A change on disk asks
//! for a reload; the [`Fingerprint`] says whether what is in force really changed, so a stray
//! file or a save without edits reloads nothing.

use tokio::sync::mpsc;

use super::Config;

/// What is in force: the config file's bytes and every runbook file's name and bytes. Reload
/// happens when this changes, not whenever something touches the folders.
#[derive(Debug, PartialEq, Eq)]
pub struct Fingerprint(u64);

impl Fingerprint {
    pub fn of(cfg: &Config) -> Fingerprint {
        let mut h = crate::model::Fnv::default();
        let mut eat = |bytes: &[u8]| h.eat(bytes);
        let read = |p: &std::path::Path| {
            // Bounded: a runbook or config larger than this is refused by the loader anyway.
            use std::io::Read;
            let mut buf = Vec::new();
            if let Ok(f) = std::fs::File::open(p) {
                let _ = f.take(4 << 20).read_to_end(&mut buf);
            }
            buf
        };
        if let Some(p) = &cfg.source {
            eat(p.as_os_str().as_encoded_bytes());
            eat(&read(p));
        }
        for d in cfg.runbooks.dirs() {
            eat(d.as_os_str().as_encoded_bytes());
            let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&d)
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
                        .collect()
                })
                .unwrap_or_default();
            files.sort();
            for f in files {
                eat(f.as_os_str().as_encoded_bytes());
                eat(&read(&f));
            }
        }
        Fingerprint(h.finish())
    }
}

/// Watches the config file and the runbook directories; any change asks for a reload. The
/// directory of the config is watched, not the file, since editors replace files by renaming.
pub fn watch_config(cfg: &Config, tx: mpsc::Sender<()>) -> Option<::notify::RecommendedWatcher> {
    use ::notify::Watcher;
    let path = cfg.source.clone()?;
    let file_name = path.file_name().map(|n| n.to_os_string());
    let dir = path
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                p
            }
        })?
        .to_path_buf();
    let runbook_dirs = cfg.runbooks.dirs();
    let mut w = match ::notify::recommended_watcher(move |ev: ::notify::Result<::notify::Event>| {
        let Ok(ev) = ev else { return };
        if matches!(ev.kind, ::notify::EventKind::Access(_)) {
            return;
        }
        let relevant = ev.paths.iter().any(|p| {
            p.file_name().map(|n| n.to_os_string()) == file_name
                || p.extension().is_some_and(|e| e == "toml")
        });
        if relevant {
            let _ = tx.try_send(());
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(
                "cannot watch {} for changes ({e}); reload with SIGHUP",
                path.display()
            );
            return None;
        }
    };
    if let Err(e) = w.watch(&dir, ::notify::RecursiveMode::NonRecursive) {
        tracing::warn!(
            "cannot watch {} for changes ({e}); reload with SIGHUP",
            dir.display()
        );
        return None;
    }
    for d in runbook_dirs {
        let _ = w.watch(&d, ::notify::RecursiveMode::NonRecursive);
    }
    Some(w)
}
