use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::kubelet::dra::state::{Device, DriverState};

fn report(device: &str, health: Health, timeout: Option<u64>) -> Report {
    Report {
        pool: "pool".to_string(),
        device: device.to_string(),
        health,
        timeout: timeout.map(Duration::from_secs),
        message: String::new(),
    }
}

fn key(device: &str) -> (String, String) {
    ("pool".to_string(), device.to_string())
}

#[test]
fn a_report_holds_for_its_timeout_and_then_reads_unknown() {
    let t0 = Instant::now();
    let mut cache = HealthCache::default();
    let changes = cache.update(
        "drv",
        vec![
            report("a", Health::Healthy, None),
            report("b", Health::Unhealthy, Some(5)),
        ],
        t0,
    );
    assert_eq!(changes.devices, vec![key("a"), key("b")]);
    let at = |secs| t0 + Duration::from_secs(secs);
    // (device, seconds later, health read)
    let table = [
        ("a", 0, Health::Healthy),
        ("a", 30, Health::Healthy),
        ("a", 31, Health::Unknown),
        ("b", 5, Health::Unhealthy),
        ("b", 6, Health::Unknown),
        ("never-reported", 0, Health::Unknown),
    ];
    for (device, later, want) in table {
        assert_eq!(
            cache.get("drv", "pool", device, at(later)).health,
            want,
            "{device} after {later}s"
        );
    }
    assert_eq!(cache.get("other", "pool", "a", t0).health, Health::Unknown);
}

#[test]
fn only_what_reads_differently_is_a_change_and_silent_devices_leave_after_their_timeout() {
    let t0 = Instant::now();
    let mut cache = HealthCache::default();
    cache.update(
        "drv",
        vec![
            report("a", Health::Healthy, None),
            report("b", Health::Healthy, Some(5)),
        ],
        t0,
    );
    // The same again: no change. b left out, still within its timeout: kept.
    let same = cache.update(
        "drv",
        vec![report("a", Health::Healthy, None)],
        t0 + Duration::from_secs(3),
    );
    assert_eq!(same, Changes::default());
    assert_eq!(
        cache
            .get("drv", "pool", "b", t0 + Duration::from_secs(4))
            .health,
        Health::Healthy
    );
    // a turns unhealthy; b has not been reported for 6 s: dropped, a change to Unknown.
    let later = cache.update(
        "drv",
        vec![report("a", Health::Unhealthy, None)],
        t0 + Duration::from_secs(6),
    );
    assert_eq!(later.devices, vec![key("a"), key("b")]);
    // A new timeout alone is a change too.
    let timeout = cache.update(
        "drv",
        vec![report("a", Health::Unhealthy, Some(60))],
        t0 + Duration::from_secs(7),
    );
    assert_eq!(timeout.devices, vec![key("a")]);
}

#[test]
fn a_driver_cannot_make_the_cache_hold_more_than_the_cap() {
    let t0 = Instant::now();
    let mut cache = HealthCache::default();
    let flood: Vec<Report> = (0..MAX_DEVICES_PER_DRIVER + 10)
        .map(|i| report(&format!("d{i}"), Health::Healthy, None))
        .collect();
    let changes = cache.update("drv", flood, t0);
    assert_eq!(changes.ignored, 10);
    assert_eq!(changes.devices.len(), MAX_DEVICES_PER_DRIVER);
    // Known devices are still updated.
    cache.update("drv", vec![report("d0", Health::Unhealthy, None)], t0);
    assert_eq!(cache.get("drv", "pool", "d0", t0).health, Health::Unhealthy);
}

#[test]
fn clearing_a_driver_makes_its_devices_unknown_and_names_those_that_changed() {
    let t0 = Instant::now();
    let mut cache = HealthCache::default();
    cache.update(
        "drv",
        vec![
            report("a", Health::Healthy, None),
            report("u", Health::Unknown, None),
        ],
        t0,
    );
    assert_eq!(cache.clear_driver("drv", t0), vec![key("a")]);
    assert_eq!(cache.get("drv", "pool", "a", t0).health, Health::Unknown);
    assert!(cache.clear_driver("drv", t0).is_empty());
}

#[test]
fn wire_values_map_to_the_apis_words() {
    for (wire, want) in [
        (0, "Unknown"),
        (1, "Healthy"),
        (2, "Unhealthy"),
        (7, "Unknown"),
    ] {
        assert_eq!(Health::from_wire(wire).as_str(), want);
    }
}

fn device(pool: &str, name: &str, requests: &[&str], cdi: &[&str]) -> Device {
    Device {
        pool_name: pool.to_string(),
        device_name: name.to_string(),
        share_id: None,
        request_names: requests.iter().map(|r| r.to_string()).collect(),
        cdi_device_ids: cdi.iter().map(|c| c.to_string()).collect(),
    }
}

