//! The order in which the kubelet stops a pod's containers when it has native sidecars
//! (KEP-753: init containers with `restartPolicy: Always`): every main container first, then
//! the native sidecars one by one in reverse declaration order, each after the one declared
//! after it has exited. A wait that this order can never satisfy (a container waiting for one
//! the kubelet stops only after it) would hold the pod until its deadline: the agent never
//! makes such a wait, and the webhook refuses priorities that ask for one.

use exitorder_contract::annotation::NATIVE_SIDECARS;

/// Longer than any pod's list of init containers; bounds what is parsed.
const MAX_ANNOTATION_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopOrderError {
    #[error("annotation {NATIVE_SIDECARS} must be a JSON array of container names: {0}")]
    Malformed(String),
    #[error("annotation {NATIVE_SIDECARS} is larger than {MAX_ANNOTATION_BYTES} bytes")]
    TooLarge,
}

/// A pod's native sidecars in declaration order; empty for a pod without any, where the
/// kubelet stops every container at once and imposes no order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOrder {
    native: Vec<String>,
}

impl StopOrder {
    pub fn new(native: Vec<String>) -> Self {
        StopOrder { native }
    }

    /// From the webhook's annotation (what the agent has without the API server).
    pub fn from_annotation(value: &str) -> Result<Self, StopOrderError> {
        if value.len() > MAX_ANNOTATION_BYTES {
            return Err(StopOrderError::TooLarge);
        }
        serde_json::from_str::<Vec<String>>(value)
            .map(StopOrder::new)
            .map_err(|e| StopOrderError::Malformed(e.to_string()))
    }

    /// The annotation's value for this order.
    pub fn to_annotation(&self) -> String {
        serde_json::Value::from(self.native.clone()).to_string()
    }

    pub fn is_native(&self, name: &str) -> bool {
        self.position(name).is_some()
    }

    pub fn native(&self) -> &[String] {
        &self.native
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.native.iter().position(|n| n == name)
    }

    /// Whether the kubelet stops `other` only after `me` has exited, so that `me` can never
    /// see it exit first: `other` is a native sidecar, and `me` is a main container or a
    /// native sidecar declared after `other`.
    pub fn stops_after(&self, me: &str, other: &str) -> bool {
        match (self.position(me), self.position(other)) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(mine), Some(theirs)) => theirs < mine,
        }
    }

    /// Every (waiter, waited-for) pair that priorities ask for and this order forbids:
    /// `waited_for` has a lower priority than `waiter` (so `waiter` would wait for its exit)
    /// but is stopped only after `waiter`. `containers` are the pod's names and priorities.
    pub fn contradictions<'a>(&self, containers: &[(&'a str, u8)]) -> Vec<(&'a str, &'a str)> {
        let mut out = Vec::new();
        for &(waiter, mine) in containers {
            for &(other, theirs) in containers {
                if theirs < mine && self.stops_after(waiter, other) {
                    out.push((waiter, other));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row of the table taken from the kubelet's source
    /// (`kubelet-rules/stop-order.tsv`), which the test bed's kubelet is checked against too.
    #[test]
    fn every_row_of_the_upstream_table_holds() {
        for row in exitorder_kubelet_rules::STOP_ORDER.rows(5) {
            let [init, _mains, me, other, want, ..] = row.fields[..] else {
                unreachable!("rows(5)");
            };
            let native: Vec<String> = init
                .split(',')
                .filter_map(|n| n.strip_suffix('*'))
                .map(str::to_owned)
                .collect();
            let got = StopOrder::new(native).stops_after(me, other);
            assert_eq!(got, want == "yes", "row {:?}", row.line);
        }
    }

    fn order(names: &[&str]) -> StopOrder {
        StopOrder::new(names.iter().map(|n| (*n).to_owned()).collect())
    }

    #[test]
    fn mains_first_then_sidecars_in_reverse_declaration_order() {
        let o = order(&["istio-proxy", "logs"]);
        // The main container exits before every native sidecar is even sent TERM.
        assert!(o.stops_after("app", "istio-proxy"));
        assert!(o.stops_after("app", "logs"));
        // `logs`, declared last, is stopped first; istio-proxy after it.
        assert!(o.stops_after("logs", "istio-proxy"));
        assert!(!o.stops_after("istio-proxy", "logs"));
        // Nothing is stopped after a main container, nor after itself.
        assert!(!o.stops_after("istio-proxy", "app"));
        assert!(!o.stops_after("app", "other-main"));
        assert!(!o.stops_after("logs", "logs"));
        assert!(!StopOrder::default().stops_after("a", "b"));
    }

    #[test]
    fn contradictions_name_both_containers() {
        let o = order(&["istio-proxy", "logs"]);
        // Agrees: logs (stopped first) exits before istio-proxy, which waits for it.
        assert!(o
            .contradictions(&[("app", 0), ("istio-proxy", 2), ("logs", 1)])
            .is_empty());
        // Equal priorities never wait for each other.
        assert!(o
            .contradictions(&[("app", 0), ("istio-proxy", 1), ("logs", 1)])
            .is_empty());
        assert_eq!(
            o.contradictions(&[("app", 0), ("istio-proxy", 1), ("logs", 2)]),
            vec![("logs", "istio-proxy")]
        );
        // A main container of a higher priority would wait for a native sidecar.
        assert_eq!(
            o.contradictions(&[("app", 3), ("istio-proxy", 2), ("logs", 2)]),
            vec![("app", "istio-proxy"), ("app", "logs")]
        );
    }

    #[test]
    fn annotation_round_trip_and_bad_values() {
        let o = order(&["a", "b"]);
        assert_eq!(StopOrder::from_annotation(&o.to_annotation()), Ok(o));
        for bad in ["", "{}", "[1]", "\"a\"", "[\"a\""] {
            assert!(
                matches!(
                    StopOrder::from_annotation(bad),
                    Err(StopOrderError::Malformed(_))
                ),
                "{bad}"
            );
        }
        let huge = format!("[\"{}\"]", "x".repeat(MAX_ANNOTATION_BYTES));
        assert_eq!(
            StopOrder::from_annotation(&huge),
            Err(StopOrderError::TooLarge)
        );
    }
}
