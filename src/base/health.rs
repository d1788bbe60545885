//! Named health checks, evaluated when `/healthz` is asked.
//!
//! A component registers a check once (the PLEG: "relisted within 3 minutes"; the runtime: "the
//! last CRI call got an answer") and the endpoint reports each by name, like upstream's
//! `[+]name ok` / `[-]name failed: reason` lines, except that the reason is shown, not withheld.

use std::sync::{Arc, RwLock};

/// Why a check fails, in words for `/healthz`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CheckFailure(pub String);

impl From<String> for CheckFailure {
    fn from(reason: String) -> Self {
        CheckFailure(reason)
    }
}

impl From<&str> for CheckFailure {
    fn from(reason: &str) -> Self {
        CheckFailure(reason.to_string())
    }
}

/// A check's answer: passed (with a note for the verbose report, or none), or why not.
pub type CheckResult = Result<Option<String>, CheckFailure>;

type Check = Arc<dyn Fn() -> CheckResult + Send + Sync>;

/// The set of checks; cheap to clone.
#[derive(Clone, Default)]
pub struct Health {
    checks: Arc<RwLock<Vec<(String, Check)>>>,
}

/// The outcome of every check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    pub results: Vec<(String, Result<(), CheckFailure>)>,
    /// What passing checks had to say (the PLEG's mode), shown in the verbose report.
    pub notes: Vec<(String, String)>,
}

impl HealthReport {
    pub fn healthy(&self) -> bool {
        self.results.iter().all(|(_, r)| r.is_ok())
    }

    /// Upstream's verbose layout: one `[+]`/`[-]` line per check, then a verdict.
    pub fn render(&self, verbose: bool) -> String {
        if self.healthy() && !verbose {
            return "ok".to_string();
        }
        let mut text = String::new();
        for (name, result) in &self.results {
            match result {
                Ok(()) => match self.notes.iter().find(|(n, _)| n == name) {
                    Some((_, note)) => text.push_str(&format!("[+]{name} ok: {note}\n")),
                    None => text.push_str(&format!("[+]{name} ok\n")),
                },
                Err(reason) => text.push_str(&format!("[-]{name} failed: {reason}\n")),
            }
        }
        text.push_str(if self.healthy() {
            "healthz check passed\n"
        } else {
            "healthz check failed\n"
        });
        text
    }
}

impl Health {
    /// Adds (or replaces) a named check.
    pub fn register(
        &self,
        name: &str,
        check: impl Fn() -> Result<(), CheckFailure> + Send + Sync + 'static,
    ) {
        self.register_noted(name, move || check().map(|()| None));
    }

    /// Adds (or replaces) a named check whose pass may carry a note for the verbose report.
    pub fn register_noted(
        &self,
        name: &str,
        check: impl Fn() -> CheckResult + Send + Sync + 'static,
    ) {
        let mut checks = self.checks.write().unwrap_or_else(|e| e.into_inner());
        checks.retain(|(n, _)| n != name);
        checks.push((name.to_string(), Arc::new(check)));
    }

    /// Runs every check.
    pub fn report(&self) -> HealthReport {
        let checks = self
            .checks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut results = vec![("ping".to_string(), Ok(()))];
        let mut notes = Vec::new();
        for (name, check) in &checks {
            let result = check();
            if let Ok(Some(note)) = &result {
                notes.push((name.clone(), note.clone()));
            }
            results.push((name.clone(), result.map(|_| ())));
        }
        HealthReport { results, notes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_failing_checks() {
        let health = Health::default();
        health.register("pleg", || Ok(()));
        assert_eq!(health.report().render(false), "ok");
        health.register("runtime", || Err("containerd is not answering".into()));
        let report = health.report();
        assert!(!report.healthy());
        let text = report.render(false);
        assert!(text.contains("[+]pleg ok"), "{text}");
        assert!(
            text.contains("[-]runtime failed: containerd is not answering"),
            "{text}"
        );
        assert!(text.ends_with("healthz check failed\n"), "{text}");
    }
}
