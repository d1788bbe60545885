//! Registry credentials from a pod's `imagePullSecrets`, as upstream's docker keyring
//! (`pkg/credentialprovider`) reads and matches them (pure, table-tested).
//!
//! - A secret of type `kubernetes.io/dockerconfigjson` with a non-empty `.dockerconfigjson`
//!   (`{"auths": {registry: entry}}`), or `kubernetes.io/dockercfg` with `.dockercfg` (`{registry:
//!   entry}`), gives entries; a secret of any other type is ignored, as upstream. One that does
//!   not parse is an error naming the secret (upstream fails the pull too, without the name).
//! - An entry has `username`/`password`, or `auth` (base64 of `user:password`, padded or not),
//!   which wins; and, beyond upstream's reader, docker's `identitytoken` and `registrytoken`.
//!   JSON keys match case-insensitively, as Go's decoder does.
//! - A registry key is `host[:port][/path]`, with or without `http(s)://`; `/v1/` and `/v2/`
//!   stand for the host alone. An image matches a key when the host has as many dot-separated
//!   parts, each matches the key's glob (`*.example.com`, `reg-[0-9].example.com`), the ports
//!   are equal (none equals none only) and the key's path is a string prefix of the image's
//!   repository path. Keys are tried most specific first (reverse lexical order), every
//!   matching key's credentials in turn; when none match, a Docker Hub image gets the
//!   `index.docker.io` credentials.
//!
//! Nothing here logs, and [`Credential`]'s `Debug` hides the secret parts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

/// `kubernetes.io/dockerconfigjson` and its key.
pub(crate) const TYPE_DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
pub(crate) const KEY_DOCKER_CONFIG_JSON: &str = ".dockerconfigjson";
/// `kubernetes.io/dockercfg` and its key.
pub(crate) const TYPE_DOCKERCFG: &str = "kubernetes.io/dockercfg";
pub(crate) const KEY_DOCKERCFG: &str = ".dockercfg";

const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// One set of credentials for a registry, and the secret it came from.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct Credential {
    pub username: String,
    pub password: String,
    pub identity_token: String,
    pub registry_token: String,
    /// `namespace/name` of the secret.
    pub source: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |s: &str| if s.is_empty() { "" } else { "<set>" };
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &set(&self.password))
            .field("identity_token", &set(&self.identity_token))
            .field("registry_token", &set(&self.registry_token))
            .field("source", &self.source)
            .finish()
    }
}

/// A pull secret that could not be read. The message never quotes the secret's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("couldn't parse image pull secret \"{namespace}/{name}\" ({key}): {reason}")]
pub(crate) struct KeyringError {
    pub namespace: String,
    pub name: String,
    pub key: &'static str,
    pub reason: String,
}

/// Why a docker config (`.dockerconfigjson` or `.dockercfg`) could not be read. The message
/// never quotes the content.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DockerConfigError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("expected a JSON object with \"auths\", found {found}")]
    NotAuths { found: &'static str },
    #[error("expected an object of registries, found {found}")]
    NotRegistries { found: &'static str },
    #[error("registry {registry:?}: expected an object, found {found}")]
    EntryNotObject {
        registry: String,
        found: &'static str,
    },
    #[error("registry {registry:?}: {field:?} must be a string, found {found}")]
    FieldNotString {
        registry: String,
        field: &'static str,
        found: &'static str,
    },
    #[error("registry {registry:?}: {source}")]
    Auth { registry: String, source: AuthError },
}

/// Why an entry's `auth` field could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    #[error("\"auth\" is not valid base64")]
    NotBase64,
    #[error("unable to parse auth field, must be formatted as base64(username:password)")]
    NoColon,
}

/// The credentials of a pod's pull secrets, indexed by registry key.
#[derive(Debug, Clone, Default)]
pub(crate) struct Keyring {
    /// Every key, unique, in reverse lexical order (most specific first).
    index: Vec<String>,
    creds: BTreeMap<String, Vec<Credential>>,
}

