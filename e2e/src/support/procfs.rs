//! What `/proc` says of a process: its inotify watches, memory and descriptors.

use std::collections::BTreeSet;
use std::fs;

/// The inodes process `pid` holds inotify watches on (any of its instances).
pub fn inotify_watched_inodes(pid: u32) -> BTreeSet<u64> {
    inotify_watches(pid).into_iter().collect()
}

/// One inode per inotify watch process `pid` holds (an inode twice when two instances watch
/// it).
pub fn inotify_watches(pid: u32) -> Vec<u64> {
    let mut out = Vec::new();
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return out;
    };
    for fd in fds.flatten() {
        let info = fs::read_to_string(fd.path()).unwrap_or_default();
        for line in info.lines().filter(|l| l.starts_with("inotify wd:")) {
            if let Some(ino) = line
                .split_whitespace()
                .find_map(|f| f.strip_prefix("ino:"))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            {
                out.push(ino);
            }
        }
    }
    out
}

/// The peak resident memory of process `pid`, in KiB (`VmHWM`).
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// The descriptors process `pid` has open.
pub fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}
