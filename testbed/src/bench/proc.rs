//! Memory and CPU of a process, read from /proc.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: no {field} value in it")]
    Missing {
        file: &'static str,
        field: &'static str,
    },
    #[error("{file}: {field} is {value:?}, not a number")]
    NotANumber {
        file: &'static str,
        field: &'static str,
        value: String,
    },
}

/// Resident memory from /proc/<pid>/status, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// VmRSS: resident now.
    pub rss_kib: u64,
    /// VmHWM: the most ever resident since the process started.
    pub peak_kib: u64,
}

/// One reading of a process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub memory: Memory,
    /// utime + stime of every thread so far.
    pub cpu_seconds: f64,
    /// Time its live threads spent runnable but waiting for a CPU (schedstat's run_delay).
    pub cpu_wait_seconds: f64,
}

impl Sample {
    /// Reads `pid` now.
    pub fn take(pid: u32) -> Result<Sample, ProcError> {
        let status = read(pid, "status")?;
        let stat = read(pid, "stat")?;
        let ticks = cpu_ticks(&stat)?;
        // The kernel counts utime/stime in USER_HZ ticks, whatever the kernel's own HZ.
        let hz = rustix::param::clock_ticks_per_second().max(1);
        Ok(Sample {
            memory: memory(&status)?,
            cpu_seconds: ticks as f64 / hz as f64,
            cpu_wait_seconds: run_delay_ns(pid)? as f64 / 1e9,
        })
    }
}

/// The run-queue wait of every live thread of `pid`, in ns: the second field of each
/// /proc/<pid>/task/<tid>/schedstat. A thread that ended takes its share with it, so this is a
/// lower bound.
fn run_delay_ns(pid: u32) -> Result<u64, ProcError> {
    let dir = PathBuf::from(format!("/proc/{pid}/task"));
    let tasks = std::fs::read_dir(&dir).map_err(|source| ProcError::Read { path: dir, source })?;
    let mut total = 0;
    for task in tasks.flatten() {
        // A thread that ends between the listing and the read is skipped.
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            total += run_delay(&text)?;
        }
    }
    Ok(total)
}

/// The run-queue wait (ns) from the text of a schedstat file: `<on cpu> <run delay> <slices>`.
pub fn run_delay(schedstat: &str) -> Result<u64, ProcError> {
    let v = schedstat
        .split_whitespace()
        .nth(1)
        .ok_or(ProcError::Missing {
            file: "schedstat",
            field: "run_delay",
        })?;
    v.parse().map_err(|_| ProcError::NotANumber {
        file: "schedstat",
        field: "run_delay",
        value: v.to_owned(),
    })
}

fn read(pid: u32, file: &str) -> Result<String, ProcError> {
    let path = PathBuf::from(format!("/proc/{pid}/{file}"));
    std::fs::read_to_string(&path).map_err(|source| ProcError::Read { path, source })
}

/// VmRSS and VmHWM from the text of /proc/<pid>/status (lines such as `VmRSS:   1234 kB`).
pub fn memory(status: &str) -> Result<Memory, ProcError> {
    let field = |name: &'static str| -> Result<u64, ProcError> {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .ok_or(ProcError::Missing {
                file: "status",
                field: name,
            })?;
        let value = line.trim().trim_end_matches("kB").trim();
        value.parse().map_err(|_| ProcError::NotANumber {
            file: "status",
            field: name,
            value: value.to_owned(),
        })
    };
    Ok(Memory {
        rss_kib: field("VmRSS")?,
        peak_kib: field("VmHWM")?,
    })
}

/// utime + stime (fields 14 and 15) from the text of /proc/<pid>/stat, in clock ticks.
pub fn cpu_ticks(stat: &str) -> Result<u64, ProcError> {
    // Field 2 is the command name in parentheses, which may itself hold spaces and ')':
    // fields are counted from after its last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or(ProcError::Missing {
            file: "stat",
            field: "comm",
        })?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state).
    let get = |field: &'static str, n: usize| -> Result<u64, ProcError> {
        let v = fields.get(n - 3).ok_or(ProcError::Missing {
            file: "stat",
            field,
        })?;
        v.parse().map_err(|_| ProcError::NotANumber {
            file: "stat",
            field,
            value: (*v).to_owned(),
        })
    };
    Ok(get("utime", 14)? + get("stime", 15)?)
}

/// KiB as MiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\texitorder\nUmask:\t0022\nState:\tS (sleeping)\n\
        VmPeak:\t  812345 kB\nVmHWM:\t   14336 kB\nVmRSS:\t   12288 kB\nThreads:\t4\n";

    #[test]
    fn run_delay_from_schedstat() {
        assert_eq!(run_delay("764988 80389 2\n").unwrap(), 80389);
        assert!(matches!(
            run_delay("1"),
            Err(ProcError::Missing {
                field: "run_delay",
                ..
            })
        ));
        assert!(matches!(
            run_delay("1 x 2"),
            Err(ProcError::NotANumber { .. })
        ));
    }

    #[test]
    fn memory_from_status() {
        assert_eq!(
            memory(STATUS).unwrap(),
            Memory {
                rss_kib: 12288,
                peak_kib: 14336
            }
        );
        assert!(matches!(
            memory("Name:\tx\nVmRSS:\t12 kB\n"),
            Err(ProcError::Missing { field: "VmHWM", .. })
        ));
        assert!(matches!(
            memory("VmRSS:\tlots kB\nVmHWM:\t1 kB\n"),
            Err(ProcError::NotANumber { field: "VmRSS", .. })
        ));
        // A kernel thread has no VmRSS line at all.
        assert!(memory("Name:\tkthreadd\n").is_err());
    }

    #[test]
    fn cpu_from_stat_with_a_hostile_name() {
        let stat = "4242 (a) b) c) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    150 37 0 0 20 0 4 0 12345 812345678 3072 18446744073709551615";
        assert_eq!(cpu_ticks(stat).unwrap(), 187);
        assert!(cpu_ticks("4242 (exitorder) S 1 2").is_err());
        assert!(cpu_ticks("no parenthesis").is_err());
        assert!(matches!(
            cpu_ticks("1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 3"),
            Err(ProcError::NotANumber { field: "utime", .. })
        ));
    }

    #[test]
    fn this_process_can_be_read() {
        let s = Sample::take(std::process::id()).unwrap();
        assert!(s.memory.rss_kib > 0 && s.memory.peak_kib >= s.memory.rss_kib);
        assert!(s.cpu_seconds >= 0.0);
        assert!((mib(1536) - 1.5).abs() < 1e-9);
    }
}
