//! Upstream's `dra_*` metrics: the families recorded into (`base::metrics::KUBELET`) and the
//! `dra_resource_claims_in_use` gauge, computed from the claim cache when `/metrics` is read
//! (as upstream's collector does), so a driver that is gone leaves no stale series.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::base::metrics::{Family, KUBELET};

use super::state::ClaimInfo;

/// The `operation_name` of a pod's prepare (upstream's `PrepareResources`).
pub(crate) const PREPARE_OPERATION: &str = "PrepareResources";
/// The `operation_name` of a pod's unprepare (upstream's `UnprepareResources`).
pub(crate) const UNPREPARE_OPERATION: &str = "UnprepareResources";
/// The `driver_name` of the count over all drivers (upstream's
/// `DRAResourceClaimsInUseAnyDriver`).
pub(crate) const ANY_DRIVER: &str = "<any>";
/// The `dra.v1` service's path: gRPC's full method name is this and the method.
const SERVICE_PATH: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/";

/// Records one pod's prepare or unprepare.
pub(crate) fn record_operation(operation: &str, took: Duration, failed: bool) {
    let is_error = if failed { "true" } else { "false" };
    KUBELET
        .dra_operations_duration
        .observe(&[is_error, operation], took.as_secs_f64());
}

/// Records one driver call (`method` as `NodePrepareResources`) and how it ended.
pub(crate) fn record_call(driver: &str, method: &str, took: Duration, code: tonic::Code) {
    let full = format!("{SERVICE_PATH}{method}");
    KUBELET
        .dra_grpc_operations_duration
        .observe(&[driver, grpc_code_name(code), &full], took.as_secs_f64());
}

/// Counts the drivers whose call `skipNodeOperations` left out.
pub(crate) fn record_skips(prepare: bool, drivers: &[String]) {
    let family = if prepare {
        &KUBELET.dra_node_prepare_skips
    } else {
        &KUBELET.dra_node_unprepare_skips
    };
    for driver in drivers {
        family.inc(&[driver]);
    }
}

/// A gRPC status code as Go's `codes.Code` prints it (the `grpc_status_code` label and the
/// `rpc error: code = …` of upstream's messages); tonic's own names differ for two.
pub(crate) fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// The prepared claims by driver, and all of them under [`ANY_DRIVER`] (pure; upstream's
/// `claimsInUse`). A claim restored from the checkpoint counts once a pod prepared it again,
/// as upstream's.
pub(crate) fn claims_in_use<'a>(
    claims: impl IntoIterator<Item = &'a ClaimInfo>,
) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::from([(ANY_DRIVER.to_string(), 0)]);
    for info in claims.into_iter().filter(|c| c.prepared) {
        *counts.entry(ANY_DRIVER.to_string()).or_default() += 1;
        for driver in info.drivers.keys() {
            *counts.entry(driver.clone()).or_default() += 1;
        }
    }
    counts
}

/// `dra_resource_claims_in_use` in the text format.
pub(crate) fn render_claims_in_use(counts: &BTreeMap<String, u64>) -> String {
    let family = Family::gauge(
        "dra_resource_claims_in_use",
        "ResourceClaims prepared on the node, by driver, and over all drivers as driver_name \
         <any> (a claim with devices of two drivers counts for each, and once for <any>).",
        &["driver_name"],
    );
    for (driver, count) in counts {
        family.set(&[driver], *count as f64);
    }
    let mut out = String::new();
    family.render(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::dra::state::DriverState;

    #[test]
    fn status_codes_print_as_gos() {
        for (code, want) in [
            (tonic::Code::Ok, "OK"),
            (tonic::Code::Cancelled, "Canceled"),
            (tonic::Code::DeadlineExceeded, "DeadlineExceeded"),
            (tonic::Code::Unavailable, "Unavailable"),
            (tonic::Code::Unimplemented, "Unimplemented"),
        ] {
            assert_eq!(grpc_code_name(code), want, "{code:?}");
        }
    }

    #[test]
    fn claims_in_use_counts_prepared_claims_by_driver_and_over_all() {
        let info = |uid: &str, drivers: &[&str], prepared: bool| ClaimInfo {
            claim_uid: uid.into(),
            drivers: drivers
                .iter()
                .map(|d| (d.to_string(), DriverState::default()))
                .collect(),
            prepared,
            ..Default::default()
        };
        type Case<'a> = (&'a [ClaimInfo], &'a [(&'a str, u64)]);
        let cases: &[Case] = &[
            (&[], &[("<any>", 0)]),
            (&[info("1", &["a"], false)], &[("<any>", 0)]),
            (
                &[
                    info("1", &["a"], true),
                    info("2", &["a", "b"], true),
                    info("3", &["b"], false),
                ],
                &[("<any>", 2), ("a", 2), ("b", 1)],
            ),
        ];
        for (claims, want) in cases {
            let want: BTreeMap<String, u64> =
                want.iter().map(|(d, n)| (d.to_string(), *n)).collect();
            assert_eq!(claims_in_use(claims.iter()), want);
        }
    }

    #[test]
    fn claims_in_use_renders_as_a_gauge_per_driver() {
        let counts = BTreeMap::from([("<any>".to_string(), 1), ("d.example.com".to_string(), 1)]);
        let page = render_claims_in_use(&counts);
        assert!(
            page.ends_with(
                "# TYPE dra_resource_claims_in_use gauge\n\
                 dra_resource_claims_in_use{driver_name=\"<any>\"} 1\n\
                 dra_resource_claims_in_use{driver_name=\"d.example.com\"} 1\n"
            ),
            "{page}"
        );
    }

    #[test]
    fn the_buckets_are_upstreams() {
        // What client_golang v1.24.0's ExponentialBucketsRange(.1, 40, 15) gives, printed by Go
        // with strconv.FormatFloat(b, 'g', -1, 64), as its text format prints `le`.
        let want = [
            "0.1",
            "0.1534127404634391",
            "0.23535468936502524",
            "0.36106407876409946",
            "0.5539182980610752",
            "0.849781240983936",
            "1.303672689737678",
            "1.9999999999999993",
            "3.0682548092687805",
            "4.7070937873005025",
            "7.221281575281985",
            "11.078365961221499",
            "16.995624819678714",
            "26.07345379475354",
            "39.99999999999997",
            "+Inf",
        ];
        record_operation("BucketsTest", Duration::from_secs(1), false);
        let mut page = String::new();
        KUBELET.dra_operations_duration.render(&mut page);
        let prefix = "dra_operations_duration_seconds_bucket{is_error=\"false\",operation_name=\"BucketsTest\",le=\"";
        let got: Vec<&str> = page
            .lines()
            .filter_map(|l| l.strip_prefix(prefix)?.split('"').next())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn calls_and_operations_are_recorded_under_upstreams_labels() {
        record_call(
            "metrics-test.example.com",
            "NodePrepareResources",
            Duration::from_millis(200),
            tonic::Code::Ok,
        );
        record_operation(PREPARE_OPERATION, Duration::from_millis(300), true);
        let mut page = String::new();
        KUBELET.dra_grpc_operations_duration.render(&mut page);
        KUBELET.dra_operations_duration.render(&mut page);
        for want in [
            "dra_grpc_operations_duration_seconds_bucket{driver_name=\"metrics-test.example.com\",grpc_status_code=\"OK\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources\",le=\"0.23535468936502524\"} 1\n",
            "dra_operations_duration_seconds_count{is_error=\"true\",operation_name=\"PrepareResources\"} ",
        ] {
            assert!(page.contains(want), "{want} missing from:\n{page}");
        }
    }
}