impl Keyring {
    /// The keyring of these secrets, in the pod's order. Secrets of other types are skipped.
    pub(crate) fn from_secrets<'a>(
        secrets: impl IntoIterator<Item = &'a Secret>,
    ) -> Result<Keyring, KeyringError> {
        let mut ring = Keyring::default();
        for secret in secrets {
            let kind = secret.type_.as_deref().unwrap_or("");
            let data = |key: &str| {
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|b| b.0.as_slice())
                    .filter(|b| !b.is_empty())
            };
            let (key, parsed) = if kind == TYPE_DOCKER_CONFIG_JSON
                && let Some(bytes) = data(KEY_DOCKER_CONFIG_JSON)
            {
                (KEY_DOCKER_CONFIG_JSON, parse_docker_config_json(bytes))
            } else if kind == TYPE_DOCKERCFG
                && let Some(bytes) = data(KEY_DOCKERCFG)
            {
                (KEY_DOCKERCFG, parse_dockercfg(bytes))
            } else {
                continue;
            };
            let namespace = secret.metadata.namespace.clone().unwrap_or_default();
            let name = secret.metadata.name.clone().unwrap_or_default();
            let entries = parsed.map_err(|reason| KeyringError {
                namespace: namespace.clone(),
                name: name.clone(),
                key,
                reason: reason.to_string(),
            })?;
            ring.add(&format!("{namespace}/{name}"), entries);
        }
        Ok(ring)
    }

    /// Adds one docker config's entries (registry, credentials) from `source`.
    pub(crate) fn add(&mut self, source: &str, entries: Vec<(String, Credential)>) {
        for (registry, mut cred) in entries {
            let Some(key) = registry_key(&registry) else {
                continue;
            };
            cred.source = source.to_string();
            self.creds.entry(key.clone()).or_default().push(cred);
            self.index.push(key);
        }
        self.index.sort_unstable_by(|a, b| b.cmp(a));
        self.index.dedup();
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The credentials to try for `image`, in order. None for an image name that does not
    /// parse (the pull then goes without, and the runtime says what is wrong with the name).
    pub(crate) fn lookup(&self, image: &str) -> Vec<Credential> {
        let Some(repo) = repository_of(image) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for key in &self.index {
            if urls_match(key, &repo) {
                out.extend(self.creds[key].iter().cloned());
            }
        }
        if out.is_empty()
            && is_default_registry(&repo)
            && let Some(hub) = self.creds.get(DEFAULT_REGISTRY_HOST)
        {
            out.extend(hub.iter().cloned());
        }
        out
    }
}

/// `.dockerconfigjson`: `{"auths": {registry: entry}}`. Other fields are ignored.
pub(crate) fn parse_docker_config_json(
    bytes: &[u8],
) -> Result<Vec<(String, Credential)>, DockerConfigError> {
    let value: serde_json::Value = serde_json::from_slice(bytes)?;
    match value {
        serde_json::Value::Null => Ok(Vec::new()),
        serde_json::Value::Object(top) => match field(&top, "auths") {
            None | Some(serde_json::Value::Null) => Ok(Vec::new()),
            Some(auths) => entries(auths),
        },
        other => Err(DockerConfigError::NotAuths {
            found: json_kind(&other),
        }),
    }
}

/// `.dockercfg`: `{registry: entry}`.
pub(crate) fn parse_dockercfg(
    bytes: &[u8],
) -> Result<Vec<(String, Credential)>, DockerConfigError> {
    let value: serde_json::Value = serde_json::from_slice(bytes)?;
    entries(&value)
}

