//! The kernel tunables upstream's container manager checks at start (`setupKernelTunables`),
//! and what `protectKernelDefaults` makes of them.
//!
//! Upstream's kubelet, with `protectKernelDefaults: true`, refuses to start when one of them
//! differs from its value; with `false` (the default) it writes its values into `/proc/sys`.
//! Deckhand does the first, and never the second: a node agent started on a developer's
//! machine or a test host must not switch on `kernel.panic_on_oops` behind its owner's back.
//! With `false` it says which differ, once, and leaves them.

use std::path::Path;

/// `(path under /proc/sys, the value upstream's kubelet wants)`, as upstream lists them.
pub(crate) const KERNEL_TUNABLES: [(&str, i64); 6] = [
    ("vm/overcommit_memory", 1),
    ("vm/panic_on_oom", 0),
    ("kernel/panic", 10),
    ("kernel/panic_on_oops", 1),
    ("kernel/keys/root_maxkeys", 1_000_000),
    ("kernel/keys/root_maxbytes", 25_000_000),
];

/// Where the kernel's tunables are read from.
pub(crate) const PROC_SYS: &str = "/proc/sys";

/// One tunable as read: its value, or why it could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    Value(i64),
    Unreadable(String),
}

/// One tunable that is not as upstream wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The path under `/proc/sys` (`vm/overcommit_memory`), as upstream names it.
    pub flag: &'static str,
    pub expected: i64,
    pub actual: Reading,
}

impl std::fmt::Display for Mismatch {
    /// Upstream's wording (`invalid kernel flag: …, expected value: …, actual value: …`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.actual {
            Reading::Value(actual) => write!(
                f,
                "invalid kernel flag: {}, expected value: {}, actual value: {actual}",
                self.flag, self.expected
            ),
            Reading::Unreadable(why) => {
                write!(f, "cannot read kernel flag {}: {why}", self.flag)
            }
        }
    }
}

/// `protectKernelDefaults: true` and the kernel is not as upstream's kubelet wants it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protectKernelDefaults is true and {}", join(.0))]
pub struct KernelDefaultsError(pub Vec<Mismatch>);

