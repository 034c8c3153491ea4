//! The kubelet's own node-conformance lifecycle tests, as the test bed's kubelet must pass
//! them: the pod construction and the assertions of Kubernetes'
//! `test/e2e_node/container_lifecycle_pod_construction.go` (v1.36.2), ported. Every
//! container, hook and probe runs the same shell (`ExecCommand`): it writes a line per step
//! (`Starting`, `Started`, `Delaying`, `Looping`, `Exiting`) with a millisecond timestamp to
//! its container's file under `/persistent`; the lines of every file are read back and sorted
//! by time (`parseOutput`), and the same questions are asked of them (`StartsBefore`,
//! `ExitsBefore`, `RunTogether`, `HasRestarted`...), with the same answers.
//!
//! Two differences of means, none of meaning: busybox here has no `nmeter`, which upstream
//! uses for milliseconds, so the timestamp is the kernel's clock read through busybox's
//! `adjtimex` (Unix ms); and the lines are read from `/persistent` itself (a host directory
//! the test keeps, so they outlive the pod), not through the kubelet's log API, where
//! upstream's `cat` of the same file puts them.

use std::fmt;
use std::path::Path;

use serde_json::{json, Value};

/// Upstream's `execCommand`: what one container, hook or probe does.
#[derive(Debug, Clone, Default)]
pub struct Exec {
    /// Its exit status, after `delay` or after TERM.
    pub exit_code: i32,
    /// Seconds before it says `Started` (and touches `started`).
    pub start_delay: u32,
    /// Seconds after `Started` before it exits.
    pub delay: u32,
    /// Says `Looping` every `loop_period` until killed, instead of exiting.
    pub loop_forever: bool,
    /// Seconds it takes to exit after TERM.
    pub termination_seconds: u32,
    /// The container whose file a hook or probe writes to (`None`: its own name's).
    pub container_name: Option<String>,
    /// Seconds between `Looping` lines (1 when unset).
    pub loop_period: Option<f32>,
}

/// The image every case runs (upstream's `defaultImage`, busybox).
pub const IMAGE: &str = "busybox:1.36";
/// Another image (upstream's `alternateImage`): the same busybox under another name, so
/// the container's spec, and the kubelet's hash of it, changes.
pub const ALTERNATE_IMAGE: &str = "exitorder.local/busybox:1";

/// Upstream's `ExecCommand(name, c)`: `/bin/sh -c` and the script.
pub fn exec_command(name: &str, c: &Exec) -> Value {
    let log = format!(
        "/persistent/{}.log",
        c.container_name.as_deref().unwrap_or(name)
    );
    let say = |what: &str| format!("echo $(ts) '{name} {what}' | tee -a {log} >> /proc/1/fd/1; ");
    let sleep = |s: u32| format!("exec sleep {s} & wait $!; ");
    // Upstream's `ts`, but where a clock daemon set the kernel's STA_NANO (0x2000) the
    // `tv_usec` field holds nanoseconds.
    let mut sh = String::from(
        "ts() { adjtimex | awk '/status/ {st=$2} /tv_sec/ {s=$2} /tv_usec/ {u=$2} \
         END {printf \"%d%03d\", s, u/(and(st, 8192) ? 1000000 : 1000)}'; }; ",
    );
    sh += &format!("touch {log}; ");
    if c.container_name.is_none() {
        sh += &format!("cat {log} >> /proc/1/fd/1; ");
    }
    sh += &say(&format!("Starting {}", c.start_delay));
    sh += &format!(
        "_term() {{ sleep {}; {}exit {}; }}; trap _term TERM; ",
        c.termination_seconds,
        say("Exiting"),
        c.exit_code
    );
    if c.start_delay != 0 {
        sh += &sleep(c.start_delay);
    }
    sh += &say("Started");
    sh += "touch started; ";
    sh += &say(&format!("Delaying {}", c.delay));
    if c.delay != 0 {
        sh += &sleep(c.delay);
    }
    if c.loop_forever {
        sh += &format!(
            "while true; do {}sleep {}; done; ",
            say("Looping"),
            c.loop_period.unwrap_or(1.0)
        );
    }
    sh += &say("Exiting");
    sh += &format!("exit {}", c.exit_code);
    json!(["/bin/sh", "-c", sh])
}

