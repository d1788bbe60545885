//! `spec.readinessGates`: conditions that others (a load balancer controller, a test) set in
//! the pod's status through the API, and without which the kubelet does not call the pod
//! Ready, as upstream's `GeneratePodReadyCondition` decides. The node never sets these
//! conditions; it only reads them from the pod the API server holds.

use k8s_openapi::api::core::v1::Pod;

/// The Ready condition's reason while a readiness gate holds it back (upstream's).
pub(crate) const REASON: &str = "ReadinessGatesNotReady";

/// Each readiness gate's condition type with the status of that condition in the pod's status
/// (None when it does not exist), in the spec's order. Two pods whose gates read the same here
/// have the same readiness as far as the gates go.
pub(crate) fn gate_states(pod: &Pod) -> Vec<(&str, Option<&str>)> {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_deref());
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|gate| {
            let status = conditions
                .unwrap_or_default()
                .iter()
                .find(|c| c.type_ == gate.condition_type)
                .map(|c| c.status.as_str());
            (gate.condition_type.as_str(), status)
        })
        .collect()
}

/// Why the gates hold the pod back, in upstream's words (one clause per gate whose condition
/// is missing or not "True", joined by ", "); None when every gate is satisfied.
pub(crate) fn unready_message(pod: &Pod) -> Option<String> {
    let clauses: Vec<String> = gate_states(pod)
        .into_iter()
        .filter_map(|(gate, status)| match status {
            None => Some(format!(
                "corresponding condition of pod readiness gate \"{gate}\" does not exist."
            )),
            Some("True") => None,
            Some(other) => Some(format!(
                "the status of pod readiness gate \"{gate}\" is not \"True\", but {other}"
            )),
        })
        .collect();
    (!clauses.is_empty()).then(|| clauses.join(", "))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodReadinessGate, PodSpec, PodStatus};

    use super::*;

    fn pod(gates: &[&str], conditions: &[(&str, &str)]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                readiness_gates: Some(
                    gates
                        .iter()
                        .map(|g| PodReadinessGate {
                            condition_type: g.to_string(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| PodCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Upstream's messages, case by case (its `TestGeneratePodReadyCondition` table).
    #[test]
    fn the_message_names_each_gate_that_holds_the_pod_back() {
        // (gates, conditions in the status, the message)
        type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: [Case; 6] = [
            (&[], &[], None),
            (
                &["gate1"],
                &[],
                Some(r#"corresponding condition of pod readiness gate "gate1" does not exist."#),
            ),
            (
                &["gate1"],
                &[("gate1", "False")],
                Some(r#"the status of pod readiness gate "gate1" is not "True", but False"#),
            ),
            (&["gate1"], &[("gate1", "True")], None),
            (
                &["gate1", "gate2"],
                &[("gate1", "True")],
                Some(r#"corresponding condition of pod readiness gate "gate2" does not exist."#),
            ),
            (
                &["gate1", "gate2"],
                &[("gate1", "Unknown"), ("Ready", "True")],
                Some(concat!(
                    r#"the status of pod readiness gate "gate1" is not "True", but Unknown, "#,
                    r#"corresponding condition of pod readiness gate "gate2" does not exist."#
                )),
            ),
        ];
        for (gates, conditions, want) in cases {
            let p = pod(gates, conditions);
            assert_eq!(
                unready_message(&p).as_deref(),
                want,
                "{gates:?} {conditions:?}"
            );
        }
        let mut bare = pod(&["gate1"], &[]);
        bare.status = None;
        assert!(unready_message(&bare).is_some(), "no status at all");
    }

    #[test]
    fn gate_states_read_only_the_gates_conditions() {
        let p = pod(&["b", "a"], &[("a", "True"), ("Ready", "False")]);
        assert_eq!(gate_states(&p), vec![("b", None), ("a", Some("True"))]);
    }
}