fn entries(value: &serde_json::Value) -> Result<Vec<(String, Credential)>, DockerConfigError> {
    let map = match value {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Object(map) => map,
        other => {
            return Err(DockerConfigError::NotRegistries {
                found: json_kind(other),
            });
        }
    };
    let mut out = Vec::new();
    for (registry, entry) in map {
        let entry = match entry {
            serde_json::Value::Null => serde_json::Map::new(),
            serde_json::Value::Object(e) => e.clone(),
            other => {
                return Err(DockerConfigError::EntryNotObject {
                    registry: registry.clone(),
                    found: json_kind(other),
                });
            }
        };
        let text = |name: &'static str| -> Result<String, DockerConfigError> {
            match field(&entry, name) {
                None | Some(serde_json::Value::Null) => Ok(String::new()),
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(DockerConfigError::FieldNotString {
                    registry: registry.clone(),
                    field: name,
                    found: json_kind(other),
                }),
            }
        };
        let mut cred = Credential {
            username: text("username")?,
            password: text("password")?,
            identity_token: text("identitytoken")?,
            registry_token: text("registrytoken")?,
            source: String::new(),
        };
        // Checked even when empty-valued fields come first: "email" must be a string too.
        text("email")?;
        let auth = text("auth")?;
        if !auth.is_empty() {
            let (user, password) =
                decode_auth(&auth).map_err(|source| DockerConfigError::Auth {
                    registry: registry.clone(),
                    source,
                })?;
            cred.username = user;
            cred.password = password;
        }
        out.push((registry.clone(), cred));
    }
    Ok(out)
}

