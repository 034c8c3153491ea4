//! Percentiles of latency samples.

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
