//! The kubelet's rules as tables, each row read from the kubelet's source with the upstream
//! file, function and versions it holds for in the table's header. The agent and the test
//! bed's kubelet each implement the rules their own way and each is tested against every row
//! here, so a wrong rule fails a test instead of agreeing with itself. Data only: no rule is
//! implemented in this crate.
//!
//! Parts: `restart.tsv` (whether a container starts again after an exit), `stop-order.tsv`
//! (which container the kubelet stops only after another), `grace.tsv` (the grace each kind
//! of pod kill gets, per kubelet version).

/// `restart.tsv`: pod policy, container policy, rules, exit code, `done|restart|restart-all`.
pub const RESTART: Table = Table {
    name: "restart.tsv",
    text: include_str!("../restart.tsv"),
    min_rows: 20,
};

/// `stop-order.tsv`: init containers (`*` a native sidecar), main containers, ME, OTHER,
/// whether OTHER is stopped only after ME.
pub const STOP_ORDER: Table = Table {
    name: "stop-order.tsv",
    text: include_str!("../stop-order.tsv"),
    min_rows: 10,
};

/// `grace.tsv`: kill, kubelet version, pod grace, the kill's value, the grace, how the agent
/// takes it.
pub const GRACE: Table = Table {
    name: "grace.tsv",
    text: include_str!("../grace.tsv"),
    min_rows: 15,
};

/// One table: tab-separated rows; `#` lines and blank lines are its notes.
pub struct Table {
    name: &'static str,
    text: &'static str,
    min_rows: usize,
}

/// A row: its line (for a failing test to name) and its fields.
pub struct Row {
    pub line: &'static str,
    pub fields: Vec<&'static str>,
}

impl Table {
    /// Every row, each with at least `width` fields. Panics (these are tests' tables) on a
    /// narrower row, or when the table has fewer rows than it was written with.
    pub fn rows(&self, width: usize) -> Vec<Row> {
        let rows: Vec<Row> = self
            .text
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|line| Row {
                line,
                fields: line.split('\t').collect(),
            })
            .collect();
        for r in &rows {
            assert!(
                r.fields.len() >= width,
                "{}: a row of at least {width} fields: {:?}",
                self.name,
                r.line
            );
        }
        assert!(
            rows.len() >= self.min_rows,
            "{} has {} rows, fewer than the {} it was written with",
            self.name,
            rows.len(),
            self.min_rows
        );
        rows
    }
}

impl Row {
    /// Field `i` as a kubelet version, `1.31` as `(1, 31)`.
    pub fn version(&self, i: usize) -> (u32, u32) {
        self.fields[i]
            .split_once('.')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .unwrap_or_else(|| panic!("a version in field {i} of {:?}", self.line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_reads() {
        assert!(RESTART
            .rows(5)
            .iter()
            .all(|r| r.fields[3].parse::<i32>().is_ok()));
        assert_eq!(STOP_ORDER.rows(5).len(), STOP_ORDER.rows(0).len());
        for r in GRACE.rows(6) {
            assert!(r.version(1) >= (1, 28), "{:?}", r.line);
        }
    }
}
