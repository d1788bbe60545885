//! The eviction manager's settings besides `evictionHard` (which lives with the reservations,
//! because node allocatable subtracts it): `evictionSoft` and its grace periods,
//! `evictionMinimumReclaim`, `evictionPressureTransitionPeriod`,
//! `evictionMaxPodGracePeriod` and `kernelMemcgNotification`, with upstream's flags, defaults
//! and validation.
//!
//! Kept apart from the general merge in `validate` because the fields tie together: every
//! soft threshold needs a grace period, and every map is keyed by an eviction signal.

use std::collections::BTreeMap;
use std::time::Duration;

use super::ConfigError;
use super::duration::parse_go_duration;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use crate::base::podspec::threshold::{self, Threshold};

/// Upstream's `evictionPressureTransitionPeriod`.
pub(crate) const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);

/// The merged eviction settings (the hard thresholds are `Reservations::eviction_hard`).
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionSettings {
    /// `evictionSoft`: signal → threshold; each one has a grace period below.
    pub soft: BTreeMap<String, Threshold>,
    /// `evictionSoftGracePeriod`: how long a soft threshold must hold before a pod goes.
    pub soft_grace_period: BTreeMap<String, Duration>,
    /// `evictionMinimumReclaim`: once a threshold is met, pressure lasts until this much more
    /// than the threshold is available again (so the node does not hover at the edge).
    pub minimum_reclaim: BTreeMap<String, Threshold>,
    /// `evictionPressureTransitionPeriod`: a pressure condition stays true this long after
    /// its threshold was last met, so it does not flap.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod`: the most a pod evicted for a soft threshold is given to
    /// stop, in seconds; negative = the pod's own grace period.
    pub max_pod_grace_period_seconds: i64,
    /// `kernelMemcgNotification`: also run a round when the kernel says memory usage crossed
    /// a `memory.available` threshold (cgroup v1), instead of only every monitoring period.
    pub kernel_memcg_notification: bool,
    /// `localStorageCapacityIsolation` (true): evict a pod over its own ephemeral-storage
    /// limits or an emptyDir `sizeLimit`. Upstream has no flag for it, only the field.
    pub local_storage_capacity_isolation: bool,
}

impl Default for EvictionSettings {
    fn default() -> Self {
        EvictionSettings {
            soft: BTreeMap::new(),
            soft_grace_period: BTreeMap::new(),
            minimum_reclaim: BTreeMap::new(),
            pressure_transition_period: DEFAULT_PRESSURE_TRANSITION_PERIOD,
            max_pod_grace_period_seconds: 0,
            kernel_memcg_notification: false,
            local_storage_capacity_isolation: true,
        }
    }
}

/// `signal=value` pairs from a flag or the file's map, with where they came from.
fn pairs<'a>(
    flag: Option<&'a [(String, String)]>,
    flag_name: &'a str,
    file: Option<&'a BTreeMap<String, String>>,
    file_name: &'a str,
) -> (Vec<(String, String)>, &'a str) {
    match (flag, file) {
        (Some(p), _) => (p.to_vec(), flag_name),
        (None, Some(m)) => (
            m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            file_name,
        ),
        (None, None) => (Vec::new(), flag_name),
    }
}

fn check_signal(signal: &str, origin: &str) -> Result<(), ConfigError> {
    if threshold::SIGNALS.contains(&signal) {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            origin,
            format!(
                "{signal:?} is not an eviction signal (one of {})",
                threshold::SIGNALS.join(", ")
            ),
        ))
    }
}

