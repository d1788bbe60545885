//! Housekeeping settings: image garbage collection and container log rotation (the rotated
//! files' size and count, the workers, the interval), with upstream's field names, flags,
//! defaults and validation rules.
//!
//! Kept apart from the general merge in `validate` because the rules tie fields together
//! (the low threshold below the high one, the maximum age above the minimum).

use std::time::Duration;

use super::ConfigError;
use super::duration::parse_go_duration;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::validate::{InvalidValue, file_count};

pub(crate) const DEFAULT_IMAGE_GC_HIGH_THRESHOLD_PERCENT: u8 = 85;
pub(crate) const DEFAULT_IMAGE_GC_LOW_THRESHOLD_PERCENT: u8 = 80;
pub(crate) const DEFAULT_IMAGE_MINIMUM_GC_AGE: Duration = Duration::from_secs(120);
pub(crate) const DEFAULT_CONTAINER_LOG_MAX_SIZE: &str = "10Mi";
pub(crate) const DEFAULT_CONTAINER_LOG_MAX_FILES: u32 = 5;
pub(crate) const DEFAULT_CONTAINER_LOG_MAX_WORKERS: u32 = 1;
pub(crate) const DEFAULT_CONTAINER_LOG_MONITOR_INTERVAL: Duration = Duration::from_secs(10);
/// Upstream refuses a shorter monitor interval.
pub(crate) const MIN_CONTAINER_LOG_MONITOR_INTERVAL: Duration = Duration::from_secs(3);

