//! The mount table, watched for what is mounted below the roots.
//!
//! A `medium: Memory` emptyDir is a tmpfs the kubelet mounts over a directory it has just
//! made (`pkg/volume/emptydir/empty_dir.go`, `setupTmpfs`: `setupDir`, then
//! `MountSensitiveWithoutSystemd("tmpfs", dir, "tmpfs", ["size=<sizeLimit>"])`). The agent
//! may add its watch between the two, on the directory the mount then hides: inotify says
//! nothing of a mount, and every exit made in the tmpfs would go unseen. The kernel marks
//! `/proc/self/mountinfo` readable with `POLLPRI` whenever the mount namespace's table
//! changes (`fs/proc_namespace.c`, `mounts_poll`); the watcher's thread polls it beside its
//! inotify instances, and each pod below which a mount came or went is walked again, which
//! re-opens its levels and moves a watch to the directory now there.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use super::{pod_dir_of, Root};

/// `/proc/self/mountinfo`, and the mount points below the roots as it last said.
pub(super) struct MountTable {
    file: File,
    known: BTreeSet<PathBuf>,
    /// The whole table is read at each change: its size on a node of many pods (a few
    /// hundred bytes per mount) is bounded here so a runaway table cannot grow the agent.
    buf: Vec<u8>,
}

/// The most of the table read (a node's has a few mounts per pod).
const MAX_TABLE: u64 = 16 << 20;

impl MountTable {
    /// Opens this process's mount table and reads what is mounted below `roots` now.
    pub(super) fn open(roots: &[Root]) -> std::io::Result<Self> {
        let file = File::open("/proc/self/mountinfo")?;
        let mut table = MountTable {
            file,
            known: BTreeSet::new(),
            buf: Vec::new(),
        };
        table.known = table.read(roots)?;
        Ok(table)
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Reads the table again: the pod directories below which a mount came or went since
    /// the last read, each under the root as the caller names it.
    pub(super) fn changed(&mut self, roots: &[Root]) -> std::io::Result<BTreeSet<PathBuf>> {
        let now = self.read(roots)?;
        let pods = self
            .known
            .symmetric_difference(&now)
            .filter_map(|m| pod_dir_of(roots, m).map(|(_, pod)| pod))
            .collect();
        self.known = now;
        Ok(pods)
    }

    fn read(&mut self, roots: &[Root]) -> std::io::Result<BTreeSet<PathBuf>> {
        self.buf.clear();
        (&self.file).seek(SeekFrom::Start(0))?;
        (&self.file).take(MAX_TABLE).read_to_end(&mut self.buf)?;
        Ok(mount_points(&self.buf)
            .filter(|m| pod_dir_of(roots, m).is_some())
            .collect())
    }
}

/// Each line's mount point (its fifth field), unescaped.
fn mount_points(table: &[u8]) -> impl Iterator<Item = PathBuf> + '_ {
    table.split(|b| *b == b'\n').filter_map(|line| {
        let field = line.split(|b| *b == b' ').nth(4)?;
        Some(PathBuf::from(std::ffi::OsString::from_vec(unescape(field))))
    })
}

/// The kernel writes a space, tab, newline and backslash in a path as `\ooo` (octal).
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut rest = field;
    while let Some((&b, after)) = rest.split_first() {
        let octal = match after {
            [a, b2, c, ..] if b == b'\\' => {
                let digits = [*a, *b2, *c];
                digits
                    .iter()
                    .all(|d| (b'0'..=b'7').contains(d))
                    .then(|| digits.iter().fold(0u32, |n, d| (n << 3) | u32::from(d & 7)))
                    .and_then(|n| u8::try_from(n).ok())
            }
            _ => None,
        };
        match octal {
            Some(byte) => {
                out.push(byte);
                rest = after.get(3..).unwrap_or_default();
            }
            None => {
                out.push(b);
                rest = after;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[u8] = b"\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
91 22 0:45 / /var/lib/kubelet/pods/0f5c/volumes/kubernetes.io~projected/kube-api-access rw,relatime shared:50 - tmpfs tmpfs rw,size=1024k
95 22 0:47 / /var/lib/kubelet/pods/0f5c/volumes/kubernetes.io~empty-dir/exitorder rw,relatime shared:52 - tmpfs tmpfs rw,size=1024k
96 22 0:48 / /srv/odd\\040root/pods/ab12/x rw - tmpfs tmpfs rw
97 22 0:49 / /var/lib/kubelet rw - ext4 /dev/sdb1 rw
";

    #[test]
    fn the_mount_points_below_a_root_name_their_pods() {
        let roots = ["/var/lib/kubelet/pods", "/srv/odd root/pods"].map(|p| Root {
            pods: p.into(),
            container_depth: 5,
        });
        let below: BTreeSet<PathBuf> = mount_points(TABLE)
            .filter_map(|m| pod_dir_of(&roots, &m).map(|(_, pod)| pod))
            .collect();
        assert_eq!(
            below,
            BTreeSet::from([
                PathBuf::from("/var/lib/kubelet/pods/0f5c"),
                PathBuf::from("/srv/odd root/pods/ab12"),
            ])
        );
        let below = |p: &str| pod_dir_of(&roots, std::path::Path::new(p)).map(|(_, pod)| pod);
        assert_eq!(below("/var/lib/kubelet/pods"), None);
        assert_eq!(below("/var/lib/kubelet"), None);
    }

    #[test]
    fn escapes_are_undone_and_a_lone_backslash_is_kept() {
        assert_eq!(unescape(b"a\\040b\\011c\\134d"), b"a b\tc\\d");
        assert_eq!(unescape(b"end\\04"), b"end\\04");
        assert_eq!(unescape(b"x\\999"), b"x\\999");
        assert_eq!(unescape(b"\\777"), b"\\777");
    }
}
