//! Eviction thresholds (`evictionHard`): `memory.available<100Mi`, `nodefs.available<10%`.
//!
//! Parsed here so the configuration can refuse a bad one at start; node allocatable subtracts
//! the memory and node filesystem ones, as upstream does.

use std::collections::BTreeMap;

use super::quantity::{self, Quantity, QuantityError};

/// A threshold: an absolute amount, or a percentage of the resource's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    Quantity(Quantity),
    Percent(f64),
}

impl Threshold {
    /// The amount this threshold stands for on a resource of `capacity` units (rounded down,
    /// as upstream's `int64(float64(capacity) * percentage)`).
    pub fn amount(&self, capacity: i64) -> i64 {
        match self {
            Threshold::Quantity(q) => q.value(),
            Threshold::Percent(p) => ((capacity as f64) * p / 100.0) as i64,
        }
    }
}

/// The signals upstream's eviction manager knows.
pub const SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// Upstream's `evictionHard` when none is configured (a configured map replaces it whole).
pub fn default_eviction_hard() -> BTreeMap<String, Threshold> {
    let q = |s: &str| Threshold::Quantity(quantity::parse(s).expect("a valid built-in quantity"));
    BTreeMap::from([
        ("memory.available".to_string(), q("100Mi")),
        ("nodefs.available".to_string(), Threshold::Percent(10.0)),
        ("nodefs.inodesFree".to_string(), Threshold::Percent(5.0)),
        ("imagefs.available".to_string(), Threshold::Percent(15.0)),
    ])
}

/// Why an eviction threshold is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    #[error("{signal:?} is not an eviction signal (one of {})", SIGNALS.join(", "))]
    UnknownSignal { signal: String },
    #[error("{value:?} is not a percentage")]
    NotPercentage { value: String },
    #[error("{value:?} must be between 0% and 100%")]
    PercentOutOfRange { value: String },
    #[error("{value:?}: {source}")]
    Quantity {
        value: String,
        source: QuantityError,
    },
    #[error("{value:?} must not be negative")]
    Negative { value: String },
    #[error("{item:?} is not signal<value")]
    NotSignalValue { item: String },
}

/// The message as text, for the configuration's errors (`ConfigError::invalid` takes a
/// `String`; its callers in `config` can move to `.to_string()` and this can go).
/// One `signal: value` entry of the config file's map.
pub fn parse_signal_value(signal: &str, value: &str) -> Result<Threshold, ThresholdError> {
    if !SIGNALS.contains(&signal) {
        return Err(ThresholdError::UnknownSignal {
            signal: signal.to_string(),
        });
    }
    let value = value.trim();
    if let Some(pct) = value.strip_suffix('%') {
        let p: f64 = pct
            .trim()
            .parse()
            .map_err(|_| ThresholdError::NotPercentage {
                value: value.to_string(),
            })?;
        if !(0.0..=100.0).contains(&p) {
            return Err(ThresholdError::PercentOutOfRange {
                value: value.to_string(),
            });
        }
        return Ok(Threshold::Percent(p));
    }
    let q = quantity::parse(value).map_err(|source| ThresholdError::Quantity {
        value: value.to_string(),
        source,
    })?;
    if q.is_negative() {
        return Err(ThresholdError::Negative {
            value: value.to_string(),
        });
    }
    Ok(Threshold::Quantity(q))
}

/// The flag form: `memory.available<100Mi,nodefs.available<10%`.
pub fn parse_flag(text: &str) -> Result<BTreeMap<String, Threshold>, ThresholdError> {
    let mut out = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (signal, value) =
            item.split_once('<')
                .ok_or_else(|| ThresholdError::NotSignalValue {
                    item: item.to_string(),
                })?;
        let signal = signal.trim();
        out.insert(signal.to_string(), parse_signal_value(signal, value)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms() {
        let m = parse_flag("memory.available<1Gi, nodefs.available<7.5%").unwrap();
        assert_eq!(m["memory.available"].amount(0), 1 << 30);
        assert_eq!(m["nodefs.available"], Threshold::Percent(7.5));
        assert_eq!(m["nodefs.available"].amount(1000), 75);
        assert!(parse_flag("memory.available=1Gi").is_err());
        assert!(
            parse_flag("memory.free<1Gi")
                .unwrap_err()
                .to_string()
                .contains("not an eviction signal")
        );
        assert!(parse_signal_value("pid.available", "120%").is_err());
        assert!(parse_signal_value("pid.available", "-1").is_err());
        assert!(parse_signal_value("pid.available", "x%").is_err());
    }

    #[test]
    fn defaults_are_upstreams() {
        let d = default_eviction_hard();
        assert_eq!(d.len(), 4);
        assert_eq!(d["memory.available"].amount(0), 100 << 20);
        assert_eq!(d["imagefs.available"], Threshold::Percent(15.0));
    }
}
