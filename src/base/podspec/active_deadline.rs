//! `spec.activeDeadlineSeconds`: how long a pod may be active on the node, counted from its
//! `status.startTime`, as upstream's `activeDeadlineHandler`. The field may be set or lowered
//! on a running pod (the API server refuses raising or removing it), so the sync loop asks
//! again on every housekeeping tick rather than once at admission.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;

/// The status reason of a pod stopped at its deadline (upstream's).
pub(crate) const REASON: &str = "DeadlineExceeded";

/// The status message of a pod stopped at its deadline (upstream's).
pub(crate) const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// Whether `pod`, active since `start`, has passed its deadline at `now`. A pod with no
/// deadline or not started yet has none; a negative deadline counts as zero (the API server
/// allows only positive values).
pub(crate) fn past_active_deadline(pod: &Pod, start: Option<SystemTime>, now: SystemTime) -> bool {
    let Some(seconds) = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds) else {
        return false;
    };
    let Some(start) = start else {
        return false;
    };
    let active = now.duration_since(start).unwrap_or_default();
    active >= Duration::from_secs(seconds.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;

    #[test]
    fn deadline_table() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let pod = |deadline: Option<i64>| Pod {
            spec: Some(PodSpec {
                active_deadline_seconds: deadline,
                ..Default::default()
            }),
            ..Default::default()
        };
        let at = |s: u64| start + Duration::from_secs(s);
        // (what, deadline, start, now, past)
        let rows = [
            ("no deadline", None, Some(start), at(10_000), false),
            ("not started", Some(5), None, at(10_000), false),
            ("before it", Some(5), Some(start), at(4), false),
            ("at it", Some(5), Some(start), at(5), true),
            ("after it", Some(5), Some(start), at(6), true),
            (
                "a clock behind the start",
                Some(5),
                Some(start),
                start - Duration::from_secs(9),
                false,
            ),
            ("zero", Some(0), Some(start), start, true),
        ];
        for (what, deadline, start, now, want) in rows {
            assert_eq!(
                past_active_deadline(&pod(deadline), start, now),
                want,
                "{what}"
            );
        }
    }
}