/// A field by name, the exact spelling first, else any case (as Go's JSON decoder).
fn field<'a>(
    map: &'a serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Option<&'a serde_json::Value> {
    map.get(name).or_else(|| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// `auth`: base64 (padded when it ends in `=`, else unpadded) of `user:password`.
fn decode_auth(field: &str) -> Result<(String, String), AuthError> {
    let padded = field.trim().ends_with('=');
    let bytes = decode_base64(field, padded).ok_or(AuthError::NotBase64)?;
    let text = String::from_utf8_lossy(&bytes);
    match text.split_once(':') {
        Some((user, password)) => Ok((user.to_string(), password.to_string())),
        None => Err(AuthError::NoColon),
    }
}

/// Standard-alphabet base64; `padded` wants `=` padding to a multiple of 4, else none at all.
/// Line breaks are skipped, as Go's decoder does; anything else outside the alphabet fails.
fn decode_base64(text: &str, padded: bool) -> Option<Vec<u8>> {
    let symbols: Vec<u8> = text
        .bytes()
        .filter(|b| *b != b'\r' && *b != b'\n')
        .collect();
    let body: &[u8] = if padded {
        if !symbols.len().is_multiple_of(4) {
            return None;
        }
        let pad = symbols.iter().rev().take_while(|b| **b == b'=').count();
        if pad > 2 {
            return None;
        }
        &symbols[..symbols.len() - pad]
    } else {
        &symbols
    };
    if body.len() % 4 == 1 {
        return None;
    }
    let value = |b: u8| -> Option<u32> {
        Some(match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.chunks(4) {
        let mut acc = 0u32;
        for &b in chunk {
            acc = (acc << 6) | value(b)?;
        }
        match chunk.len() {
            4 => out.extend_from_slice(&[(acc >> 16) as u8, (acc >> 8) as u8, acc as u8]),
            3 => out.extend_from_slice(&[(acc >> 10) as u8, (acc >> 2) as u8]),
            2 => out.push((acc >> 4) as u8),
            _ => return None,
        }
    }
    Some(out)
}

/// A host with an optional port, and a path (empty or starting with `/`).
struct HostPath<'a> {
    host: &'a str,
    port: &'a str,
    path: &'a str,
}

/// Splits a schemeless `host[:port][/path]`; None when the port is not a number (as Go's URL
/// parser refuses it).
fn split_host_path(s: &str) -> Option<HostPath<'_>> {
    let s = s.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match s.find('/') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let authority = authority.rsplit('@').next().unwrap_or("");
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !authority.starts_with('[') || h.ends_with(']') => (h, p),
        _ => (authority, ""),
    };
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(HostPath { host, port, path })
}

/// The index key of a registry as written in a docker config: the host (and port), and the
/// path unless it is empty, `/`, or only `/v1/`, `/v2/`.
fn registry_key(registry: &str) -> Option<String> {
    let rest = registry
        .strip_prefix("https://")
        .or_else(|| registry.strip_prefix("http://"))
        .unwrap_or(registry);
    let parts = split_host_path(rest)?;
    let mut path = parts.path;
    if path.starts_with("/v2/") || path.starts_with("/v1/") {
        path = &path[3..];
    }
    let authority = if parts.port.is_empty() {
        parts.host.to_string()
    } else {
        format!("{}:{}", parts.host, parts.port)
    };
    if path.is_empty() || path == "/" {
        Some(authority)
    } else {
        Some(format!("{authority}{path}"))
    }
}

/// Whether the image `target` (a repository, `host[:port]/path`) falls under the key `glob`.
fn urls_match(glob: &str, target: &str) -> bool {
    let (Some(g), Some(t)) = (split_host_path(glob), split_host_path(target)) else {
        return false;
    };
    if g.port != t.port || !t.path.starts_with(g.path) {
        return false;
    }
    let g_parts: Vec<&str> = g.host.split('.').collect();
    let t_parts: Vec<&str> = t.host.split('.').collect();
    g_parts.len() == t_parts.len()
        && g_parts
            .iter()
            .zip(&t_parts)
            .all(|(p, s)| glob_match(p.as_bytes(), s.as_bytes()) == Some(true))
}

/// Shell-style matching of one host part (Go's `filepath.Match`): `*`, `?`, `[set]` / `[^set]` with ranges, `\`
/// escapes. None for a malformed pattern (which matches nothing, as upstream).
fn glob_match(pattern: &[u8], text: &[u8]) -> Option<bool> {
    match pattern.split_first() {
        None => Some(text.is_empty()),
        Some((b'*', rest)) => {
            // Check the rest of the pattern is well-formed even when text runs out.
            for i in 0..=text.len() {
                if glob_match(rest, &text[i..])? {
                    return Some(true);
                }
            }
            Some(false)
        }
        Some((b'?', rest)) => match text.split_first() {
            Some((_, t)) => glob_match(rest, t),
            None => glob_match(rest, text).map(|_| false),
        },
        Some((b'[', rest)) => {
            let (negate, mut body) = match rest.split_first() {
                Some((b'^', r)) => (true, r),
                _ => (false, rest),
            };
            let mut matched = false;
            let c = text.first().copied();
            let mut first = true;
            loop {
                let (&b, r) = body.split_first()?;
                if b == b']' && !first {
                    body = r;
                    break;
                }
                first = false;
                let (lo, r) = unescape(b, r)?;
                let (hi, r) = match r.split_first() {
                    Some((b'-', r2)) if r2.first().is_some_and(|x| *x != b']') => {
                        let (&h, r3) = r2.split_first()?;
                        unescape(h, r3)?
                    }
                    _ => (lo, r),
                };
                if lo > hi {
                    return None;
                }
                if c.is_some_and(|c| lo <= c && c <= hi) {
                    matched = true;
                }
                body = r;
            }
            match text.split_first() {
                Some((_, t)) if matched != negate => glob_match(body, t),
                _ => glob_match(body, b"").map(|_| false),
            }
        }
        Some((&b, rest)) => {
            let (want, rest) = unescape(b, rest)?;
            match text.split_first() {
                Some((&c, t)) if c == want => glob_match(rest, t),
                _ => glob_match(rest, b"").map(|_| false),
            }
        }
    }
}

fn unescape(b: u8, rest: &[u8]) -> Option<(u8, &[u8])> {
    if b == b'\\' {
        let (&e, r) = rest.split_first()?;
        Some((e, r))
    } else {
        Some((b, rest))
    }
}

/// The repository an image pulls from, normalized as the docker reference library does:
/// `busybox:1` → `docker.io/library/busybox`, `example.com:5000/a/b@sha256:…` →
/// `example.com:5000/a/b`. None for an empty or obviously broken name.
pub(crate) fn repository_of(image: &str) -> Option<String> {
    let name = image.split('@').next().unwrap_or("");
    if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
        return None;
    }
    let (domain, remainder) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first, rest)
        }
        _ => ("docker.io", name),
    };
    let domain = if domain == DEFAULT_REGISTRY_HOST {
        "docker.io"
    } else {
        domain
    };
    // The tag is a `:` after the last `/` of the path.
    let last_slash = remainder.rfind('/').map_or(0, |i| i + 1);
    let path = match remainder[last_slash..].rfind(':') {
        Some(i) => &remainder[..last_slash + i],
        None => remainder,
    };
    if path.is_empty() || path.ends_with('/') || path.starts_with('/') {
        return None;
    }
    if domain == "docker.io" && !path.contains('/') {
        Some(format!("docker.io/library/{path}"))
    } else {
        Some(format!("{domain}/{path}"))
    }
}

