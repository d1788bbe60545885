//! `prober_probe_total`: how many probe runs ended how, per container and probe kind, in the
//! Prometheus text format.
//!
//! Series are kept per (pod UID, container, probe kind) across restarts of the container, as
//! upstream keeps them per worker, and are dropped when the pod is removed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::ProbeKind;

/// The `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeResult {
    Successful,
    Failed,
    Unknown,
}

impl ProbeResult {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeResult::Successful => "successful",
            ProbeResult::Failed => "failed",
            ProbeResult::Unknown => "unknown",
        }
    }
}

/// Which container a series belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SeriesKey {
    pub pod_uid: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub kind: ProbeKind,
}

/// The counters of every probe on the node.
#[derive(Debug, Default)]
pub(crate) struct ProbeCounters {
    series: BTreeMap<(SeriesKey, ProbeResult), u64>,
}

impl ProbeCounters {
    /// Counts one run.
    pub(crate) fn inc(&mut self, key: &SeriesKey, result: ProbeResult) {
        *self.series.entry((key.clone(), result)).or_insert(0) += 1;
    }

    /// Drops every series of a pod.
    pub(crate) fn remove_pod(&mut self, pod_uid: &str) {
        self.series.retain(|(key, _), _| key.pod_uid != pod_uid);
    }

    /// The current value of one series (0 when it does not exist).
    #[cfg(test)]
    pub(crate) fn get(&self, key: &SeriesKey, result: ProbeResult) -> u64 {
        self.series
            .get(&(key.clone(), result))
            .copied()
            .unwrap_or(0)
    }

    /// The Prometheus text exposition (labels in alphabetical order, as client libraries
    /// print them).
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP prober_probe_total Number of liveness, readiness and startup probe runs of a \
             container, by how they ended.\n",
        );
        out.push_str("# TYPE prober_probe_total counter\n");
        for ((key, result), value) in &self.series {
            let _ = writeln!(
                out,
                "prober_probe_total{{container=\"{}\",namespace=\"{}\",pod=\"{}\",pod_uid=\"{}\",probe_type=\"{}\",result=\"{}\"}} {}",
                escape(&key.container),
                escape(&key.namespace),
                escape(&key.pod),
                escape(&key.pod_uid),
                key.kind.as_str(),
                result.as_str(),
                value
            );
        }
        out
    }
}

/// Escapes a label value: backslash, double quote and line feed.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for ch in value.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(container: &str, kind: ProbeKind) -> SeriesKey {
        SeriesKey {
            pod_uid: "u1".into(),
            namespace: "default".into(),
            pod: "web-node".into(),
            container: container.into(),
            kind,
        }
    }

    #[test]
    fn renders_counters_in_prometheus_text() {
        let mut c = ProbeCounters::default();
        let live = key("app", ProbeKind::Liveness);
        c.inc(&live, ProbeResult::Successful);
        c.inc(&live, ProbeResult::Successful);
        c.inc(&live, ProbeResult::Failed);
        c.inc(&key("app", ProbeKind::Readiness), ProbeResult::Unknown);
        let text = c.render();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("# HELP prober_probe_total "));
        assert_eq!(lines[1], "# TYPE prober_probe_total counter");
        assert_eq!(
            &lines[2..],
            &[
                r#"prober_probe_total{container="app",namespace="default",pod="web-node",pod_uid="u1",probe_type="Liveness",result="successful"} 2"#,
                r#"prober_probe_total{container="app",namespace="default",pod="web-node",pod_uid="u1",probe_type="Liveness",result="failed"} 1"#,
                r#"prober_probe_total{container="app",namespace="default",pod="web-node",pod_uid="u1",probe_type="Readiness",result="unknown"} 1"#,
            ]
        );
        assert_eq!(c.get(&live, ProbeResult::Successful), 2);
        assert_eq!(c.get(&live, ProbeResult::Unknown), 0);
    }

    #[test]
    fn escapes_label_values_and_drops_removed_pods() {
        let mut c = ProbeCounters::default();
        let mut k = key("a\"b\\c\nd", ProbeKind::Startup);
        c.inc(&k, ProbeResult::Failed);
        assert!(
            c.render().contains(r#"container="a\"b\\c\nd""#),
            "{}",
            c.render()
        );
        k.pod_uid = "u2".into();
        c.inc(&k, ProbeResult::Failed);
        c.remove_pod("u1");
        let text = c.render();
        assert!(!text.contains("pod_uid=\"u1\""));
        assert!(text.contains("pod_uid=\"u2\""));
    }

    #[test]
    fn empty_counters_render_only_the_header() {
        let text = ProbeCounters::default().render();
        assert_eq!(text.lines().count(), 2);
    }
}