/// What image GC and log rotation do; the merge of flags, file and upstream's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct GcSettings {
    /// `imageGCHighThresholdPercent` / `--image-gc-high-threshold`; 100 = image GC off.
    pub image_gc_high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent` / `--image-gc-low-threshold`.
    pub image_gc_low_threshold_percent: u8,
    /// `imageMinimumGCAge` / `--minimum-image-ttl-duration`.
    pub image_minimum_gc_age: Duration,
    /// `imageMaximumGCAge`; zero = images are never removed for age alone.
    pub image_maximum_gc_age: Duration,
    /// `containerLogMaxSize` in bytes.
    pub container_log_max_size_bytes: u64,
    /// `containerLogMaxFiles` (at least 2: the current file and one rotated).
    pub container_log_max_files: u32,
    /// `containerLogMaxWorkers`: containers whose logs are rotated at once.
    pub container_log_max_workers: u32,
    /// `containerLogMonitorInterval`.
    pub container_log_monitor_interval: Duration,
}

impl Default for GcSettings {
    fn default() -> Self {
        GcSettings {
            image_gc_high_threshold_percent: DEFAULT_IMAGE_GC_HIGH_THRESHOLD_PERCENT,
            image_gc_low_threshold_percent: DEFAULT_IMAGE_GC_LOW_THRESHOLD_PERCENT,
            image_minimum_gc_age: DEFAULT_IMAGE_MINIMUM_GC_AGE,
            image_maximum_gc_age: Duration::ZERO,
            container_log_max_size_bytes: 10 * 1024 * 1024,
            container_log_max_files: 5,
            container_log_max_workers: DEFAULT_CONTAINER_LOG_MAX_WORKERS,
            container_log_monitor_interval: DEFAULT_CONTAINER_LOG_MONITOR_INTERVAL,
        }
    }
}

fn percent(flag: Option<i32>, file: Option<i64>, field: &str) -> Result<Option<u8>, ConfigError> {
    let value = flag.map(i64::from).or(file);
    value
        .map(|n| {
            u8::try_from(n).ok().filter(|p| *p <= 100).ok_or_else(|| {
                ConfigError::invalid(field, format!("{n} must be between 0 and 100, inclusive"))
            })
        })
        .transpose()
}

fn duration(text: Option<&str>, field: &str) -> Result<Option<Duration>, ConfigError> {
    text.map(|t| {
        parse_go_duration(t)
            .map_err(|e| ConfigError::invalid(field, format!("invalid duration {t:?}: {e}")))
    })
    .transpose()
}

/// The size and count of a container's log files, as [`super::Config`] carries them.
pub(super) struct LogLimits {
    pub max_size: String,
    pub max_files: u32,
}

/// `containerLogMaxSize` (a positive quantity) and `containerLogMaxFiles` (at least 2: the
/// current file and one rotated). Read apart from [`gc_settings`], which takes them, because
/// they are checked earlier in the load's order (before the crash-loop back-off).
pub(super) fn container_log_limits(f: &KubeletConfigurationFile) -> Result<LogLimits, ConfigError> {
    let max_size = f
        .container_log_max_size
        .clone()
        .unwrap_or_else(|| DEFAULT_CONTAINER_LOG_MAX_SIZE.to_string());
    check_quantity(&max_size).map_err(|why| {
        ConfigError::invalid("containerLogMaxSize", format!("{max_size:?} {why}"))
    })?;
    let max_files = file_count(f.container_log_max_files, "containerLogMaxFiles", 2)?
        .unwrap_or(DEFAULT_CONTAINER_LOG_MAX_FILES);
    Ok(LogLimits {
        max_size,
        max_files,
    })
}

/// A positive Kubernetes quantity with an optional binary or decimal suffix, e.g. `10Mi`,
/// `500k`, `1G`, `1048576`, `1.5Gi`.
fn check_quantity(text: &str) -> Result<(), InvalidValue> {
    const SUFFIXES: [&str; 13] = [
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "",
    ];
    let number_len = text
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = text.split_at(number_len);
    let valid_number = !number.is_empty()
        && number.matches('.').count() <= 1
        && number != "."
        && !number.starts_with('.');
    if !valid_number || !SUFFIXES.contains(&suffix) {
        return Err(InvalidValue(
            "is not a size quantity (e.g. 10Mi, 500Ki, 1G)".into(),
        ));
    }
    if number.bytes().all(|b| b == b'0' || b == b'.') {
        return Err(InvalidValue("must be greater than 0".into()));
    }
    Ok(())
}

/// Merges flag, file and default, and checks them as upstream does. `log_max_size` and
/// `log_max_files` were already read and checked by [`container_log_limits`].
pub(super) fn gc_settings(
    flags: &Flags,
    f: &KubeletConfigurationFile,
    log_max_size: &str,
    log_max_files: u32,
) -> Result<GcSettings, ConfigError> {
    let d = GcSettings::default();
    let high = percent(
        flags.image_gc_high_threshold,
        f.image_gc_high_threshold_percent,
        "imageGCHighThresholdPercent (--image-gc-high-threshold)",
    )?
    .unwrap_or(d.image_gc_high_threshold_percent);
    let low = percent(
        flags.image_gc_low_threshold,
        f.image_gc_low_threshold_percent,
        "imageGCLowThresholdPercent (--image-gc-low-threshold)",
    )?
    .unwrap_or(d.image_gc_low_threshold_percent);
    if low >= high {
        return Err(ConfigError::invalid(
            "imageGCLowThresholdPercent (--image-gc-low-threshold)",
            format!(
                "{low} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"
            ),
        ));
    }
    // A Go duration cannot be negative here (the parser refuses a sign), which is upstream's
    // "must not be negative".
    let min_age = match flags.minimum_image_ttl_duration {
        Some(d) => d,
        None => duration(f.image_minimum_gc_age.as_deref(), "imageMinimumGCAge")?
            .unwrap_or(d.image_minimum_gc_age),
    };
    let max_age =
        duration(f.image_maximum_gc_age.as_deref(), "imageMaximumGCAge")?.unwrap_or(Duration::ZERO);
    if !max_age.is_zero() && max_age <= min_age {
        return Err(ConfigError::invalid(
            "imageMaximumGCAge",
            format!(
                "{} must be greater than imageMinimumGCAge {}",
                super::format_go_duration(max_age),
                super::format_go_duration(min_age)
            ),
        ));
    }
    let max_size = crate::base::podspec::quantity::parse(log_max_size)
        .ok()
        .and_then(|q| q.checked_value())
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| {
            ConfigError::invalid(
                "containerLogMaxSize",
                format!("{log_max_size:?} is not a size in bytes"),
            )
        })?;
    let workers = match f.container_log_max_workers {
        Some(n) => u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
            ConfigError::invalid(
                "containerLogMaxWorkers",
                format!("{n} must be greater than or equal to 1"),
            )
        })?,
        None => d.container_log_max_workers,
    };
    let interval = duration(
        f.container_log_monitor_interval.as_deref(),
        "containerLogMonitorInterval",
    )?
    .unwrap_or(d.container_log_monitor_interval);
    if interval < MIN_CONTAINER_LOG_MONITOR_INTERVAL {
        return Err(ConfigError::invalid(
            "containerLogMonitorInterval",
            format!(
                "{} must be a positive time duration greater than or equal to 3s",
                super::format_go_duration(interval)
            ),
        ));
    }
    Ok(GcSettings {
        image_gc_high_threshold_percent: high,
        image_gc_low_threshold_percent: low,
        image_minimum_gc_age: min_age,
        image_maximum_gc_age: max_age,
        container_log_max_size_bytes: max_size,
        container_log_max_files: log_max_files,
        container_log_max_workers: workers,
        container_log_monitor_interval: interval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::SectionError;

    fn merge(args: &[&str], file: &str) -> Result<GcSettings, SectionError> {
        let (flags, f) = crate::config::tests::flags_and_file(args, file)?;
        Ok(gc_settings(&flags, &f, "10Mi", 5)?)
    }

    #[test]
    fn defaults_are_upstreams() {
        let s = merge(&[], "").unwrap();
        assert_eq!(s, GcSettings::default());
        assert_eq!(s.container_log_max_size_bytes, 10 * 1024 * 1024);
    }

    #[test]
    fn flags_win_over_the_file() {
        let s = merge(
            &[
                "--image-gc-high-threshold=70",
                "--image-gc-low-threshold=60",
                "--minimum-image-ttl-duration=5m",
            ],
            r#"{"imageGCHighThresholdPercent": 90, "imageGCLowThresholdPercent": 10,
                "imageMinimumGCAge": "1m", "imageMaximumGCAge": "1h",
                "containerLogMaxWorkers": 3, "containerLogMonitorInterval": "4s"}"#,
        )
        .unwrap();
        assert_eq!(s.image_gc_high_threshold_percent, 70);
        assert_eq!(s.image_gc_low_threshold_percent, 60);
        assert_eq!(s.image_minimum_gc_age, Duration::from_secs(300));
        assert_eq!(s.image_maximum_gc_age, Duration::from_secs(3600));
        assert_eq!(s.container_log_max_workers, 3);
        assert_eq!(s.container_log_monitor_interval, Duration::from_secs(4));
    }

    #[test]
    fn quantities() {
        for ok in ["10Mi", "1", "1.5Gi", "500k", "100M", "2Ei"] {
            assert_eq!(check_quantity(ok), Ok(()), "{ok}");
        }
        for bad in [
            "", "Mi", "10MB", "10mi", "1.2.3Mi", ".5Mi", "0", "0Mi", "-1Mi", "ten",
        ] {
            assert!(check_quantity(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_what_upstream_refuses() {
        for (args, file, needle) in [
            (
                &["--image-gc-high-threshold=101"][..],
                "",
                "between 0 and 100",
            ),
            (
                &[][..],
                r#"{"imageGCLowThresholdPercent": -1}"#,
                "between 0 and 100",
            ),
            (
                &["--image-gc-low-threshold=85"][..],
                "",
                "must be less than",
            ),
            (
                &[][..],
                r#"{"imageMinimumGCAge": "2m", "imageMaximumGCAge": "1m"}"#,
                "imageMaximumGCAge",
            ),
            (
                &[][..],
                r#"{"containerLogMaxWorkers": 0}"#,
                "containerLogMaxWorkers",
            ),
            (
                &[][..],
                r#"{"containerLogMonitorInterval": "2s"}"#,
                "greater than or equal to 3s",
            ),
            (
                &[][..],
                r#"{"imageMinimumGCAge": "soon"}"#,
                "imageMinimumGCAge",
            ),
        ] {
            let err = merge(args, file).unwrap_err();
            assert!(err.to_string().contains(needle), "{args:?} {file}: {err}");
        }
    }
}