/// A container running [`exec_command`] with `/persistent` mounted.
pub fn container(name: &str, c: &Exec) -> Value {
    json!({"name": name, "image": IMAGE, "command": exec_command(name, c),
        "volumeMounts": [{"name": "persistent", "mountPath": "/persistent"}]})
}

/// A native sidecar (`restartPolicy: Always` init container) running [`exec_command`].
pub fn sidecar(name: &str, c: &Exec) -> Value {
    let mut v = container(name, c);
    v["restartPolicy"] = "Always".into();
    v
}

/// An exec handler (hook or probe) named `<prefix>-<container>`, writing to the container's
/// file (upstream's `prefixedName` with `ContainerName` set).
pub fn handler(prefix: &str, container: &str, c: Exec) -> Value {
    let c = Exec {
        container_name: Some(container.to_owned()),
        ..c
    };
    json!({"exec": {"command": exec_command(&format!("{prefix}-{container}"), &c)}})
}

/// An exec probe running `sh -c SCRIPT`.
pub fn probe(script: &str) -> Value {
    json!({"exec": {"command": ["sh", "-c", script]}})
}

/// 1.36.2's `startedPostStartGate`: the container counts as started only once it said so.
pub fn started_post_start_gate() -> Value {
    json!({"exec": {"command": ["sh", "-c", "until [ -f started ]; do sleep 0.1; done"]}})
}

/// A pod of these containers with `/persistent` on `logs` (upstream's `preparePod`, whose
/// memory limits the test bed does not enforce).
pub fn pod(
    name: &str,
    restart_policy: &str,
    init: Vec<Value>,
    containers: Vec<Value>,
    logs: &Path,
) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"hostNetwork": true, "restartPolicy": restart_policy,
            "initContainers": init, "containers": containers,
            "volumes": [{"name": "persistent",
                "hostPath": {"path": logs.display().to_string(), "type": "Directory"}}]}})
}

/// One line: when, who, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub at_ms: i64,
    pub name: String,
    pub command: String,
}

/// Upstream's `containerOutputList`: every line of every container, by time.
#[derive(Debug, Clone, Default)]
pub struct Output(pub Vec<Line>);

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origin = self.0.first().map_or(0, |l| l.at_ms);
        for l in &self.0 {
            writeln!(f, "{:>8} ms {} {}", l.at_ms - origin, l.name, l.command)?;
        }
        Ok(())
    }
}

