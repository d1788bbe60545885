//! Metric families (counters, gauges, histograms with labels) and the Prometheus text format
//! (version 0.0.4) they render to. Small on purpose: the agent needs a few dozen series, no
//! registry crate's machinery.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Upstream's default histogram buckets (client_golang's `DefBuckets`), in seconds.
pub(crate) const DEFAULT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// `count` buckets starting at `start`, each `factor` times the last (client_golang's
/// `ExponentialBuckets`).
pub(crate) fn exponential_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(count);
    let mut next = start;
    for _ in 0..count {
        out.push(next);
        next *= factor;
    }
    out
}

/// What kind of family: its `# TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One histogram series: cumulative counts per upper bound, the sum and the count.
#[derive(Clone, Debug, Default, PartialEq)]
struct HistogramSeries {
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Debug, Default)]
struct Series {
    /// Counter and gauge values by label values.
    values: BTreeMap<Vec<String>, f64>,
    histograms: BTreeMap<Vec<String>, HistogramSeries>,
}

/// A named family of series sharing label names.
#[derive(Debug)]
pub(crate) struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    buckets: Vec<f64>,
    series: Mutex<Series>,
}

impl Family {
    pub(crate) fn counter(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Self::new(name, help, Kind::Counter, labels, Vec::new())
    }

    pub(crate) fn gauge(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Self::new(name, help, Kind::Gauge, labels, Vec::new())
    }

    pub(crate) fn histogram(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        buckets: Vec<f64>,
    ) -> Self {
        Self::new(name, help, Kind::Histogram, labels, buckets)
    }

    fn new(
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: &'static [&'static str],
        buckets: Vec<f64>,
    ) -> Self {
        Family {
            name,
            help,
            kind,
            labels,
            buckets,
            series: Mutex::new(Series::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Series> {
        // Plain numbers behind the lock: a panic elsewhere leaves them usable.
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key(&self, values: &[&str]) -> Vec<String> {
        // A call with the wrong number of values is a bug here, not input: pad or cut so the
        // output stays well-formed rather than panicking.
        (0..self.labels.len())
            .map(|i| values.get(i).copied().unwrap_or_default().to_string())
            .collect()
    }

    /// Adds `by` to a counter (or gauge) series.
    pub(crate) fn add(&self, values: &[&str], by: f64) {
        let key = self.key(values);
        *self.lock().values.entry(key).or_insert(0.0) += by;
    }

    /// Adds one.
    pub(crate) fn inc(&self, values: &[&str]) {
        self.add(values, 1.0);
    }

    /// Sets a gauge series.
    pub(crate) fn set(&self, values: &[&str], value: f64) {
        let key = self.key(values);
        self.lock().values.insert(key, value);
    }

    /// Records one observation in a histogram series.
    pub(crate) fn observe(&self, values: &[&str], value: f64) {
        let key = self.key(values);
        let mut series = self.lock();
        let h = series
            .histograms
            .entry(key)
            .or_insert_with(|| HistogramSeries {
                buckets: vec![0; self.buckets.len()],
                sum: 0.0,
                count: 0,
            });
        for (i, bound) in self.buckets.iter().enumerate() {
            if value <= *bound {
                h.buckets[i] += 1;
            }
        }
        h.sum += value;
        h.count += 1;
    }

    /// The value of a counter or gauge series, for tests.
    #[cfg(test)]
    pub(crate) fn value(&self, values: &[&str]) -> f64 {
        let key = self.key(values);
        self.lock().values.get(&key).copied().unwrap_or(0.0)
    }

    /// Appends the family in the text format. A family without series still says what it is.
    pub(crate) fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind.as_str());
        let series = self.lock();
        if self.kind == Kind::Histogram {
            for (values, h) in &series.histograms {
                for (bound, count) in self.buckets.iter().zip(&h.buckets) {
                    let le = format_float(*bound);
                    let labels = self.labels_text(values, Some(&le));
                    let _ = writeln!(out, "{}_bucket{labels} {count}", self.name);
                }
                let labels = self.labels_text(values, Some("+Inf"));
                let _ = writeln!(out, "{}_bucket{labels} {}", self.name, h.count);
                let labels = self.labels_text(values, None);
                let _ = writeln!(out, "{}_sum{labels} {}", self.name, format_float(h.sum));
                let _ = writeln!(out, "{}_count{labels} {}", self.name, h.count);
            }
        } else {
            for (values, v) in &series.values {
                let labels = self.labels_text(values, None);
                let _ = writeln!(out, "{}{labels} {}", self.name, format_float(*v));
            }
        }
    }

    fn labels_text(&self, values: &[String], le: Option<&str>) -> String {
        let mut pairs: Vec<String> = self
            .labels
            .iter()
            .zip(values)
            .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
            .collect();
        if let Some(le) = le {
            pairs.push(format!("le=\"{le}\""));
        }
        if pairs.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", pairs.join(","))
        }
    }
}

/// Numbers as Prometheus prints them: integers without a fraction, `+Inf`/`-Inf`/`NaN`.
pub(crate) fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Label values escape backslash, double quote and newline.
pub(crate) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_with_help_type_and_sorted_series() {
        let f = Family::counter("x_total", "Things.", &["op"]);
        f.inc(&["b"]);
        f.add(&["a"], 2.0);
        f.inc(&["b"]);
        let mut out = String::new();
        f.render(&mut out);
        assert_eq!(
            out,
            "# HELP x_total Things.\n# TYPE x_total counter\nx_total{op=\"a\"} 2\nx_total{op=\"b\"} 2\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let f = Family::histogram("d_seconds", "Durations.", &[], vec![0.1, 1.0]);
        f.observe(&[], 0.05);
        f.observe(&[], 0.5);
        f.observe(&[], 3.0);
        let mut out = String::new();
        f.render(&mut out);
        assert_eq!(
            out,
            "# HELP d_seconds Durations.\n# TYPE d_seconds histogram\n\
             d_seconds_bucket{le=\"0.1\"} 1\nd_seconds_bucket{le=\"1\"} 2\n\
             d_seconds_bucket{le=\"+Inf\"} 3\nd_seconds_sum 3.55\nd_seconds_count 3\n"
        );
    }

    #[test]
    fn label_values_are_escaped_and_wrong_arity_never_panics() {
        let f = Family::gauge("g", "G.", &["a", "b"]);
        f.set(&["x\"y\\z\nw"], 1.5);
        let mut out = String::new();
        f.render(&mut out);
        assert!(
            out.contains("g{a=\"x\\\"y\\\\z\\nw\",b=\"\"} 1.5\n"),
            "{out}"
        );
    }

    #[test]
    fn exponential_buckets_grow_by_the_factor() {
        assert_eq!(exponential_buckets(1.0, 2.0, 4), vec![1.0, 2.0, 4.0, 8.0]);
        assert_eq!(exponential_buckets(0.005, 2.5, 14).len(), 14);
    }
}
