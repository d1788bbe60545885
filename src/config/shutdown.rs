//! Graceful node shutdown settings: `shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`
//! and `shutdownGracePeriodByPodPriority`, file-only fields as upstream (it has no flags for
//! them), checked with upstream's rules.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::duration::{format_go_duration, parse_go_duration};
use super::file::KubeletConfigurationFile;
use crate::base::podspec::pod::{DEFAULT_PRIORITY, SYSTEM_CRITICAL_PRIORITY};

/// One entry of `shutdownGracePeriodByPodPriority` as the file has it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownGracePeriodByPodPriorityFile {
    pub priority: Option<i32>,
    pub shutdown_grace_period_seconds: Option<i64>,
}

/// The merged settings; all zero/empty (upstream's default) turns graceful shutdown off.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShutdownSettings {
    pub grace_period: Duration,
    pub grace_period_critical_pods: Duration,
    pub by_pod_priority: Vec<PriorityGrace>,
}

impl ShutdownSettings {
    /// The priority buckets these settings mean, lowest first (empty: off).
    pub fn buckets(&self) -> Vec<PriorityGrace> {
        buckets(
            self.grace_period,
            self.grace_period_critical_pods,
            &self.by_pod_priority,
        )
    }
}

/// One bucket of `shutdownGracePeriodByPodPriority`: pods of this priority and above (up to
/// the next bucket) get `grace_seconds` to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityGrace {
    pub priority: i32,
    pub grace_seconds: i64,
}

/// The buckets that the configuration means, lowest priority first; empty when graceful
/// shutdown is off. `by_priority` wins when given (validation refuses both at once).
pub(crate) fn buckets(
    grace_period: Duration,
    critical_pods: Duration,
    by_priority: &[PriorityGrace],
) -> Vec<PriorityGrace> {
    let mut out = if by_priority.is_empty() {
        from_plain_fields(grace_period, critical_pods)
    } else {
        by_priority.to_vec()
    };
    out.sort_by_key(|b| b.priority);
    out
}

/// The two buckets of the plain fields: regular pods get `grace_period - critical_pods`,
/// critical pods `critical_pods`. A zero grace period, or a critical part longer than the
/// whole, means no graceful shutdown (as upstream).
fn from_plain_fields(grace_period: Duration, critical_pods: Duration) -> Vec<PriorityGrace> {
    if grace_period.is_zero() || critical_pods > grace_period {
        return Vec::new();
    }
    let regular = grace_period - critical_pods;
    vec![
        PriorityGrace {
            priority: DEFAULT_PRIORITY,
            grace_seconds: whole_seconds(regular),
        },
        PriorityGrace {
            priority: SYSTEM_CRITICAL_PRIORITY,
            grace_seconds: whole_seconds(critical_pods),
        },
    ]
}

fn whole_seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

fn duration(text: Option<&str>, field: &str) -> Result<Duration, ConfigError> {
    let d = text
        .map(|t| {
            parse_go_duration(t)
                .map_err(|e| ConfigError::invalid(field, format!("invalid duration {t:?}: {e}")))
        })
        .transpose()?
        .unwrap_or_default();
    if !d.is_zero() && d < Duration::from_secs(1) {
        return Err(ConfigError::invalid(
            field,
            format!("{} must be 0 or at least 1s", format_go_duration(d)),
        ));
    }
    Ok(d)
}

/// Reads and checks the three fields.
pub(super) fn shutdown_settings(
    f: &KubeletConfigurationFile,
) -> Result<ShutdownSettings, ConfigError> {
    let grace = duration(f.shutdown_grace_period.as_deref(), "shutdownGracePeriod")?;
    let critical = duration(
        f.shutdown_grace_period_critical_pods.as_deref(),
        "shutdownGracePeriodCriticalPods",
    )?;
    if critical > grace {
        return Err(ConfigError::invalid(
            "shutdownGracePeriodCriticalPods",
            format!(
                "{} must not exceed shutdownGracePeriod ({})",
                format_go_duration(critical),
                format_go_duration(grace)
            ),
        ));
    }
    let field = "shutdownGracePeriodByPodPriority";
    let mut by_pod_priority = Vec::new();
    for (i, entry) in f
        .shutdown_grace_period_by_pod_priority
        .iter()
        .flatten()
        .enumerate()
    {
        let seconds = entry.shutdown_grace_period_seconds.unwrap_or(0);
        if seconds < 0 {
            return Err(ConfigError::invalid(
                format!("{field}[{i}].shutdownGracePeriodSeconds"),
                format!("{seconds} must not be negative"),
            ));
        }
        by_pod_priority.push(PriorityGrace {
            priority: entry.priority.unwrap_or(0),
            grace_seconds: seconds,
        });
    }
    if !by_pod_priority.is_empty() && (!grace.is_zero() || !critical.is_zero()) {
        return Err(ConfigError::invalid(
            field,
            "cannot be given together with shutdownGracePeriod or shutdownGracePeriodCriticalPods",
        ));
    }
    Ok(ShutdownSettings {
        grace_period: grace,
        grace_period_critical_pods: critical,
        by_pod_priority,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::SectionError;

    fn load(yaml: &str) -> Result<ShutdownSettings, SectionError> {
        let f: KubeletConfigurationFile = crate::base::yaml::from_str(yaml)?;
        Ok(shutdown_settings(&f)?)
    }

    #[test]
    fn the_fields_are_read_and_checked() {
        let s = Duration::from_secs;
        let cases: &[(&str, Result<ShutdownSettings, &str>)] = &[
            ("{}", Ok(ShutdownSettings::default())),
            (
                "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s",
                Ok(ShutdownSettings {
                    grace_period: s(30),
                    grace_period_critical_pods: s(10),
                    by_pod_priority: vec![],
                }),
            ),
            (
                "shutdownGracePeriodByPodPriority:\n- {priority: 100000, shutdownGracePeriodSeconds: 20}\n- {priority: 0, shutdownGracePeriodSeconds: 5}",
                Ok(ShutdownSettings {
                    grace_period: s(0),
                    grace_period_critical_pods: s(0),
                    by_pod_priority: vec![
                        PriorityGrace {
                            priority: 100000,
                            grace_seconds: 20,
                        },
                        PriorityGrace {
                            priority: 0,
                            grace_seconds: 5,
                        },
                    ],
                }),
            ),
            (
                "shutdownGracePeriod: 500ms",
                Err("must be 0 or at least 1s"),
            ),
            (
                "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s",
                Err("must not exceed shutdownGracePeriod"),
            ),
            (
                "shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority: [{priority: 1, shutdownGracePeriodSeconds: 2}]",
                Err("cannot be given together"),
            ),
            (
                "shutdownGracePeriodByPodPriority: [{priority: 1, shutdownGracePeriodSeconds: -2}]",
                Err("must not be negative"),
            ),
        ];
        for (yaml, want) in cases {
            let got = load(yaml);
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(g, w, "{yaml}"),
                (Err(w), Err(g)) => assert!(g.to_string().contains(w), "{yaml}: {g}"),
                _ => panic!("{yaml}: got {got:?}, want {want:?}"),
            }
        }
    }
}