/// Whether a repository is on Docker Hub (no domain-looking first part, or docker.io).
fn is_default_registry(repo: &str) -> bool {
    match repo.split_once('/') {
        None => !repo.is_empty(),
        Some(("", _)) => false,
        Some((first, _)) => {
            first == "docker.io"
                || first == DEFAULT_REGISTRY_HOST
                || !(first.contains('.') || first.contains(':'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(name: &str, kind: &str, key: &str, body: &str) -> Secret {
        let mut s = Secret::default();
        s.metadata.namespace = Some("shop".into());
        s.metadata.name = Some(name.into());
        s.type_ = Some(kind.into());
        s.data = Some(
            [(key.to_string(), ByteString(body.as_bytes().to_vec()))]
                .into_iter()
                .collect(),
        );
        s
    }

    fn cred(user: &str, password: &str) -> Credential {
        Credential {
            username: user.into(),
            password: password.into(),
            ..Default::default()
        }
    }

    fn users(creds: &[Credential]) -> Vec<String> {
        creds.iter().map(|c| c.username.clone()).collect()
    }

    #[test]
    fn repository_names_are_normalized() {
        let rows = [
            ("busybox", Some("docker.io/library/busybox")),
            ("busybox:1.35", Some("docker.io/library/busybox")),
            ("library/busybox", Some("docker.io/library/busybox")),
            ("docker.io/busybox", Some("docker.io/library/busybox")),
            ("index.docker.io/foo/bar:1", Some("docker.io/foo/bar")),
            ("user/app", Some("docker.io/user/app")),
            (
                "localhost/deckhand/busybox:1.35",
                Some("localhost/deckhand/busybox"),
            ),
            ("127.0.0.1:5000/a/b:t", Some("127.0.0.1:5000/a/b")),
            ("127.0.0.1:5000/a/b", Some("127.0.0.1:5000/a/b")),
            (
                "reg.example.com/a/b@sha256:0123456789abcdef",
                Some("reg.example.com/a/b"),
            ),
            (
                "reg.example.com/a/b:v1@sha256:00",
                Some("reg.example.com/a/b"),
            ),
            ("", None),
            ("has space", None),
            ("reg.example.com/", None),
            (":tag", None),
        ];
        for (image, want) in rows {
            assert_eq!(repository_of(image).as_deref(), want, "{image:?}");
        }
    }

    #[test]
    fn registry_keys_as_upstream() {
        let rows = [
            ("quay.io", Some("quay.io")),
            ("https://quay.io", Some("quay.io")),
            ("http://quay.io/", Some("quay.io")),
            ("https://index.docker.io/v1/", Some("index.docker.io")),
            ("https://reg.io/v2/team", Some("reg.io/team")),
            ("reg.io:5000/team/app", Some("reg.io:5000/team/app")),
            ("127.0.0.1:5000", Some("127.0.0.1:5000")),
            ("*.example.com", Some("*.example.com")),
            ("reg.io:port", None),
        ];
        for (registry, want) in rows {
            assert_eq!(registry_key(registry).as_deref(), want, "{registry:?}");
        }
    }

    #[test]
    fn keys_match_images_as_upstream() {
        // (key, repository, matches)
        let rows = [
            ("reg.io", "reg.io/a/b", true),
            ("reg.io", "other.io/a/b", false),
            ("reg.io", "reg.io:5000/a", false),
            ("reg.io:5000", "reg.io:5000/a", true),
            ("reg.io:5000", "reg.io/a", false),
            ("reg.io:5000", "reg.io:5001/a", false),
            ("reg.io/team", "reg.io/team/app", true),
            ("reg.io/team", "reg.io/other/app", false),
            // A string prefix, not a path-component prefix: upstream's quirk.
            ("reg.io/team", "reg.io/teamster/app", true),
            ("*.example.com", "reg.example.com/a", true),
            ("*.example.com", "a.b.example.com/a", false),
            ("*.example.com", "example.com/a", false),
            ("*.*.example.com", "a.b.example.com/a", true),
            // `?` starts a URL's query, so upstream never sees it in a host.
            ("reg-?.example.com", "reg-1.example.com/a", false),
            ("reg-[0-9].example.com", "reg-7.example.com/a", true),
            ("reg-[^0-9].example.com", "reg-7.example.com/a", false),
            ("reg-[0-9.example.com", "reg-7.example.com/a", false),
            ("*.io", "reg.io/a", true),
            ("127.0.0.1:5000", "127.0.0.1:5000/x/y", true),
            ("127.0.0.*:5000", "127.0.0.1:5000/x/y", true),
            ("docker.io", "docker.io/library/busybox", true),
        ];
        for (key, repo, want) in rows {
            assert_eq!(urls_match(key, repo), want, "{key:?} vs {repo:?}");
        }
    }

    #[test]
    fn globs() {
        let rows = [
            ("*", "", Some(true)),
            ("*", "abc", Some(true)),
            ("a*c", "abbbc", Some(true)),
            ("a*c", "abd", Some(false)),
            ("?", "", Some(false)),
            ("[a-c]x", "bx", Some(true)),
            ("[]a]", "]", Some(true)),
            (r"\*", "*", Some(true)),
            (r"\*", "a", Some(false)),
            ("[", "a", None),
            ("[z-a]", "b", None),
            (r"a\", "a", None),
        ];
        for (p, t, want) in rows {
            assert_eq!(glob_match(p.as_bytes(), t.as_bytes()), want, "{p:?} {t:?}");
        }
    }

    #[test]
    fn base64_as_go() {
        let rows: [(&str, bool, Option<&[u8]>); 8] = [
            ("dXNlcjpwYXNz", false, Some(b"user:pass")),
            ("dXNlcjpwYXNzMQ==", true, Some(b"user:pass1")),
            ("dXNlcjpwYXNzMQ", false, Some(b"user:pass1")),
            ("dXNlcjpwYXNzMQ", true, None),
            ("dXNlcjpwYXNzMQ==", false, None),
            ("dXNl\ncjpw", false, Some(b"user:p")),
            ("d", false, None),
            ("!!!!", false, None),
        ];
        for (text, padded, want) in rows {
            assert_eq!(decode_base64(text, padded).as_deref(), want, "{text:?}");
        }
    }

    #[test]
    fn docker_config_json_entries() {
        let body = r#"{"auths": {
            "reg.io": {"auth": "dXNlcjpwYXNz"},
            "other.io": {"username": "u2", "password": "p2", "email": "x@y"},
            "tok.io": {"identitytoken": "it", "registrytoken": "rt"}
        }, "HttpHeaders": {"X": "y"}}"#;
        let got = parse_docker_config_json(body.as_bytes()).unwrap();
        let got: BTreeMap<String, Credential> = got.into_iter().collect();
        assert_eq!(got["reg.io"], cred("user", "pass"));
        assert_eq!(got["other.io"], cred("u2", "p2"));
        assert_eq!(got["tok.io"].identity_token, "it");
        assert_eq!(got["tok.io"].registry_token, "rt");

        // Go's decoder matches keys in any case; null and missing "auths" are empty.
        let got = parse_docker_config_json(br#"{"Auths": {"r.io": {"Username": "U"}}}"#).unwrap();
        assert_eq!(got[0].1.username, "U");
        assert!(parse_docker_config_json(b"null").unwrap().is_empty());
        assert!(parse_docker_config_json(b"{}").unwrap().is_empty());

        let bad = [
            (&b"{not json"[..], "key must be a string"),
            (b"[]", "expected a JSON object"),
            (br#"{"auths": []}"#, "expected an object of registries"),
            (br#"{"auths": {"r.io": 3}}"#, "expected an object"),
            (
                br#"{"auths": {"r.io": {"username": 3}}}"#,
                "must be a string",
            ),
            (
                br#"{"auths": {"r.io": {"auth": "%%%"}}}"#,
                "not valid base64",
            ),
            (
                br#"{"auths": {"r.io": {"auth": "bm9jb2xvbg=="}}}"#,
                "base64(username:password)",
            ),
        ];
        for (body, want) in bad {
            let err = parse_docker_config_json(body).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{}: {err}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn dockercfg_entries() {
        let got = parse_dockercfg(br#"{"https://reg.io": {"auth": "dXNlcjpwYXNz", "email": "e"}}"#)
            .unwrap();
        assert_eq!(
            got,
            vec![("https://reg.io".to_string(), cred("user", "pass"))]
        );
        assert!(parse_dockercfg(b"\"x\"").is_err());
    }

    #[test]
    fn keyring_from_secrets_orders_and_matches() {
        let a = secret(
            "a",
            TYPE_DOCKER_CONFIG_JSON,
            KEY_DOCKER_CONFIG_JSON,
            r#"{"auths": {"reg.io": {"username": "a-host", "password": "x"},
                          "reg.io/team": {"username": "a-team", "password": "x"},
                          "https://index.docker.io/v1/": {"username": "a-hub", "password": "x"}}}"#,
        );
        let b = secret(
            "b",
            TYPE_DOCKERCFG,
            KEY_DOCKERCFG,
            r#"{"reg.io": {"username": "b-host", "password": "y"},
                "*.corp.io": {"username": "b-corp", "password": "y"}}"#,
        );
        // Wrong type for its key, and an opaque secret: both ignored, as upstream.
        let c = secret("c", "Opaque", KEY_DOCKER_CONFIG_JSON, "{broken");
        let d = secret("d", TYPE_DOCKERCFG, KEY_DOCKER_CONFIG_JSON, "{broken");
        let ring = Keyring::from_secrets([&a, &b, &c, &d]).unwrap();
        let rows = [
            ("reg.io/team/app:1", vec!["a-team", "a-host", "b-host"]),
            ("reg.io/other/app", vec!["a-host", "b-host"]),
            ("r1.corp.io/app", vec!["b-corp"]),
            ("busybox", vec!["a-hub"]),
            ("docker.io/library/busybox:1", vec!["a-hub"]),
            ("quay.io/x/y", vec![]),
            ("", vec![]),
        ];
        for (image, want) in rows {
            assert_eq!(users(&ring.lookup(image)), want, "{image:?}");
        }
        assert_eq!(ring.lookup("reg.io/x")[1].source, "shop/b");
        assert!(Keyring::from_secrets([]).unwrap().is_empty());
    }

    #[test]
    fn a_broken_secret_is_an_error_naming_it_and_never_its_content() {
        let good = secret(
            "good",
            TYPE_DOCKER_CONFIG_JSON,
            KEY_DOCKER_CONFIG_JSON,
            r#"{"auths": {}}"#,
        );
        let bad = secret(
            "regcred",
            TYPE_DOCKER_CONFIG_JSON,
            KEY_DOCKER_CONFIG_JSON,
            r#"{"auths": {"reg.io": {"password": "hunter2", "username": 7}}}"#,
        );
        let err = Keyring::from_secrets([&good, &bad]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "couldn't parse image pull secret \"shop/regcred\" (.dockerconfigjson): "
            ),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
        // An empty value is skipped rather than refused, as upstream.
        let empty = secret("e", TYPE_DOCKER_CONFIG_JSON, KEY_DOCKER_CONFIG_JSON, "");
        assert!(Keyring::from_secrets([&empty]).unwrap().is_empty());
    }

    #[test]
    fn debug_hides_secrets() {
        let c = Credential {
            username: "u".into(),
            password: "hunter2".into(),
            identity_token: "tok".into(),
            ..Default::default()
        };
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("tok\""),
            "{shown}"
        );
    }
}
