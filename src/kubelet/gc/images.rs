//! Which images the image GC removes (pure; upstream's `image_gc_manager.go` rules).
//!
//! The runtime does not say when an image was last used, so, as upstream, the GC keeps its
//! own record in memory: when each image was first seen and when a container last used it.
//! A restart forgets it, which only delays removals (every image is new again).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::base::clock::Instant;

/// What the image GC may do (the `imageGC*` settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// Usage (percent of the filesystem) at which removal starts; 100 = never for space.
    pub high_threshold_percent: u8,
    /// Usage (percent) removal aims for.
    pub low_threshold_percent: u8,
    /// An image seen for less than this is never removed.
    pub min_age: Duration,
    /// Unused for longer than this: removed whatever the usage; zero = off.
    pub max_age: Duration,
}

/// One image as the runtime lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct ListedImage {
    pub id: String,
    pub size: u64,
    /// The runtime pinned it (the sandbox image): never removed.
    pub pinned: bool,
}

/// The image filesystem's size and free space, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity: u64,
    pub available: u64,
}

impl FsUsage {
    /// Upstream's integer percentage in use.
    pub fn usage_percent(&self) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        100 - (self.available.min(self.capacity) * 100 / self.capacity)
    }
}

/// What the GC knows of one image.
#[derive(Clone, Debug, PartialEq)]
struct ImageRecord {
    first_detected: Instant,
    /// Last time a container was seen using it.
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
}

/// Why an image is removed (upstream's `reason` label of `kubelet_image_garbage_collected_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemovalReason {
    Age,
    Space,
}

impl RemovalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RemovalReason::Age => "age",
            RemovalReason::Space => "space",
        }
    }
}

/// The images one pass removes, in order, and what the space part aimed for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImageGcPlan {
    pub remove: Vec<(String, RemovalReason)>,
    /// Bytes the space part had to free (0 when under the high threshold).
    pub bytes_to_free: u64,
    /// Bytes the planned space removals free; below `bytes_to_free` when not enough images
    /// could go.
    pub bytes_planned: u64,
}

/// The in-memory record of images, kept by the GC loop.
#[derive(Clone, Debug, Default)]
pub struct ImageTracker {
    records: HashMap<String, ImageRecord>,
}

