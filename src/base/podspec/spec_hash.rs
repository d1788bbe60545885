//! A deterministic 64-bit hash of a container spec.
//!
//! The hash goes into the `io.kubernetes.container.hash` annotation and is compared on every
//! sync to notice spec changes, so it must be identical across processes and restarts: no
//! `RandomState`, just FNV-1a over the spec's JSON form.

use k8s_openapi::api::core::v1::Container;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64-bit.
pub(crate) fn fnv1a_64(data: &[u8]) -> u64 {
    data.iter().fold(FNV_OFFSET_BASIS, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME)
    })
}

/// Stable hash of everything in the container spec but its `resources`, which change in
/// place (in-place pod resize) without making the container a different one. A container
/// without resources hashes as it always did.
///
/// k8s-openapi serialises struct fields in a fixed order and keeps resource maps in
/// `BTreeMap`s, so the JSON text (and therefore the hash) is the same for equal specs.
pub(crate) fn container_hash(container: &Container) -> u64 {
    if container.resources.is_none() {
        return full_hash(container);
    }
    let mut without = container.clone();
    without.resources = None;
    full_hash(&without)
}

fn full_hash(container: &Container) -> u64 {
    // Serialising a plain data struct into memory cannot fail; an empty buffer would still
    // give a stable (if useless) hash.
    let json = serde_json::to_vec(container).unwrap_or_default();
    fnv1a_64(&json)
}

/// Whether `recorded` is the hash an older Deckhand recorded for this very spec (resources
/// included), so containers it started are not restarted by an upgrade.
pub(crate) fn is_legacy_hash_of(recorded: &str, container: &Container) -> bool {
    container.resources.is_some() && parse_hash(recorded) == Some(full_hash(container))
}

/// The annotation form of a hash: lowercase hex, like the upstream kubelet writes it.
pub(crate) fn format_hash(hash: u64) -> String {
    format!("{hash:x}")
}

/// Reads back an annotation written by [`format_hash`].
pub(crate) fn parse_hash(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a_64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn container_hash_is_stable_and_sensitive() {
        let a = Container {
            name: "app".into(),
            image: Some("busybox:1.36".into()),
            command: Some(vec!["sleep".into(), "3600".into()]),
            ..Default::default()
        };
        let same = a.clone();
        let mut changed = a.clone();
        changed.image = Some("busybox:1.37".into());
        assert_eq!(container_hash(&a), container_hash(&same));
        assert_ne!(container_hash(&a), container_hash(&changed));
        // Pinned value: catches accidental changes to the hashing scheme, which would make
        // every running container look outdated after an upgrade.
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(
            json,
            r#"{"command":["sleep","3600"],"image":"busybox:1.36","name":"app"}"#
        );
        assert_eq!(container_hash(&a), fnv1a_64(json.as_bytes()));
    }

    #[test]
    fn resources_are_left_out_and_the_old_hash_still_matches() {
        let mut a = Container {
            name: "app".into(),
            image: Some("busybox:1.36".into()),
            ..Default::default()
        };
        let bare = container_hash(&a);
        a.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(std::collections::BTreeMap::from([(
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
            )])),
            ..Default::default()
        });
        assert_eq!(container_hash(&a), bare, "a resize is not a new definition");
        assert!(is_legacy_hash_of(&format_hash(full_hash(&a)), &a));
        assert!(!is_legacy_hash_of(&format_hash(bare), &a));
    }

    #[test]
    fn hash_round_trips_through_annotation_form() {
        for h in [0u64, 1, 0xdead_beef, u64::MAX] {
            assert_eq!(parse_hash(&format_hash(h)), Some(h));
        }
        assert_eq!(parse_hash("xyz"), None);
    }
}
