//! The one encoder of both servers' `/metrics`: prometheus-client writes the OpenMetrics text
//! (names, HELP and TYPE lines, label escaping, counters' `_total`, histograms' buckets, the
//! `# EOF`). What is counted stays in plain atomics ([`crate::stats`], the webhook's
//! counters): the decision loop never takes a lock a scrape could hold, which the crate's own
//! `Family` and `Histogram` would. Each scrape reads them through a [`Collector`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::stats::ConnStats;
use crate::stats::{Histogram, LATENCY_BUCKETS};

/// The `Content-Type` of what [`render`] returns. Prometheus asks for it first and reads the
/// histograms' and counters' metadata from it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A server's counters as a scrape reads them. Each server implements [`Collector`] for
/// its own, beside them.
pub struct Read<T>(pub Arc<T>);

impl<T> std::fmt::Debug for Read<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Read<{}>", std::any::type_name::<T>())
    }
}

/// Every family `counters`' collector writes, in the OpenMetrics text format.
pub fn render<T: Send + Sync + 'static>(counters: &Arc<T>) -> String
where
    Read<T>: Collector,
{
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Read(Arc::clone(counters))));
    let mut out = String::with_capacity(8192);
    // Writing to a String cannot fail, and no family here returns an error of its own: an
    // error would leave a partial text, which a scraper rejects as a whole.
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

/// Writes metric families one after the other: `name` is the family's (a counter's samples
/// get `_total`), `help` its description.
pub struct Families<'a>(pub DescriptorEncoder<'a>);

type Written = Result<(), std::fmt::Error>;

impl Families<'_> {
    pub fn counter(&mut self, name: &str, help: &str, n: u64) -> Written {
        self.one(name, help, MetricType::Counter, n)
    }

    pub fn gauge(&mut self, name: &str, help: &str, n: u64) -> Written {
        self.one(name, help, MetricType::Gauge, n)
    }

    /// A server's connections: `name` open now (a gauge) and `name_evicted` (a counter).
    pub fn connections(&mut self, name: &str, open_help: &str, conns: &ConnStats) -> Written {
        self.gauge(name, open_help, conns.open.load(Ordering::Relaxed))?;
        self.counter(
            &format!("{name}_evicted"),
            "Connections closed to make room for a new one, from the peer holding the most.",
            conns.evicted.load(Ordering::Relaxed),
        )
    }

    fn one(&mut self, name: &str, help: &str, kind: MetricType, n: u64) -> Written {
        sample(kind, n, self.0.encode_descriptor(name, help, None, kind)?)
    }

    /// A counter or gauge family with one label: a sample per `(value, n)`, in the order
    /// given.
    pub fn labelled<'v>(
        &mut self,
        kind: MetricType,
        name: &str,
        help: &str,
        label: &str,
        samples: impl IntoIterator<Item = (&'v str, u64)>,
    ) -> Written {
        let mut family = self.0.encode_descriptor(name, help, None, kind)?;
        for (value, n) in samples {
            sample(kind, n, family.encode_family(&[(label, value)])?)?;
        }
        Ok(())
    }

    /// A histogram family of [`LATENCY_BUCKETS`]: one unlabelled histogram (`label` `None`),
    /// or one per `(value, histogram)`.
    pub fn histograms<'v, 'h>(
        &mut self,
        name: &str,
        help: &str,
        label: Option<&str>,
        samples: impl IntoIterator<Item = (&'v str, &'h Histogram)>,
    ) -> Written {
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Histogram)?;
        for (value, h) in samples {
            let (sum, count, buckets) = per_bucket(h);
            match label {
                Some(label) => family
                    .encode_family(&[(label, value)])?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    sum, count, &buckets, None,
                )?,
                None => family.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    sum, count, &buckets, None,
                )?,
            }
        }
        Ok(())
    }
}

/// One counter or gauge sample.
fn sample(kind: MetricType, n: u64, to: MetricEncoder) -> Written {
    match kind {
        MetricType::Counter => ConstCounter::new(n).encode(to),
        _ => ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(to),
    }
}

/// A histogram's sum, count and per-bucket counts with `+Inf` last, as the encoder takes them.
/// The atomics are read one by one while the loop may observe: a bucket can be read ahead of
/// the count, so `+Inf`'s share saturates rather than wraps.
fn per_bucket(h: &Histogram) -> (f64, u64, Vec<(f64, u64)>) {
    let (buckets, count, sum) = h.read();
    let within: u64 = buckets.iter().sum();
    let mut out: Vec<(f64, u64)> = LATENCY_BUCKETS.iter().copied().zip(buckets).collect();
    out.push((f64::INFINITY, count.saturating_sub(within)));
    (sum, count, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    impl Collector for Read<Histogram> {
        fn encode(&self, enc: DescriptorEncoder) -> Written {
            let mut f = Families(enc);
            f.histograms(
                "x_seconds",
                "With a label.",
                Some("reason"),
                [("ordered", &*self.0)],
            )?;
            f.histograms("y_seconds", "Without.", None, [("", &*self.0)])?;
            f.labelled(
                MetricType::Counter,
                "z",
                "Labelled counters.",
                "kind",
                [("a", 2), ("b", 0)],
            )?;
            f.gauge("g", "A gauge.", 7)
        }
    }

    #[test]
    fn histograms_counters_and_gauges_in_openmetrics_text() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(120));
        let out = render(&Arc::new(h));
        let lines: Vec<&str> = out.lines().collect();
        for want in [
            "# TYPE x_seconds histogram",
            "x_seconds_sum{reason=\"ordered\"} 120.003",
            "x_seconds_count{reason=\"ordered\"} 2",
            "x_seconds_bucket{le=\"0.001\",reason=\"ordered\"} 0",
            "x_seconds_bucket{le=\"0.005\",reason=\"ordered\"} 1",
            "x_seconds_bucket{le=\"60.0\",reason=\"ordered\"} 1",
            "x_seconds_bucket{le=\"+Inf\",reason=\"ordered\"} 2",
            "y_seconds_bucket{le=\"0.005\"} 1",
            "y_seconds_bucket{le=\"+Inf\"} 2",
            "y_seconds_count 2",
            "# TYPE z counter",
            "z_total{kind=\"a\"} 2",
            "z_total{kind=\"b\"} 0",
            "# TYPE g gauge",
            "g 7",
        ] {
            assert!(lines.contains(&want), "no {want} in:\n{out}");
        }
        // Buckets are cumulative, one per bound and +Inf.
        let buckets = lines
            .iter()
            .filter(|l| l.starts_with("y_seconds_bucket"))
            .count();
        assert_eq!(buckets, LATENCY_BUCKETS.len() + 1);
        assert_eq!(lines.last(), Some(&"# EOF"));
    }
}