fn claim(devices: Vec<Device>) -> ClaimInfo {
    let mut info = ClaimInfo::default();
    info.drivers.insert(
        "drv".to_string(),
        DriverState {
            devices,
            skip_node_operations: Vec::new(),
        },
    );
    info
}

fn ids(status: &Option<ResourceStatus>) -> Vec<(String, String)> {
    status
        .iter()
        .flat_map(|s| s.resources.iter().flatten())
        .map(|r| (r.resource_id.clone(), r.health.clone().unwrap_or_default()))
        .collect()
}

#[test]
fn a_claims_status_names_its_devices_by_cdi_id_or_driver_pool_and_device() {
    let info = claim(vec![
        device(
            "p",
            "gpu-0",
            &["gpu"],
            &["vendor.com/gpu=gpu-0", "vendor.com/gpu=extra"],
        ),
        device("p", "gpu-1", &["gpu/fast"], &[]),
        device("p", "nic-0", &["nic"], &["vendor.com/nic=nic-0"]),
        device("p", "dup", &["gpu"], &["vendor.com/gpu=gpu-0"]),
        device("p", "any", &[], &["vendor.com/any=any"]),
    ]);
    let health = |_: &str, _: &str, device: &str| Reading {
        health: if device == "gpu-0" {
            Health::Healthy
        } else {
            Health::Unknown
        },
        message: String::new(),
    };
    // (container's request, entry name, resources)
    type Row<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>);
    let table: [Row; 3] = [
        (
            "",
            "claim:c",
            vec![
                ("vendor.com/gpu=gpu-0", "Healthy"),
                ("drv/p/gpu-1", "Unknown"),
                ("vendor.com/nic=nic-0", "Unknown"),
                ("vendor.com/any=any", "Unknown"),
            ],
        ),
        (
            "gpu",
            "claim:c/gpu",
            vec![
                ("vendor.com/gpu=gpu-0", "Healthy"),
                ("drv/p/gpu-1", "Unknown"),
                ("vendor.com/any=any", "Unknown"),
            ],
        ),
        (
            "nic",
            "claim:c/nic",
            vec![
                ("vendor.com/nic=nic-0", "Unknown"),
                ("vendor.com/any=any", "Unknown"),
            ],
        ),
    ];
    for (request, name, want) in table {
        let status = claim_status("c", request, &info, &health);
        assert_eq!(status.as_ref().map(|s| s.name.as_str()), Some(name));
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(ids(&status), want, "request {request:?}");
    }
    assert!(claim_status("c", "", &claim(Vec::new()), &health).is_none());
}

#[test]
fn a_message_is_kept_cut_to_the_apis_limit_and_a_new_one_is_a_change() {
    let t0 = Instant::now();
    let mut cache = HealthCache::default();
    let with = |message: &str| Report {
        message: message.to_string(),
        ..report("a", Health::Unhealthy, None)
    };
    cache.update("drv", vec![with("ECC errors")], t0);
    assert_eq!(cache.get("drv", "pool", "a", t0).message, "ECC errors");
    let changed = cache.update("drv", vec![with("ECC errors, again")], t0);
    assert_eq!(changed.devices, vec![key("a")]);
    // Stale: Unknown, and the message goes with the report.
    assert_eq!(
        cache.get("drv", "pool", "a", t0 + Duration::from_secs(31)),
        Reading {
            health: Health::Unknown,
            message: String::new()
        }
    );
    // Cut at 1021 bytes plus "...", never inside a character (é is two bytes).
    let long = "é".repeat(600);
    let cut = truncate_message(long);
    assert_eq!(cut.len(), 1020 + 3);
    assert!(cut.ends_with("..."));
    assert_eq!(truncate_message("short".into()), "short");
    let exact = "x".repeat(MAX_MESSAGE_BYTES);
    assert_eq!(truncate_message(exact.clone()), exact);
    // The message reaches the status entry; none when the driver gave none.
    let info = claim(vec![device("pool", "a", &[], &[])]);
    let read = |_: &str, _: &str, _: &str| cache.get("drv", "pool", "a", t0);
    let status = claim_status("c", "", &info, &read).unwrap();
    let row = &status.resources.unwrap()[0];
    assert_eq!(row.message.as_deref(), Some("ECC errors, again"));
    let quiet = |_: &str, _: &str, _: &str| Reading {
        health: Health::Healthy,
        message: String::new(),
    };
    let status = claim_status("c", "", &info, &quiet).unwrap();
    assert_eq!(status.resources.unwrap()[0].message, None);
}