impl Output {
    /// Upstream's `parseOutput`: the lines of every file in `logs`, sorted by their
    /// timestamps (ties kept in the order read).
    pub fn read(logs: &Path) -> Output {
        let mut lines = Vec::new();
        let mut files: Vec<_> = std::fs::read_dir(logs)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            lines.extend(Output::parse(&text).0);
        }
        lines.sort_by_key(|l| l.at_ms);
        Output(lines)
    }

    /// The lines of one file's text; a line that is not `<ms> <name> <command>` is skipped,
    /// as upstream skips what does not parse.
    pub fn parse(text: &str) -> Output {
        let lines = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let at_ms = f.next()?.parse().ok()?;
                Some(Line {
                    at_ms,
                    name: f.next()?.to_owned(),
                    command: f.next()?.to_owned(),
                })
            })
            .collect();
        Output(lines)
    }

    fn find(&self, name: &str, command: &str, from: usize) -> Option<usize> {
        (from..self.0.len()).find(|&i| self.0[i].name == name && self.0[i].command == command)
    }

    fn find_last(&self, name: &str, command: &str) -> Option<usize> {
        (0..self.0.len())
            .rev()
            .find(|&i| self.0[i].name == name && self.0[i].command == command)
    }

    fn fail(&self, why: String) -> String {
        format!("{why}, got\n{self}")
    }

    /// `RunTogether`: each started before the other exited, either first.
    pub fn run_together(&self, lhs: &str, rhs: &str) -> Result<(), String> {
        self.run_together_lhs_first(lhs, rhs)
            .or_else(|_| self.run_together_lhs_first(rhs, lhs))
    }

    /// `RunTogetherLhsFirst`: `lhs` started, then `rhs` started before `lhs` exited.
    pub fn run_together_lhs_first(&self, lhs: &str, rhs: &str) -> Result<(), String> {
        let lhs_start = self
            .find(lhs, "Started", 0)
            .ok_or_else(|| self.fail(format!("couldn't find that {lhs} ever started")))?;
        let rhs_start = self
            .find(rhs, "Started", lhs_start + 1)
            .ok_or_else(|| self.fail(format!("couldn't find that {rhs} ever started")))?;
        let lhs_exit = self
            .find(lhs, "Exiting", lhs_start + 1)
            .ok_or_else(|| self.fail(format!("couldn't find that {lhs} ever exited")))?;
        if rhs_start > lhs_exit {
            return Err(self.fail(format!("expected {rhs} to start before exiting {lhs}")));
        }
        let rhs_exit = self
            .find(rhs, "Exiting", rhs_start + 1)
            .ok_or_else(|| self.fail(format!("couldn't find that {rhs} ever exited")))?;
        if lhs_start > rhs_exit {
            return Err(self.fail(format!("expected {lhs} to start before exiting {rhs}")));
        }
        Ok(())
    }

    /// `StartsBefore`: `rhs` is starting after `lhs` started (also for a restart of one).
    pub fn starts_before(&self, lhs: &str, rhs: &str) -> Result<(), String> {
        let lhs_start = self
            .find(lhs, "Started", 0)
            .ok_or_else(|| self.fail(format!("couldn't find that {lhs} ever started")))?;
        self.find(rhs, "Starting", lhs_start + 1)
            .map(|_| ())
            .ok_or_else(|| self.fail(format!("couldn't find that {rhs} started after {lhs}")))
    }

    /// `ExitsBefore`: `rhs` is exiting after `lhs` exited.
    pub fn exits_before(&self, lhs: &str, rhs: &str) -> Result<(), String> {
        let lhs_exit = self
            .find(lhs, "Exiting", 0)
            .ok_or_else(|| self.fail(format!("couldn't find that {lhs} ever exited")))?;
        self.find(rhs, "Exiting", lhs_exit + 1)
            .map(|_| ())
            .ok_or_else(|| self.fail(format!("couldn't find that {rhs} exited after {lhs}")))
    }

    /// `Starts`.
    pub fn starts(&self, name: &str) -> Result<(), String> {
        self.find(name, "Started", 0)
            .map(|_| ())
            .ok_or_else(|| self.fail(format!("couldn't find that {name} ever started")))
    }

    /// `DoesntStart`.
    pub fn doesnt_start(&self, name: &str) -> Result<(), String> {
        match self.find(name, "Started", 0) {
            Some(_) => Err(self.fail(format!("found {name} started, but didn't expect to"))),
            None => Ok(()),
        }
    }

    /// `Exits`.
    pub fn exits(&self, name: &str) -> Result<(), String> {
        self.find(name, "Exiting", 0)
            .map(|_| ())
            .ok_or_else(|| self.fail(format!("couldn't find that {name} ever exited")))
    }

    /// `HasRestarted`: `Starting` at least twice.
    pub fn has_restarted(&self, name: &str) -> Result<(), String> {
        let first = self
            .find(name, "Starting", 0)
            .ok_or_else(|| self.fail(format!("couldn't find that {name} ever started")))?;
        self.find(name, "Starting", first + 1)
            .map(|_| ())
            .ok_or_else(|| self.fail(format!("couldn't find that {name} ever restarted")))
    }

    /// `HasNotRestarted`: `Starting` exactly once.
    pub fn has_not_restarted(&self, name: &str) -> Result<(), String> {
        let first = self
            .find(name, "Starting", 0)
            .ok_or_else(|| self.fail(format!("couldn't find that {name} ever started")))?;
        match self.find(name, "Starting", first + 1) {
            Some(_) => Err(self.fail(format!(
                "found that {name} restarted but wasn't expected to"
            ))),
            None => Ok(()),
        }
    }

    /// `TimeOfStart`: Unix ms of the first `Starting`.
    pub fn time_of_start(&self, name: &str) -> Result<i64, String> {
        self.find(name, "Starting", 0)
            .map(|i| self.0[i].at_ms)
            .ok_or_else(|| self.fail(format!("couldn't find that {name} ever started")))
    }

    /// `TimeOfLastLoop`: Unix ms of the last `Looping`.
    pub fn time_of_last_loop(&self, name: &str) -> Result<i64, String> {
        self.find_last(name, "Looping")
            .map(|i| self.0[i].at_ms)
            .ok_or_else(|| self.fail(format!("couldn't find that {name} ever looped")))
    }
}