impl ImageTracker {
    /// Takes in a listing: new images are first seen `now`, images in use are used `now`,
    /// images no longer listed are forgotten.
    pub fn observe(&mut self, images: &[ListedImage], in_use: &HashSet<String>, now: Instant) {
        let listed: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| listed.contains(id.as_str()));
        for image in images {
            let record = self
                .records
                .entry(image.id.clone())
                .or_insert_with(|| ImageRecord {
                    first_detected: now,
                    last_used: None,
                    size: image.size,
                    pinned: image.pinned,
                });
            record.size = image.size;
            record.pinned = image.pinned;
            if in_use.contains(&image.id) {
                record.last_used = Some(now);
            }
        }
    }

    /// How many images are known.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Decides an eviction-time reclaim (upstream's `DeleteUnusedImages`): every image that
    /// no container uses, the runtime has not pinned, and that was first seen at least
    /// `min_age` ago, least recently used first. No thresholds and no byte goal: the node is
    /// already under disk pressure, and the eviction manager measures again afterwards.
    /// The minimum age still holds, as upstream: an image seen just now may be one a pod is
    /// about to start from.
    pub fn plan_unused(
        &self,
        in_use: &HashSet<String>,
        min_age: Duration,
        now: Instant,
    ) -> Vec<String> {
        let mut candidates: Vec<(&String, &ImageRecord)> = self
            .records
            .iter()
            .filter(|(id, r)| {
                !in_use.contains(*id)
                    && !r.pinned
                    && now.saturating_duration_since(r.first_detected) >= min_age
            })
            .collect();
        candidates.sort_by(|a, b| {
            (a.1.last_used, a.1.first_detected, a.0).cmp(&(b.1.last_used, b.1.first_detected, b.0))
        });
        candidates.into_iter().map(|(id, _)| id.clone()).collect()
    }

    /// Decides a pass. `began` is when the GC started: the age rule waits `max_age` from
    /// then, since nothing is known of use before it. `usage` is absent when the filesystem
    /// could not be measured (then only the age rule applies).
    pub fn plan(
        &self,
        in_use: &HashSet<String>,
        usage: Option<FsUsage>,
        policy: ImageGcPolicy,
        now: Instant,
        began: Instant,
    ) -> ImageGcPlan {
        // Candidates: not in use, not pinned, least recently used first.
        let mut candidates: Vec<(&String, &ImageRecord)> = self
            .records
            .iter()
            .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
            .collect();
        candidates.sort_by(|a, b| {
            (a.1.last_used, a.1.first_detected, a.0).cmp(&(b.1.last_used, b.1.first_detected, b.0))
        });
        let old_enough =
            |r: &ImageRecord| now.saturating_duration_since(r.first_detected) >= policy.min_age;
        let mut plan = ImageGcPlan::default();
        let mut taken: HashSet<&str> = HashSet::new();
        if !policy.max_age.is_zero() && now.saturating_duration_since(began) > policy.max_age {
            for (id, r) in &candidates {
                let since = r.last_used.unwrap_or(r.first_detected);
                if old_enough(r) && now.saturating_duration_since(since) > policy.max_age {
                    plan.remove.push(((*id).clone(), RemovalReason::Age));
                    taken.insert(id.as_str());
                }
            }
        }
        let Some(usage) = usage.filter(|u| u.capacity > 0) else {
            return plan;
        };
        if policy.high_threshold_percent >= 100
            || usage.usage_percent() < u64::from(policy.high_threshold_percent)
        {
            return plan;
        }
        let target_free = usage.capacity / 100 * u64::from(100 - policy.low_threshold_percent)
            + usage.capacity % 100 * u64::from(100 - policy.low_threshold_percent) / 100;
        plan.bytes_to_free = target_free.saturating_sub(usage.available);
        // What the age rule removes counts towards the goal.
        let mut freed: u64 = candidates
            .iter()
            .filter(|(id, _)| taken.contains(id.as_str()))
            .map(|(_, r)| r.size)
            .sum();
        for (id, r) in &candidates {
            if freed >= plan.bytes_to_free {
                break;
            }
            if taken.contains(id.as_str()) || !old_enough(r) {
                continue;
            }
            plan.remove.push(((*id).clone(), RemovalReason::Space));
            freed += r.size;
            plan.bytes_planned += r.size;
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn policy() -> ImageGcPolicy {
        ImageGcPolicy {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
        }
    }

    fn image(id: &str, size_mib: u64) -> ListedImage {
        ListedImage {
            id: id.into(),
            size: size_mib * MIB,
            pinned: false,
        }
    }

    fn set(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    /// A tracker that saw `seen` at t0, then `used` in use at t0+used_at each.
    fn tracker(t0: Instant, seen: &[ListedImage], used: &[(&str, u64)]) -> ImageTracker {
        let mut t = ImageTracker::default();
        t.observe(seen, &HashSet::new(), t0);
        for (id, secs) in used {
            t.observe(seen, &set(&[id]), t0 + Duration::from_secs(*secs));
        }
        t
    }

    fn ids(plan: &ImageGcPlan) -> Vec<(&str, &str)> {
        plan.remove
            .iter()
            .map(|(id, r)| (id.as_str(), r.as_str()))
            .collect()
    }

    #[test]
    fn space_removals() {
        let t0 = Instant::now();
        let images = [
            image("a", 30),
            image("b", 30),
            image("c", 30),
            image("d", 30),
        ];
        // 1000 MiB disk: 80 % is 800 MiB used, so 200 MiB must be available.
        let usage = |available_mib: u64| {
            Some(FsUsage {
                capacity: 1000 * MIB,
                available: available_mib * MIB,
            })
        };
        let later = t0 + Duration::from_secs(600);
        type Case<'a> = (
            &'a str,
            ImageTracker,
            HashSet<String>,
            Option<FsUsage>,
            Instant,
            Vec<(&'a str, &'a str)>,
        );
        let cases: Vec<Case> = vec![
            (
                "below the high threshold nothing goes",
                tracker(t0, &images, &[]),
                set(&[]),
                usage(160),
                later,
                vec![],
            ),
            (
                "least recently used first, just enough to reach the low threshold",
                tracker(t0, &images, &[("c", 10), ("a", 20), ("b", 30)]),
                set(&[]),
                usage(140),
                later,
                vec![("d", "space"), ("c", "space")],
            ),
            (
                "an image in use is never removed",
                tracker(t0, &images, &[]),
                set(&["a", "b", "c"]),
                usage(100),
                later,
                vec![("d", "space")],
            ),
            (
                "images younger than the minimum age stay",
                tracker(t0, &images, &[]),
                set(&[]),
                usage(100),
                t0 + Duration::from_secs(60),
                vec![],
            ),
            (
                "unmeasurable filesystem: nothing for space",
                tracker(t0, &images, &[]),
                set(&[]),
                None,
                later,
                vec![],
            ),
        ];
        for (name, tracker, in_use, usage, now, want) in cases {
            let plan = tracker.plan(&in_use, usage, policy(), now, t0);
            assert_eq!(ids(&plan), want, "{name}");
        }
    }

    #[test]
    fn reclaim_under_pressure_takes_every_unused_image_old_enough() {
        let t0 = Instant::now();
        let pinned = ListedImage {
            pinned: true,
            ..image("pause", 1)
        };
        let images = [
            image("a", 30),
            image("b", 30),
            image("c", 30),
            image("d", 30),
            pinned,
        ];
        let min_age = Duration::from_secs(120);
        let later = t0 + Duration::from_secs(600);
        type Case<'a> = (
            &'a str,
            ImageTracker,
            HashSet<String>,
            Instant,
            Vec<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "all unused ones, least recently used first, whatever their size",
                tracker(t0, &images[..4], &[("c", 10), ("a", 20)]),
                set(&[]),
                later,
                vec!["b", "d", "c", "a"],
            ),
            (
                "images in use and pinned images stay",
                tracker(t0, &images, &[]),
                set(&["a", "c"]),
                later,
                vec!["b", "d"],
            ),
            (
                "nothing seen for less than the minimum age",
                tracker(t0, &images, &[]),
                set(&[]),
                t0 + Duration::from_secs(119),
                vec![],
            ),
            (
                "nothing known, nothing removed",
                ImageTracker::default(),
                set(&[]),
                later,
                vec![],
            ),
        ];
        for (name, tracker, in_use, now, want) in cases {
            assert_eq!(tracker.plan_unused(&in_use, min_age, now), want, "{name}");
        }
        // An image detected late (pulled after the others) is younger.
        let mut t = tracker(t0, &images[..1], &[]);
        t.observe(&images[..2], &HashSet::new(), t0 + Duration::from_secs(500));
        assert_eq!(t.plan_unused(&set(&[]), min_age, later), vec!["a"]);
    }

    #[test]
    fn pinned_images_stay_and_the_shortfall_is_reported() {
        let t0 = Instant::now();
        let mut t = ImageTracker::default();
        let pinned = ListedImage {
            pinned: true,
            ..image("pause", 50)
        };
        t.observe(&[pinned, image("x", 5)], &HashSet::new(), t0);
        let plan = t.plan(
            &HashSet::new(),
            Some(FsUsage {
                capacity: 1000 * MIB,
                available: 0,
            }),
            policy(),
            t0 + Duration::from_secs(300),
            t0,
        );
        assert_eq!(ids(&plan), vec![("x", "space")]);
        assert_eq!(plan.bytes_to_free, 200 * MIB);
        assert_eq!(plan.bytes_planned, 5 * MIB);
    }

    #[test]
    fn maximum_age() {
        let t0 = Instant::now();
        let images = [image("old", 1), image("fresh", 1)];
        let p = ImageGcPolicy {
            max_age: Duration::from_secs(600),
            ..policy()
        };
        let t = tracker(t0, &images, &[("fresh", 500)]);
        // Not before max_age has passed since the GC began.
        let early = t.plan(&set(&[]), None, p, t0 + Duration::from_secs(550), t0);
        assert_eq!(ids(&early), vec![]);
        let plan = t.plan(&set(&[]), None, p, t0 + Duration::from_secs(700), t0);
        assert_eq!(ids(&plan), vec![("old", "age")]);
        // An image in use is never old.
        let plan = t.plan(&set(&["old"]), None, p, t0 + Duration::from_secs(700), t0);
        assert_eq!(ids(&plan), vec![]);
    }

    #[test]
    fn forgets_images_that_are_gone_and_counts_usage() {
        let t0 = Instant::now();
        let mut t = ImageTracker::default();
        t.observe(&[image("a", 1), image("b", 1)], &HashSet::new(), t0);
        t.observe(&[image("a", 1)], &HashSet::new(), t0);
        assert_eq!(t.len(), 1);
        let u = FsUsage {
            capacity: 200,
            available: 31,
        };
        assert_eq!(u.usage_percent(), 85);
        assert_eq!(
            FsUsage {
                capacity: 0,
                available: 0
            }
            .usage_percent(),
            0
        );
    }
}
