//! `--busy`: the node as nodes really are while the benchmark measures: a writer that syncs
//! 256 MiB to the node's disk in a loop (as `dd … conv=fdatasync` does; an image pull or a
//! chatty pod's logs load the journal so) and one CPU hog per core. Threads of the benchmark's
//! own process, outside the pods' cgroups as system daemons are: they end with it whatever
//! ends it, and the writer's one file is removed when the load is dropped.

use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context;

/// What the writer writes and syncs each round.
pub const WRITE_MIB: usize = 256;
const MIB: usize = 1 << 20;

/// A busy loop per core, until dropped: a node whose CPUs its workloads keep busy.
pub struct CpuHogs {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl CpuHogs {
    /// One hog per core.
    pub fn start() -> CpuHogs {
        CpuHogs::with(std::thread::available_parallelism().map_or(1, usize::from))
    }

    /// `n` hogs.
    pub fn with(n: usize) -> CpuHogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        CpuHogs { stop, threads }
    }

    pub fn count(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Writes `mib` MiB to one file and syncs its data, over and over, until dropped.
pub struct DiskWriter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    file: PathBuf,
}

impl DiskWriter {
    pub fn start(dir: &Path, mib: usize) -> anyhow::Result<DiskWriter> {
        let path = dir.join("busy-writer.dat");
        let mut file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let theirs = stop.clone();
        let thread = std::thread::spawn(move || {
            let chunk = vec![0u8; MIB];
            while !theirs.load(Ordering::Relaxed) {
                // A failed write (a full disk) ends the load, not the benchmark.
                let round = (|| -> std::io::Result<()> {
                    file.rewind()?;
                    for _ in 0..mib {
                        if theirs.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        file.write_all(&chunk)?;
                    }
                    file.sync_data()
                })();
                if round.is_err() {
                    return;
                }
            }
        });
        Ok(DiskWriter {
            stop,
            thread: Some(thread),
            file: path,
        })
    }
}

impl Drop for DiskWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

/// The load, running until dropped.
pub struct Busy {
    _writer: DiskWriter,
    hogs: CpuHogs,
}

impl Busy {
    /// Starts the writer on `dir`'s disk and one hog per core.
    pub fn start(dir: &Path) -> anyhow::Result<Busy> {
        Ok(Busy {
            _writer: DiskWriter::start(dir, WRITE_MIB).context("starting the disk writer")?,
            hogs: CpuHogs::start(),
        })
    }

    pub fn hogs(&self) -> usize {
        self.hogs.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_runs_until_dropped_and_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("eo-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        // Small, so the test does not load the machine the other tests run on.
        let writer = DiskWriter::start(&dir, 1).expect("writer");
        let hogs = CpuHogs::with(1);
        let file = dir.join("busy-writer.dat");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::fs::metadata(&file).map_or(0, |m| m.len()) < MIB as u64 {
            assert!(std::time::Instant::now() < deadline, "nothing written");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(hogs.count(), 1);
        drop(hogs);
        drop(writer);
        assert!(!file.exists());
        let _ = std::fs::remove_dir(&dir);
    }
}
