//! Whether a container's image is ready, must be pulled, or keeps the container waiting: the
//! pull policy and the pull back-off as a pure decision. The executor looks the image up, asks
//! this, and pulls when told to.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::Container;

use super::backoff::{BackoffEntry, BackoffPolicy};
use crate::kubelet::pod_status::{WaitReason, WaitingReason};

/// `imagePullPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The container's policy. The sources default it as the API does (`Always` for `:latest`
    /// or no tag); a value they did not set or do not know reads as `IfNotPresent`.
    pub(crate) fn of(container: &Container) -> PullPolicy {
        match container.image_pull_policy.as_deref() {
            Some("Always") => PullPolicy::Always,
            Some("Never") => PullPolicy::Never,
            _ => PullPolicy::IfNotPresent,
        }
    }
}

/// What to do about one container's image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ImageStep {
    /// The image is there and the policy does not ask for a pull.
    Ready,
    /// Pull it now.
    Pull,
    /// The container waits (never pulled, or a pull back-off).
    Wait(WaitingReason),
}

/// The back-off table's key for pulls of `image` (container names cannot contain ':').
pub(crate) fn backoff_key(image: &str) -> String {
    format!("image:{image}")
}

/// Decides the image step for `image` under `policy`, given whether the runtime has it and the
/// pull back-off entry of the image, at `now`.
pub(crate) fn image_step(
    image: &str,
    policy: PullPolicy,
    present: bool,
    backoff: Option<&BackoffEntry>,
    backoff_policy: BackoffPolicy,
    now: SystemTime,
) -> ImageStep {
    match policy {
        PullPolicy::Never if present => ImageStep::Ready,
        PullPolicy::Never => ImageStep::Wait(WaitingReason::new(
            WaitReason::ErrImageNeverPull,
            format!("Container image {image:?} is not present with pull policy of Never"),
        )),
        PullPolicy::IfNotPresent if present => ImageStep::Ready,
        _ => {
            // Failed pulls back off per image, like crash loops.
            let waiting = backoff.is_some_and(|entry| {
                backoff_policy
                    .remaining(Some(entry), entry.last_update, now)
                    .is_some()
            });
            if waiting {
                ImageStep::Wait(WaitingReason::new(
                    WaitReason::ImagePullBackOff,
                    format!("Back-off pulling image {image:?}"),
                ))
            } else {
                ImageStep::Pull
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    /// Name, policy, present, back-off entry, now, and a check of the step.
    type Row<'a> = (
        &'a str,
        PullPolicy,
        bool,
        Option<&'a BackoffEntry>,
        u64,
        Box<dyn Fn(&ImageStep) -> bool>,
    );

    #[test]
    fn policies_presence_and_back_off() {
        use ImageStep::*;
        use PullPolicy::*;
        let failed_at_100 = BackoffEntry {
            delay: Duration::from_secs(10),
            last_update: at(100),
        };
        let wait = |reason: WaitReason| move |step: &ImageStep| matches!(step, ImageStep::Wait(w) if w.reason == reason);
        let rows: Vec<Row> = vec![
            (
                "present, IfNotPresent",
                IfNotPresent,
                true,
                None,
                0,
                Box::new(|s| *s == Ready),
            ),
            (
                "missing, IfNotPresent",
                IfNotPresent,
                false,
                None,
                0,
                Box::new(|s| *s == Pull),
            ),
            (
                "present, Always",
                Always,
                true,
                None,
                0,
                Box::new(|s| *s == Pull),
            ),
            (
                "present, Never",
                Never,
                true,
                None,
                0,
                Box::new(|s| *s == Ready),
            ),
            (
                "missing, Never",
                Never,
                false,
                None,
                0,
                Box::new(wait(WaitReason::ErrImageNeverPull)),
            ),
            (
                "missing, failed 5s ago",
                IfNotPresent,
                false,
                Some(&failed_at_100),
                105,
                Box::new(wait(WaitReason::ImagePullBackOff)),
            ),
            (
                "missing, back-off over",
                IfNotPresent,
                false,
                Some(&failed_at_100),
                111,
                Box::new(|s| *s == Pull),
            ),
            (
                "present beats back-off under IfNotPresent",
                IfNotPresent,
                true,
                Some(&failed_at_100),
                105,
                Box::new(|s| *s == Ready),
            ),
            (
                "Always still backs off",
                Always,
                true,
                Some(&failed_at_100),
                105,
                Box::new(wait(WaitReason::ImagePullBackOff)),
            ),
        ];
        for (name, policy, present, entry, now, want) in rows {
            let got = image_step(
                "busybox:1",
                policy,
                present,
                entry,
                BackoffPolicy::default(),
                at(now),
            );
            assert!(want(&got), "{name}: got {got:?}");
        }
    }

    #[test]
    fn policy_of_a_container() {
        let c = |p: Option<&str>| Container {
            image_pull_policy: p.map(str::to_string),
            ..Default::default()
        };
        assert_eq!(PullPolicy::of(&c(Some("Always"))), PullPolicy::Always);
        assert_eq!(PullPolicy::of(&c(Some("Never"))), PullPolicy::Never);
        assert_eq!(PullPolicy::of(&c(None)), PullPolicy::IfNotPresent);
        assert_eq!(backoff_key("a:1"), "image:a:1");
    }
}
