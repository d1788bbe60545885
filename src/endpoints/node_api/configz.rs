//! `/configz`: the configuration in effect, in upstream's shape
//! (`{"kubeletconfig": {<KubeletConfiguration v1beta1 fields>}}`), for the fields Deckhand has.

use serde_json::{Value, json};

use crate::config::{AuthorizationMode, Config, format_go_duration};

/// The `/configz` document for `c`.
pub(crate) fn configz(c: &Config) -> Value {
    let d = |x: std::time::Duration| format_go_duration(x);
    let path = |p: &std::path::Path| p.display().to_string();
    let s = &c.server;
    let mut kc = json!({
        "enableServer": s.enable_server,
        "staticPodPath": c.static_pod_path.as_deref().map(path).unwrap_or_default(),
        "podLogsDir": path(&c.pod_logs_dir),
        "syncFrequency": d(c.sync_frequency),
        "fileCheckFrequency": d(c.file_check_frequency),
        "httpCheckFrequency": d(c.http_check_frequency),
        "staticPodURL": c.static_pod_url.clone().unwrap_or_default(),
        "address": c.address.to_string(),
        "port": c.port,
        "readOnlyPort": c.read_only_port,
        "healthzPort": c.healthz_port,
        "healthzBindAddress": c.healthz_bind_address.to_string(),
        "tlsCertFile": s.tls_files.as_ref().map(|(cert, _)| path(cert)).unwrap_or_default(),
        "tlsPrivateKeyFile": s.tls_files.as_ref().map(|(_, key)| path(key)).unwrap_or_default(),
        "tlsMinVersion": match s.tls_min_version {
            crate::config::server::TlsMinVersion::Tls12 => "VersionTLS12",
            crate::config::server::TlsMinVersion::Tls13 => "VersionTLS13",
        },
        "tlsCipherSuites": s.tls_cipher_suites,
        "rotateCertificates": c.rotate_certificates,
        "serverTLSBootstrap": s.server_tls_bootstrap,
        "authentication": {
            "x509": {"clientCAFile": s.client_ca_file.as_deref().map(path).unwrap_or_default()},
            "webhook": {"enabled": s.token_webhook_enabled, "cacheTTL": d(s.token_cache_ttl)},
            "anonymous": {"enabled": s.anonymous_enabled},
        },
        "authorization": {
            "mode": match s.authorization_mode {
                AuthorizationMode::AlwaysAllow => "AlwaysAllow",
                AuthorizationMode::Webhook => "Webhook",
            },
            "webhook": {
                "cacheAuthorizedTTL": d(s.authorized_ttl),
                "cacheUnauthorizedTTL": d(s.unauthorized_ttl),
            },
        },
    });
    let more = json!({
        "clusterDomain": c.cluster_domain.clone().unwrap_or_default(),
        "clusterDNS": c.cluster_dns.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "allowedUnsafeSysctls": c.allowed_unsafe_sysctls,
        "runtimeRequestTimeout": d(c.runtime_request_timeout),
        "cgroupRoot": c.cgroup_root,
        "cgroupsPerQOS": c.cgroups_per_qos,
        "cgroupDriver": c.cgroup_driver.as_str(),
        "resolvConf": path(&c.resolv_conf),
        "maxPods": c.max_pods,
        "podPidsLimit": c.pod_pids_limit,
        "nodeStatusUpdateFrequency": d(c.node_status_update_frequency),
        "nodeStatusReportFrequency": d(c.cluster.node_status_report_frequency),
        "nodeLeaseDurationSeconds": c.cluster.node_lease_duration_seconds,
        "nodeStatusMaxImages": c.cluster.node_status_max_images,
        "serializeImagePulls": c.serialize_image_pulls,
        "containerLogMaxSize": c.container_log_max_size,
        "containerLogMaxFiles": c.container_log_max_files,
        "crashLoopBackOff": {"maxContainerRestartPeriod": d(c.crash_loop_max_backoff)},
        "kubeAPIQPS": c.cluster.kube_api_qps,
        "kubeAPIBurst": c.cluster.kube_api_burst,
        "eventRecordQPS": c.cluster.event_record_qps,
        "eventBurst": c.cluster.event_burst,
        "registerNode": c.cluster.register_node,
        "containerRuntimeEndpoint": c.container_runtime_endpoint,
        "shutdownGracePeriod": d(c.shutdown.grace_period),
        "shutdownGracePeriodCriticalPods": d(c.shutdown.grace_period_critical_pods),
        "volumeStatsAggPeriod": d(c.volume_stats_agg_period),
        "logging": {"format": match c.logging_format {
            crate::config::LoggingFormat::Text => "text",
            crate::config::LoggingFormat::Json => "json",
        }},
    });
    if let (Some(obj), Value::Object(rest)) = (kc.as_object_mut(), more) {
        obj.extend(rest);
    }
    let h = &c.hardening;
    if let (Some(obj), Value::Object(rest)) = (
        kc.as_object_mut(),
        json!({
            "seccompDefault": h.seccomp_default,
            "enableDebuggingHandlers": h.debugging_handlers,
            "enableSystemLogHandler": h.system_log_handler,
            "protectKernelDefaults": h.protect_kernel_defaults,
        }),
    ) {
        obj.extend(rest);
    }
    if let Some(n) = c.max_parallel_image_pulls
        && let Some(obj) = kc.as_object_mut()
    {
        obj.insert("maxParallelImagePulls".into(), json!(n));
    }
    if !c.shutdown.by_pod_priority.is_empty()
        && let Some(obj) = kc.as_object_mut()
    {
        let buckets: Vec<Value> = c
            .shutdown
            .by_pod_priority
            .iter()
            .map(|b| json!({"priority": b.priority, "shutdownGracePeriodSeconds": b.grace_seconds}))
            .collect();
        obj.insert("shutdownGracePeriodByPodPriority".into(), json!(buckets));
    }
    if let Some(ep) = &c.image_service_endpoint
        && let Some(obj) = kc.as_object_mut()
    {
        obj.insert("imageServiceEndpoint".into(), json!(ep));
    }
    json!({ "kubeletconfig": kc })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn upstreams_shape() {
        let flags = crate::config::Flags::try_parse_from([
            "deckhand",
            "--hostname-override=n1",
            "--port=11250",
            "--authorization-mode=AlwaysAllow",
        ])
        .unwrap();
        let config = crate::config::load_from(&flags, None, "").unwrap();
        let v = configz(&config);
        let kc = &v["kubeletconfig"];
        assert_eq!(kc["port"], 11250);
        assert_eq!(kc["syncFrequency"], "1m0s");
        assert_eq!(kc["authorization"]["mode"], "AlwaysAllow");
        assert_eq!(kc["authentication"]["webhook"]["cacheTTL"], "2m0s");
        assert_eq!(kc["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(v.as_object().unwrap().len(), 1);
    }
}