/// Gomega's `BeNumerically("~", want, within)`.
pub fn about(what: &str, got: i64, want: i64, within: i64) -> Result<(), String> {
    if (got - want).abs() <= within {
        Ok(())
    } else {
        Err(format!(
            "{what}: expected {got} to be within {within} of {want}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(lines: &[(i64, &str, &str)]) -> Output {
        Output(
            lines
                .iter()
                .map(|(at, n, c)| Line {
                    at_ms: *at,
                    name: (*n).into(),
                    command: (*c).into(),
                })
                .collect(),
        )
    }

    /// The questions answer as upstream's do, each able to fail.
    #[test]
    fn the_assertions_answer_as_upstream() {
        let o = out(&[
            (1, "a", "Starting"),
            (2, "a", "Started"),
            (3, "b", "Starting"),
            (4, "b", "Started"),
            (5, "a", "Exiting"),
            (6, "b", "Exiting"),
            (7, "b", "Starting"),
        ]);
        assert!(o.starts_before("a", "b").is_ok());
        assert!(o.starts_before("b", "a").is_err());
        assert!(o.exits_before("a", "b").is_ok());
        assert!(o.exits_before("b", "a").is_err());
        assert!(o.run_together("a", "b").is_ok());
        assert!(o.run_together_lhs_first("b", "a").is_err());
        assert!(o.has_restarted("b").is_ok());
        assert!(o.has_restarted("a").is_err());
        assert!(o.has_not_restarted("a").is_ok());
        assert!(o.has_not_restarted("b").is_err());
        assert!(o.doesnt_start("c").is_ok());
        assert!(o.starts("c").is_err());
        assert_eq!(o.time_of_start("b"), Ok(3));
        // One after the other is not together.
        let apart = out(&[
            (1, "a", "Started"),
            (2, "a", "Exiting"),
            (3, "b", "Started"),
            (4, "b", "Exiting"),
        ]);
        assert!(apart.run_together("a", "b").is_err());
        assert!(about("x", 32_900, 32_000, 1_500).is_ok());
        assert!(about("x", 30_400, 32_000, 1_500).is_err());
    }

    #[test]
    fn lines_that_do_not_parse_are_skipped_and_the_rest_sorted() {
        let o = Output::parse("12 a Starting 0\nnoise\n\n10 b Started\nx y z\n");
        assert_eq!(o.0.len(), 2);
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.log"), "12 a Starting 0\n").expect("write");
        std::fs::write(dir.path().join("b.log"), "10 b Started\n").expect("write");
        std::fs::write(dir.path().join("other"), "1 c Started\n").expect("write");
        let o = Output::read(dir.path());
        let names: Vec<&str> = o.0.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
    }

    /// The script says each step with a timestamp, traps TERM and exits with its code.
    #[test]
    fn the_script_is_upstreams() {
        let c = Exec {
            exit_code: 3,
            delay: 5,
            termination_seconds: 2,
            loop_forever: true,
            loop_period: Some(0.2),
            container_name: Some("ri-1".into()),
            ..Exec::default()
        };
        let v = exec_command("PreStop-ri-1", &c);
        let sh = v[2].as_str().expect("a script");
        for needle in [
            "/persistent/ri-1.log",
            "'PreStop-ri-1 Starting 0'",
            "_term() { sleep 2; ",
            "trap _term TERM",
            "exec sleep 5 & wait $!",
            "sleep 0.2; done",
            "exit 3",
        ] {
            assert!(sh.contains(needle), "{needle:?} in {sh}");
        }
        // A hook writes to its container's file and does not copy it to the output.
        assert!(!sh.contains("cat /persistent"), "{sh}");
    }
}