/// Merges flag, file and defaults, and checks them as upstream's `ParseThresholdConfig` does.
pub(super) fn eviction_settings(
    flags: &Flags,
    f: &KubeletConfigurationFile,
) -> Result<EvictionSettings, ConfigError> {
    let d = EvictionSettings::default();
    let soft = match (&flags.eviction_soft, &f.eviction_soft) {
        (Some(text), _) => threshold::parse_flag(text)
            .map_err(|why| ConfigError::invalid("--eviction-soft", why.to_string()))?,
        (None, Some(map)) => {
            let mut out = BTreeMap::new();
            for (signal, value) in map {
                let t = threshold::parse_signal_value(signal, value).map_err(|why| {
                    ConfigError::invalid(format!("evictionSoft.{signal}"), why.to_string())
                })?;
                out.insert(signal.clone(), t);
            }
            out
        }
        (None, None) => BTreeMap::new(),
    };
    let (grace_pairs, origin) = pairs(
        flags.eviction_soft_grace_period.as_deref(),
        "--eviction-soft-grace-period",
        f.eviction_soft_grace_period.as_ref(),
        "evictionSoftGracePeriod",
    );
    let mut soft_grace_period = BTreeMap::new();
    for (signal, value) in grace_pairs {
        check_signal(&signal, origin)?;
        let d = parse_go_duration(value.trim()).map_err(|e| {
            ConfigError::invalid(origin, format!("{signal}={value}: invalid duration: {e}"))
        })?;
        soft_grace_period.insert(signal, d);
    }
    for signal in soft.keys() {
        if !soft_grace_period.contains_key(signal) {
            return Err(ConfigError::invalid(
                "evictionSoftGracePeriod (--eviction-soft-grace-period)",
                format!("grace period must be specified for the soft eviction threshold {signal}"),
            ));
        }
    }
    let (reclaim_pairs, origin) = pairs(
        flags.eviction_minimum_reclaim.as_deref(),
        "--eviction-minimum-reclaim",
        f.eviction_minimum_reclaim.as_ref(),
        "evictionMinimumReclaim",
    );
    let mut minimum_reclaim = BTreeMap::new();
    for (signal, value) in reclaim_pairs {
        let t = threshold::parse_signal_value(&signal, &value)
            .map_err(|why| ConfigError::invalid(origin, why.to_string()))?;
        if matches!(t, Threshold::Percent(p) if p <= 0.0) {
            return Err(ConfigError::invalid(
                origin,
                format!("eviction percentage minimum reclaim {signal} must be positive: {value}"),
            ));
        }
        minimum_reclaim.insert(signal, t);
    }
    let pressure_transition_period = match (
        flags.eviction_pressure_transition_period,
        f.eviction_pressure_transition_period.as_deref(),
    ) {
        (Some(d), _) => d,
        (None, Some(text)) => parse_go_duration(text).map_err(|e| {
            ConfigError::invalid(
                "evictionPressureTransitionPeriod",
                format!("invalid duration {text:?}: {e}"),
            )
        })?,
        (None, None) => d.pressure_transition_period,
    };
    let max_pod_grace_period_seconds = flags
        .eviction_max_pod_grace_period
        .map(i64::from)
        .or(f.eviction_max_pod_grace_period)
        .unwrap_or(d.max_pod_grace_period_seconds);
    let kernel_memcg_notification = flags
        .kernel_memcg_notification
        .or(f.kernel_memcg_notification)
        .unwrap_or(d.kernel_memcg_notification);
    let local_storage_capacity_isolation = f
        .local_storage_capacity_isolation
        .unwrap_or(d.local_storage_capacity_isolation);
    Ok(EvictionSettings {
        soft,
        soft_grace_period,
        minimum_reclaim,
        pressure_transition_period,
        max_pod_grace_period_seconds,
        kernel_memcg_notification,
        local_storage_capacity_isolation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::SectionError;

    fn merge(args: &[&str], file: &str) -> Result<EvictionSettings, SectionError> {
        let (flags, f) = crate::config::tests::flags_and_file(args, file)?;
        Ok(eviction_settings(&flags, &f)?)
    }

    #[test]
    fn defaults_are_upstreams() {
        let s = merge(&[], "").unwrap();
        assert_eq!(s, EvictionSettings::default());
        assert_eq!(s.pressure_transition_period, Duration::from_secs(300));
        assert_eq!(s.max_pod_grace_period_seconds, 0);
        assert!(!s.kernel_memcg_notification);
    }

    #[test]
    fn kernel_memcg_notification_from_the_file_or_the_flag() {
        for (args, file, want) in [
            (&[][..], r#"{"kernelMemcgNotification": true}"#, true),
            (&[][..], r#"{"kernelMemcgNotification": false}"#, false),
            (&["--kernel-memcg-notification"][..], "", true),
            (
                &["--kernel-memcg-notification=false"][..],
                r#"{"kernelMemcgNotification": true}"#,
                false,
            ),
        ] {
            let s = merge(args, file).unwrap();
            assert_eq!(s.kernel_memcg_notification, want, "{args:?} {file}");
        }
        assert!(merge(&[], r#"{"kernelMemcgNotification": "yes"}"#).is_err());
    }

    #[test]
    fn flags_win_over_the_file() {
        let s = merge(
            &[
                "--eviction-soft=memory.available<1Gi",
                "--eviction-soft-grace-period=memory.available=1m30s",
                "--eviction-minimum-reclaim=memory.available=100Mi,nodefs.available=5%",
                "--eviction-pressure-transition-period=30s",
                "--eviction-max-pod-grace-period=20",
            ],
            r#"{"evictionSoft": {"nodefs.available": "20%"},
                "evictionSoftGracePeriod": {"nodefs.available": "1m"},
                "evictionPressureTransitionPeriod": "1m",
                "evictionMaxPodGracePeriod": 60}"#,
        )
        .unwrap();
        assert_eq!(s.soft.len(), 1);
        assert_eq!(s.soft["memory.available"].amount(0), 1 << 30);
        assert_eq!(
            s.soft_grace_period["memory.available"],
            Duration::from_secs(90)
        );
        assert_eq!(
            s.minimum_reclaim["nodefs.available"],
            Threshold::Percent(5.0)
        );
        assert_eq!(s.pressure_transition_period, Duration::from_secs(30));
        assert_eq!(s.max_pod_grace_period_seconds, 20);

        let s = merge(
            &[],
            r#"{"evictionSoft": {"nodefs.available": "20%"},
                "evictionSoftGracePeriod": {"nodefs.available": "1m"},
                "evictionMinimumReclaim": {"nodefs.available": "1Gi"},
                "evictionPressureTransitionPeriod": "1m",
                "evictionMaxPodGracePeriod": -1}"#,
        )
        .unwrap();
        assert_eq!(s.soft["nodefs.available"], Threshold::Percent(20.0));
        assert_eq!(s.minimum_reclaim["nodefs.available"].amount(0), 1 << 30);
        assert_eq!(s.pressure_transition_period, Duration::from_secs(60));
        assert_eq!(s.max_pod_grace_period_seconds, -1);
    }

    #[test]
    fn refuses_what_upstream_refuses() {
        for (args, file, needle) in [
            (
                &["--eviction-soft=memory.available<1Gi"][..],
                "",
                "grace period must be specified for the soft eviction threshold memory.available",
            ),
            (
                &["--eviction-soft-grace-period=memory.free=1m"][..],
                "",
                "not an eviction signal",
            ),
            (
                &["--eviction-soft-grace-period=memory.available=soon"][..],
                "",
                "invalid duration",
            ),
            (
                &["--eviction-minimum-reclaim=memory.available=0%"][..],
                "",
                "must be positive",
            ),
            (
                &[][..],
                r#"{"evictionMinimumReclaim": {"memory.available": "-1Mi"}}"#,
                "must not be negative",
            ),
            (
                &[][..],
                r#"{"evictionSoft": {"memory.available": "lots"}}"#,
                "evictionSoft.memory.available",
            ),
            (
                &[][..],
                r#"{"evictionPressureTransitionPeriod": "soon"}"#,
                "evictionPressureTransitionPeriod",
            ),
        ] {
            let err = merge(args, file).unwrap_err();
            assert!(err.to_string().contains(needle), "{args:?} {file}: {err}");
        }
    }
}
