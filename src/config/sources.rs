//! The static-pod sources' section: the manifest directory (`staticPodPath`) and the manifest
//! URL with its request headers (`staticPodURL`, `staticPodURLHeader`). How often each is
//! read is in the timing section (`fileCheckFrequency`, `httpCheckFrequency`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::ConfigError;
use super::file::KubeletConfigurationFile;
use super::flags::Flags;
use super::validate::{InvalidValue, invalid, pick};

/// Where static pods come from; `None` for a source that is off.
pub(super) struct Sources {
    pub static_pod_path: Option<PathBuf>,
    pub static_pod_url: Option<String>,
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
}

/// The sources. The URL is checked here rather than at the first fetch, so that a typo stops
/// the start instead of leaving the node without its static pods; the headers are checked
/// because a line break in one would let it forge others. `resolve` makes a path of the file
/// absolute (relative to the file's directory).
pub(super) fn static_pod_sources(
    flags: &Flags,
    f: &KubeletConfigurationFile,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<Sources, ConfigError> {
    let (static_pod_path, _) = pick(
        flags.pod_manifest_path.clone(),
        "--pod-manifest-path",
        f.static_pod_path.as_deref().map(resolve),
        "staticPodPath",
        PathBuf::new,
    );
    let static_pod_path = (!static_pod_path.as_os_str().is_empty()).then_some(static_pod_path);
    let (static_pod_url, o) = pick(
        flags.manifest_url.clone(),
        "--manifest-url",
        f.static_pod_url.clone(),
        "staticPodURL",
        String::new,
    );
    let static_pod_url = match static_pod_url.trim() {
        "" => None,
        url => {
            check_http_url(url).map_err(|why| invalid(o.name(), why))?;
            Some(url.to_string())
        }
    };
    Ok(Sources {
        static_pod_path,
        static_pod_url,
        static_pod_url_header: url_header(flags, f)?,
    })
}

/// `--manifest-url-header` (repeatable `name:value`) or `staticPodURLHeader`, each name a
/// valid header name and no value with a line break.
fn url_header(
    flags: &Flags,
    f: &KubeletConfigurationFile,
) -> Result<BTreeMap<String, Vec<String>>, ConfigError> {
    let (header, o) = pick(
        flags.manifest_url_header.as_ref().map(|pairs| {
            let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (k, v) in pairs {
                map.entry(k.clone()).or_default().push(v.clone());
            }
            map
        }),
        "--manifest-url-header",
        f.static_pod_url_header.clone(),
        "staticPodURLHeader",
        BTreeMap::new,
    );
    for (name, values) in &header {
        if super::flags::parse_header_pair(&format!("{name}:")).is_err() {
            return Err(invalid(
                o.name(),
                format!("{name:?} is not a valid HTTP header name"),
            ));
        }
        if values.iter().any(|v| v.contains(['\r', '\n'])) {
            return Err(invalid(
                o.name(),
                format!("header {name:?} has a value with a line break"),
            ));
        }
    }
    Ok(header)
}

/// A minimal check that `url` is an absolute http(s) URL with a host.
fn check_http_url(url: &str) -> Result<(), InvalidValue> {
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(InvalidValue(format!(
            "{url:?} is not a valid URL (contains whitespace)"
        )));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(InvalidValue(format!(
            "{url:?} is not an absolute http(s) URL"
        )));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(InvalidValue(format!(
            "{url:?} uses scheme {scheme:?}; only http and https are supported"
        )));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err(InvalidValue(format!(
                "{url:?} has an unterminated IPv6 address"
            )));
        };
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(InvalidValue(format!("{url:?} has an invalid IPv6 address")));
        }
        match after {
            "" => (host, None),
            p => match p.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => {
                    return Err(InvalidValue(format!(
                        "{url:?} has junk after the IPv6 address"
                    )));
                }
            },
        }
    } else {
        match host_port.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Err(InvalidValue(format!("{url:?} has no host")));
    }
    if let Some(port) = port
        && !port.is_empty()
        && port.parse::<u16>().is_err()
    {
        return Err(InvalidValue(format!(
            "{url:?} has an invalid port {port:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls() {
        for ok in [
            "http://example.com",
            "https://example.com/pods?x=1",
            "http://user:pw@10.0.0.1:8080/p",
            "http://[fd00::1]:80/x",
            "HTTPS://Example.com/",
        ] {
            assert_eq!(check_http_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "example.com/pods",
            "ftp://example.com/pods",
            "http://",
            "http:///pods",
            "http://host:port/",
            "http://host:70000/",
            "http://exa mple.com/",
            "http://[fd00::1/",
            "file:///etc/pods",
        ] {
            assert!(check_http_url(bad).is_err(), "{bad}");
        }
    }
}
