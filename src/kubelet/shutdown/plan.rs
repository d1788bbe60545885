//! The order and the grace periods of a graceful node shutdown, as upstream's node shutdown
//! manager computes them. Pure: the manager hands in the configuration and the pods, and
//! carries the plan out.
//!
//! The configuration is a list of priority buckets, each with the time its pods get. The two
//! plain fields (`shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`) are the special
//! case of two buckets: pods below the critical priority get the difference, critical pods the
//! last part. Buckets are stopped from the lowest priority up; a pod belongs to the bucket with
//! the highest priority not above its own (pods below every bucket go to the lowest).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

pub(crate) use crate::base::podspec::pod::{
    DEFAULT_PRIORITY, NODE_CRITICAL_PRIORITY, SYSTEM_CRITICAL_PRIORITY,
};
pub(crate) use crate::config::shutdown::PriorityGrace;

/// The whole time the buckets ask for: what logind's `InhibitDelayMaxUSec` must allow.
pub(crate) fn period_requested(buckets: &[PriorityGrace]) -> Duration {
    let total = buckets
        .iter()
        .map(|b| b.grace_seconds.max(0))
        .fold(0i64, i64::saturating_add);
    Duration::from_secs(u64::try_from(total).unwrap_or(0))
}

/// A pod's priority for the shutdown order: `spec.priority` (the API server sets it from the
/// priority class); for a static pod without one, the value the API server would give its
/// `priorityClassName` if it is one of the two critical classes, so that a static
/// `system-node-critical` pod is stopped last (upstream ranks such a pod at 0 and warns).
pub(crate) fn pod_priority(pod: &Pod) -> i32 {
    let Some(spec) = pod.spec.as_ref() else {
        return DEFAULT_PRIORITY;
    };
    if let Some(p) = spec.priority {
        return p;
    }
    match spec.priority_class_name.as_deref() {
        Some("system-node-critical") => NODE_CRITICAL_PRIORITY,
        Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
        _ => DEFAULT_PRIORITY,
    }
}

/// One pod to stop, as the plan needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodToStop {
    pub uid: String,
    pub priority: i32,
    /// `terminationGracePeriodSeconds`, when set.
    pub own_grace: Option<i64>,
}

impl PodToStop {
    pub(crate) fn of(pod: &Pod) -> PodToStop {
        PodToStop {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            priority: pod_priority(pod),
            own_grace: pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds),
        }
    }
}

/// One step of the shutdown: these pods are stopped together, each with its grace, and the
/// next step begins when all have stopped or `grace_seconds` has passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    pub priority: i32,
    pub grace_seconds: i64,
    /// (UID, grace period in seconds): the bucket's, or the pod's own when shorter.
    pub pods: Vec<(String, i64)>,
}

