//! The Job records under the share (`jobs/<pod-uid>`, a directory no pod mounts): each
//! shutdown that took effect and each failure reported, so an agent restarted in between
//! repeats neither. Opened without following links: the agent runs as root.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use tracing::warn;

use super::JOBS_DIR;
use crate::pod::PodUid;
use crate::stats::Stats;

/// A record lists container names; nothing valid is this large.
const MAX_RECORD_BYTES: u64 = 64 * 1024;

fn record(dir: &Path, pod: &PodUid) -> PathBuf {
    dir.join(pod.as_str())
}

/// The records' directory: created if missing, and refused unless it is a real directory
/// (the agent runs as root and follows no link in the share).
pub(super) fn records_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.is_dir() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )))
    }
}

fn open_record(dir: &Path, pod: &PodUid, append: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    records_dir(dir)?;
    let mut opts = std::fs::OpenOptions::new();
    if append {
        opts.create(true).append(true).mode(0o600);
    } else {
        opts.read(true);
    }
    opts.custom_flags(nofollow()).open(record(dir, pod))
}

/// `O_NOFOLLOW`: a link in place of a record is refused, not followed.
fn nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// What the record says: the attempts shut down, and those whose exit was reported.
pub(super) fn load(dir: &Path, pod: &PodUid) -> (BTreeSet<String>, BTreeSet<String>) {
    use std::io::Read as _;
    let mut text = String::new();
    let read = open_record(dir, pod, false)
        .and_then(|f| f.take(MAX_RECORD_BYTES).read_to_string(&mut text));
    let (mut asked, mut reported) = (BTreeSet::new(), BTreeSet::new());
    if let Err(e) = read {
        if e.kind() != std::io::ErrorKind::NotFound {
            warn!(pod = %pod, error = %e, "cannot read the Job's record; starting from nothing");
        }
        return (asked, reported);
    }
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("shutdown", id)) => {
                asked.insert(id.trim().to_owned());
            }
            Some(("reported", id)) => {
                reported.insert(id.trim().to_owned());
            }
            _ => {}
        }
    }
    (asked, reported)
}

/// Adds a line to the pod's record: appended (`O_APPEND`: the shutdowns of one level, in
/// their own tasks, never interleave), synced before the caller goes on.
pub(super) fn append(dir: &Path, pod: &PodUid, line: &str, stats: &Stats) {
    let res = open_record(dir, pod, true).and_then(|mut f| {
        f.write_all(format!("{line}\n").as_bytes())?;
        f.sync_data()
    });
    if let Err(e) = res {
        stats.share_error();
        warn!(pod = %pod, line = %line, error = %e, "cannot write the Job's record; an agent restarted now would repeat it");
    }
}

/// Records of pods the runtime no longer has (deleted before their Job finished).
pub fn stale_records(share_dir: &Path, live: impl Fn(&PodUid) -> bool) -> Vec<PathBuf> {
    let dir = share_dir.join(JOBS_DIR);
    if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            PodUid::parse(&name).is_ok_and(|pod| !live(&pod))
        })
        .map(|e| e.path())
        .collect()
}
