//! `--busy`: the node as nodes really are while the benchmark measures: a writer that syncs
//! 256 MiB to the node's disk in a loop (`dd … conv=fdatasync`, as an image pull or a chatty
//! pod's logs load the journal) and one CPU hog per core. Both bounded: the writer's one file
//! of 256 MiB, removed at the end, and every process, in a process group of its own, killed
//! when the load is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use std::os::unix::process::CommandExt;

/// What the writer writes and syncs, each round.
pub const WRITE_MIB: u64 = 256;

/// The load, running until dropped.
pub struct Busy {
    children: Vec<Child>,
    file: PathBuf,
    pub hogs: usize,
}

impl Busy {
    /// Starts the writer on `dir`'s disk and one hog per core.
    pub fn start(dir: &Path) -> anyhow::Result<Busy> {
        let file = dir.join("busy-writer.dat");
        let hogs = std::thread::available_parallelism().map_or(2, usize::from);
        let mut busy = Busy {
            children: Vec::new(),
            file,
            hogs,
        };
        let writer = format!(
            "while :; do dd if=/dev/zero of='{}' bs=1M count={WRITE_MIB} conv=fdatasync 2>/dev/null; done",
            busy.file.display()
        );
        busy.spawn(&writer).context("starting the disk writer")?;
        for _ in 0..hogs {
            busy.spawn("while :; do :; done")
                .context("starting a CPU hog")?;
        }
        Ok(busy)
    }

    fn spawn(&mut self, script: &str) -> std::io::Result<()> {
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        self.children.push(child);
        Ok(())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.children {
            // The whole group: the writer's `dd` as well as its shell.
            let group = i32::try_from(child.id())
                .ok()
                .and_then(rustix::process::Pid::from_raw);
            if let Some(group) = group {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_runs_until_dropped_and_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("eo-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut busy = Busy::start(&dir).expect("busy");
        assert_eq!(busy.children.len(), busy.hogs + 1);
        let pids: Vec<u32> = busy.children.iter().map(Child::id).collect();
        for c in &mut busy.children {
            assert!(c.try_wait().expect("try_wait").is_none(), "exited early");
        }
        drop(busy);
        for pid in pids {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "process {pid} outlived the load"
            );
        }
        assert!(!dir.join("busy-writer.dat").exists());
        let _ = std::fs::remove_dir(&dir);
    }
}