/// Puts each pod in its bucket, lowest priority first. Every bucket is a step, also an empty
/// one (it is skipped at once). No buckets, no steps.
pub(crate) fn plan(buckets: &[PriorityGrace], pods: &[PodToStop]) -> Vec<Step> {
    let mut steps: Vec<Step> = buckets
        .iter()
        .map(|b| Step {
            priority: b.priority,
            grace_seconds: b.grace_seconds,
            pods: Vec::new(),
        })
        .collect();
    if steps.is_empty() {
        return steps;
    }
    for pod in pods {
        // The last bucket whose priority is not above the pod's; the first if none is.
        let index = steps
            .iter()
            .rposition(|s| s.priority <= pod.priority)
            .unwrap_or(0);
        let step = &mut steps[index];
        let grace = match pod.own_grace {
            Some(own) if own <= step.grace_seconds => own.max(0),
            _ => step.grace_seconds,
        };
        step.pods.push((pod.uid.clone(), grace));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::shutdown::buckets;

    fn b(priority: i32, grace_seconds: i64) -> PriorityGrace {
        PriorityGrace {
            priority,
            grace_seconds,
        }
    }

    fn pod(uid: &str, priority: i32, own_grace: Option<i64>) -> PodToStop {
        PodToStop {
            uid: uid.into(),
            priority,
            own_grace,
        }
    }

    #[test]
    fn buckets_from_the_configuration() {
        let s = Duration::from_secs;
        type Case = (
            &'static str,
            Duration,
            Duration,
            Vec<PriorityGrace>,
            Vec<PriorityGrace>,
        );
        let cases: &[Case] = &[
            ("off by default", s(0), s(0), vec![], vec![]),
            (
                "critical part only when the whole is set",
                s(0),
                s(10),
                vec![],
                vec![],
            ),
            (
                "regular pods get the difference, critical pods the last part",
                s(30),
                s(10),
                vec![],
                vec![b(0, 20), b(SYSTEM_CRITICAL_PRIORITY, 10)],
            ),
            (
                "no critical part",
                s(20),
                s(0),
                vec![],
                vec![b(0, 20), b(SYSTEM_CRITICAL_PRIORITY, 0)],
            ),
            (
                "a critical part above the whole is no plan",
                s(10),
                s(20),
                vec![],
                vec![],
            ),
            (
                "buckets by priority are sorted",
                s(0),
                s(0),
                vec![b(100000, 120), b(0, 60), b(SYSTEM_CRITICAL_PRIORITY, 30)],
                vec![b(0, 60), b(100000, 120), b(SYSTEM_CRITICAL_PRIORITY, 30)],
            ),
            (
                "fractions of a second are dropped",
                Duration::from_millis(30_900),
                Duration::from_millis(10_500),
                vec![],
                vec![b(0, 20), b(SYSTEM_CRITICAL_PRIORITY, 10)],
            ),
        ];
        for (name, grace, critical, by_priority, want) in cases {
            assert_eq!(&buckets(*grace, *critical, by_priority), want, "{name}");
        }
    }

    #[test]
    fn the_period_requested_is_the_sum_of_the_buckets() {
        assert_eq!(period_requested(&[]), Duration::ZERO);
        assert_eq!(
            period_requested(&[b(0, 20), b(SYSTEM_CRITICAL_PRIORITY, 10)]),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn pods_go_to_their_bucket_with_their_grace_capped() {
        let two = [b(0, 20), b(SYSTEM_CRITICAL_PRIORITY, 10)];
        let three = [b(0, 10), b(1000, 20), b(SYSTEM_CRITICAL_PRIORITY, 5)];
        type Case<'a> = (
            &'a str,
            &'a [PriorityGrace],
            Vec<PodToStop>,
            Vec<Vec<(&'a str, i64)>>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "regular first, critical last",
                &two,
                vec![
                    pod("crit", NODE_CRITICAL_PRIORITY, Some(30)),
                    pod("web", 0, Some(30)),
                ],
                vec![vec![("web", 20)], vec![("crit", 10)]],
            ),
            (
                "a shorter own grace is kept, a longer one capped",
                &two,
                vec![pod("quick", 0, Some(3)), pod("slow", 0, Some(600))],
                vec![vec![("quick", 3), ("slow", 20)], vec![]],
            ),
            (
                "no own grace: the bucket's",
                &two,
                vec![pod("none", 0, None)],
                vec![vec![("none", 20)], vec![]],
            ),
            (
                "a negative priority goes to the lowest bucket",
                &two,
                vec![pod("low", -5, Some(30))],
                vec![vec![("low", 20)], vec![]],
            ),
            (
                "between buckets: the lower one",
                &three,
                vec![
                    pod("a", 999, Some(30)),
                    pod("b", 1000, Some(30)),
                    pod("c", 1_999_999_999, Some(30)),
                    pod("d", SYSTEM_CRITICAL_PRIORITY, Some(30)),
                ],
                vec![vec![("a", 10)], vec![("b", 20), ("c", 20)], vec![("d", 5)]],
            ),
            ("no buckets, no steps", &[], vec![pod("x", 0, None)], vec![]),
        ];
        for (name, buckets, pods, want) in cases {
            let got: Vec<Vec<(String, i64)>> =
                plan(buckets, &pods).into_iter().map(|s| s.pods).collect();
            let want: Vec<Vec<(String, i64)>> = want
                .into_iter()
                .map(|s| s.into_iter().map(|(u, g)| (u.to_string(), g)).collect())
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn priority_of_api_and_static_pods() {
        let p = |priority: Option<i32>, class: Option<&str>| Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                priority,
                priority_class_name: class.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(pod_priority(&p(Some(7), Some("system-node-critical"))), 7);
        assert_eq!(
            pod_priority(&p(None, Some("system-node-critical"))),
            NODE_CRITICAL_PRIORITY
        );
        assert_eq!(
            pod_priority(&p(None, Some("system-cluster-critical"))),
            SYSTEM_CRITICAL_PRIORITY
        );
        assert_eq!(pod_priority(&p(None, Some("high"))), 0);
        assert_eq!(pod_priority(&Pod::default()), 0);
    }
}
