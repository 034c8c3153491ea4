//! Percentiles of latency samples, and the report's rounding of them.

/// Nearest-rank percentiles of a set of millisecond samples. Nearest rank, not interpolation:
/// every figure reported is a delay that was actually measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The `p`-th percentile (0 < p <= 100) of samples sorted ascending, by nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// p50, p99 and max of `samples` (any order; NaNs are dropped); `None` without samples.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    Some(Summary {
        samples: sorted.len(),
        p50_ms: percentile(&sorted, 50.0)?,
        p99_ms: percentile(&sorted, 99.0)?,
        max_ms: *sorted.last()?,
    })
}

/// Milliseconds (or any figure) to three decimals: microseconds, as precise as measured.
pub fn round3(v: f64) -> f64 {
    (v * 1e3).round() / 1e3
}

/// p50, p99 and max of a set of delays, rounded for the report; `None` without samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

pub fn figures(delays_ms: &[f64]) -> Figures {
    let s = summarize(delays_ms);
    Figures {
        p50: s.map(|s| round3(s.p50_ms)),
        p99: s.map(|s| round3(s.p99_ms)),
        max: s.map(|s| round3(s.max_ms)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(100.0));
        assert_eq!(percentile(&v, 99.0), Some(198.0));
        assert_eq!(percentile(&v, 100.0), Some(200.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&v, 0.0), None);
        assert_eq!(percentile(&v, 101.0), None);
    }

    #[test]
    fn summary_sorts_and_skips_nan() {
        let s = summarize(&[3.0, f64::NAN, 1.0, 2.0]).unwrap();
        assert_eq!(
            s,
            Summary {
                samples: 3,
                p50_ms: 2.0,
                p99_ms: 3.0,
                max_ms: 3.0
            }
        );
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[f64::NAN]).is_none());
    }
}