fn join(mismatches: &[Mismatch]) -> String {
    mismatches
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What start-up does about the tunables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KernelDecision {
    /// All as upstream wants them.
    Fine,
    /// `protectKernelDefaults: false`: they differ, and stay as they are (a warning).
    LeaveAlone(Vec<Mismatch>),
}

/// The decision on `readings` (one per [`KERNEL_TUNABLES`] entry, in its order): with
/// `protect`, any difference or unreadable tunable refuses the start, as upstream's
/// `KernelTunableError`; without, they are reported and left.
pub(crate) fn decide(
    readings: &[(&'static str, Reading)],
    protect: bool,
) -> Result<KernelDecision, KernelDefaultsError> {
    let mismatches: Vec<Mismatch> = KERNEL_TUNABLES
        .iter()
        .filter_map(|(flag, expected)| {
            let actual = readings
                .iter()
                .find(|(name, _)| name == flag)
                .map(|(_, reading)| reading.clone())
                .unwrap_or_else(|| Reading::Unreadable("not read".into()));
            (actual != Reading::Value(*expected)).then_some(Mismatch {
                flag,
                expected: *expected,
                actual,
            })
        })
        .collect();
    match (mismatches.is_empty(), protect) {
        (true, _) => Ok(KernelDecision::Fine),
        (false, true) => Err(KernelDefaultsError(mismatches)),
        (false, false) => Ok(KernelDecision::LeaveAlone(mismatches)),
    }
}

/// Reads every tunable of [`KERNEL_TUNABLES`] under `root` (`/proc/sys`).
pub(crate) fn read_tunables(root: &Path) -> Vec<(&'static str, Reading)> {
    KERNEL_TUNABLES
        .iter()
        .map(|(flag, _)| {
            let reading = match std::fs::read_to_string(root.join(flag)) {
                Ok(text) => match text.trim().parse::<i64>() {
                    Ok(n) => Reading::Value(n),
                    Err(_) => Reading::Unreadable(format!("{:?} is not a number", text.trim())),
                },
                Err(e) => Reading::Unreadable(e.to_string()),
            };
            (*flag, reading)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream() -> Vec<(&'static str, Reading)> {
        KERNEL_TUNABLES
            .iter()
            .map(|(flag, want)| (*flag, Reading::Value(*want)))
            .collect()
    }

    fn with(flag: &'static str, reading: Reading) -> Vec<(&'static str, Reading)> {
        let mut r = upstream();
        r.iter_mut().find(|(f, _)| *f == flag).unwrap().1 = reading;
        r
    }

    #[test]
    fn decisions() {
        let overcommit_0 = with("vm/overcommit_memory", Reading::Value(0));
        let panic_1 = with("kernel/panic", Reading::Value(1));
        let unreadable = with(
            "kernel/keys/root_maxbytes",
            Reading::Unreadable("No such file or directory".into()),
        );
        // (case, readings, protect, Ok(mismatches) or the refusal's text)
        type Case = (
            &'static str,
            Vec<(&'static str, Reading)>,
            bool,
            Result<usize, &'static str>,
        );
        let cases: Vec<Case> = vec![
            ("all as upstream, protected", upstream(), true, Ok(0)),
            ("all as upstream, unprotected", upstream(), false, Ok(0)),
            (
                "overcommit differs, protected",
                overcommit_0.clone(),
                true,
                Err(
                    "invalid kernel flag: vm/overcommit_memory, expected value: 1, actual value: 0",
                ),
            ),
            (
                "overcommit differs, unprotected",
                overcommit_0,
                false,
                Ok(1),
            ),
            (
                "panic differs, protected",
                panic_1,
                true,
                Err("invalid kernel flag: kernel/panic, expected value: 10, actual value: 1"),
            ),
            (
                "unreadable, protected",
                unreadable.clone(),
                true,
                Err("cannot read kernel flag kernel/keys/root_maxbytes"),
            ),
            ("unreadable, unprotected", unreadable, false, Ok(1)),
            ("nothing read, unprotected", vec![], false, Ok(6)),
        ];
        for (name, readings, protect, want) in cases {
            match (decide(&readings, protect), want) {
                (Ok(KernelDecision::Fine), Ok(0)) => {}
                (Ok(KernelDecision::LeaveAlone(m)), Ok(n)) if n > 0 => {
                    assert_eq!(m.len(), n, "{name}")
                }
                (Err(e), Err(text)) => {
                    let msg = e.to_string();
                    assert!(
                        msg.starts_with("protectKernelDefaults is true and "),
                        "{name}: {msg}"
                    );
                    assert!(msg.contains(text), "{name}: {msg}");
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn every_difference_is_named() {
        let mut readings = with("vm/overcommit_memory", Reading::Value(0));
        readings[3].1 = Reading::Value(0); // kernel/panic_on_oops
        let msg = decide(&readings, true).unwrap_err().to_string();
        assert!(msg.contains("vm/overcommit_memory") && msg.contains("kernel/panic_on_oops"));
        assert!(!msg.contains("vm/panic_on_oom"), "{msg}");
    }

    #[test]
    fn reads_from_a_root() {
        let dir = tempfile::tempdir().unwrap();
        for (flag, want) in KERNEL_TUNABLES {
            let path = dir.path().join(flag);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, format!("{want}\n")).unwrap();
        }
        assert_eq!(read_tunables(dir.path()), upstream());
        std::fs::write(dir.path().join("kernel/panic"), "x\n").unwrap();
        std::fs::remove_file(dir.path().join("vm/panic_on_oom")).unwrap();
        let read = read_tunables(dir.path());
        assert!(matches!(read[1].1, Reading::Unreadable(_)), "{read:?}");
        assert!(matches!(read[2].1, Reading::Unreadable(_)), "{read:?}");
    }
}
