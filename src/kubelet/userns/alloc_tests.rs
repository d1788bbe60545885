use super::*;
use crate::clients::cri::proto::RuntimeHandlerFeatures;

const BLOCK: u32 = IDS_PER_POD;

#[test]
fn the_node_range_follows_upstreams_rules() {
    let r = |first, len| IdRange { first, len };
    let cases: &[(IdRange, u32, Result<IdRange, RangeError>)] = &[
        (DEFAULT_RANGE, 110, Ok(DEFAULT_RANGE)),
        (r(BLOCK, 110 * BLOCK), 110, Ok(r(BLOCK, 110 * BLOCK))),
        (
            r(BLOCK + 1, BLOCK),
            1,
            Err(RangeError::NotAligned(BLOCK + 1)),
        ),
        (r(0, 10 * BLOCK), 1, Err(RangeError::StartsTooLow(0))),
        (
            r(BLOCK, BLOCK + 5),
            1,
            Err(RangeError::LengthNotMultiple(BLOCK + 5)),
        ),
        (r(BLOCK, 10 * BLOCK), 11, Err(RangeError::TooFewForPods(11))),
    ];
    for (range, max_pods, want) in cases {
        assert_eq!(
            &check_range(*range, *max_pods),
            want,
            "{range:?} {max_pods}"
        );
    }
    assert_eq!(
        RangeError::StartsTooLow(0).to_string(),
        "kubelet user assigned ID 0 must be greater or equal to 65536"
    );
}

#[test]
fn the_kubelet_users_subordinate_ids_make_the_range() {
    let text = "# comment\nalice:100000:65536\nkubelet:655360:6553600\n";
    let mine = subordinate_ranges(text, "kubelet", None).unwrap();
    assert_eq!(
        mine,
        [IdRange {
            first: 655360,
            len: 6553600
        }]
    );
    let by_uid = subordinate_ranges("998:131072:131072\n", "kubelet", Some(998)).unwrap();
    assert_eq!(
        by_uid,
        [IdRange {
            first: 131072,
            len: 131072
        }]
    );
    assert!(subordinate_ranges("bad line\n", "kubelet", None).is_err());
    // No kubelet user or no ranges: upstream's default.
    assert_eq!(node_range(&[], &[]), Ok(DEFAULT_RANGE));
    assert_eq!(node_range(&mine, &mine), Ok(mine[0]));
    assert_eq!(node_range(&mine, &[]), Err(RangeError::Mismatched));
    let two = [mine[0], by_uid[0]];
    assert!(matches!(
        node_range(&two, &two),
        Err(RangeError::NotOneRange(_))
    ));
    assert_eq!(
        parse_getsubids("0: kubelet 65536 2147483648\n"),
        Ok(IdRange {
            first: 65536,
            len: 2147483648
        })
    );
    assert!(parse_getsubids("0: kubelet 65536 1\n1: kubelet 1 1\n").is_err());
    assert!(parse_getsubids("0: kubelet 65536\n").is_err());
}

#[test]
fn pods_get_disjoint_blocks_kept_until_released() {
    let mut a = Allocator::new(IdRange {
        first: 2 * BLOCK,
        len: 3 * BLOCK,
    });
    assert_eq!(a.allocate("p1"), Ok(2 * BLOCK));
    assert_eq!(a.allocate("p2"), Ok(3 * BLOCK));
    // Asking again gives the same block.
    assert_eq!(a.allocate("p1"), Ok(2 * BLOCK));
    assert_eq!(a.allocate("p3"), Ok(4 * BLOCK));
    assert_eq!(a.allocate("p4"), Err(AllocError::Full));
    assert_eq!(a.release("p2"), Some(3 * BLOCK));
    assert_eq!(a.release("p2"), None);
    assert_eq!(a.allocate("p4"), Ok(3 * BLOCK));
}

#[test]
fn recorded_blocks_are_checked_as_upstream() {
    let mut a = Allocator::new(IdRange {
        first: BLOCK,
        len: 4 * BLOCK,
    });
    assert_eq!(a.record("p1", 3 * BLOCK, BLOCK), Ok(()));
    assert_eq!(a.record("p1", 3 * BLOCK, BLOCK), Ok(()));
    assert_eq!(
        a.record("p1", 2 * BLOCK, BLOCK),
        Err(AllocError::Different("p1".into()))
    );
    assert_eq!(
        a.record("p2", 3 * BLOCK, BLOCK),
        Err(AllocError::Taken("p2".into()))
    );
    assert_eq!(
        a.record("p2", 2 * BLOCK, 10),
        Err(AllocError::WrongLength(10))
    );
    assert_eq!(
        a.record("p2", 2 * BLOCK + 1, BLOCK),
        Err(AllocError::WrongOffset(2 * BLOCK + 1))
    );
    assert_eq!(a.record("p2", 0, BLOCK), Err(AllocError::OutOfRange(0)));
    assert_eq!(
        a.record("p2", 5 * BLOCK, BLOCK),
        Err(AllocError::OutOfRange(5 * BLOCK))
    );
    // A new pod never gets a recorded block.
    assert_eq!(a.allocate("p3"), Ok(BLOCK));
    assert_eq!(a.allocate("p4"), Ok(2 * BLOCK));
    assert_eq!(a.allocate("p5"), Ok(4 * BLOCK));
}

#[test]
fn the_mappings_file_round_trips_and_is_checked() {
    let file = MappingsFile::for_block(5 * BLOCK);
    let text = serde_json::to_vec(&file).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&text),
        r#"{"uidMappings":[{"hostId":327680,"containerId":0,"length":65536}],"gidMappings":[{"hostId":327680,"containerId":0,"length":65536}]}"#
    );
    assert_eq!(MappingsFile::parse(&text), Ok(file.uid_mappings[0]));
    let map = |host_id, container_id| IdMap {
        host_id,
        container_id,
        length: BLOCK,
    };
    let bad = |uids: Vec<IdMap>, gids: Vec<IdMap>| {
        let f = MappingsFile {
            uid_mappings: uids,
            gid_mappings: gids,
        };
        MappingsFile::parse(&serde_json::to_vec(&f).unwrap())
    };
    assert_eq!(bad(vec![], vec![]), Err(MappingsError::NotOne));
    assert_eq!(
        bad(vec![map(BLOCK, 0)], vec![map(2 * BLOCK, 0)]),
        Err(MappingsError::NotIdentical)
    );
    assert_eq!(
        bad(vec![map(BLOCK, 1)], vec![map(BLOCK, 1)]),
        Err(MappingsError::RootNotMapped)
    );
    assert!(matches!(
        MappingsFile::parse(b"{"),
        Err(MappingsError::Json(_))
    ));
}

#[test]
fn the_runtime_must_say_its_handler_makes_user_namespaces() {
    let handler = |name: &str, userns| RuntimeHandler {
        name: name.into(),
        features: Some(RuntimeHandlerFeatures {
            recursive_read_only_mounts: true,
            user_namespaces: userns,
        }),
    };
    let base = "can't set `spec.hostUsers: false`, runtime does not support user namespaces";
    assert_eq!(
        runtime_refusal(&[handler("", true), handler("runc", true)], ""),
        None
    );
    assert_eq!(
        runtime_refusal(&[handler("", false)], "").as_deref(),
        Some(base)
    );
    assert_eq!(
        runtime_refusal(&[], "").unwrap(),
        format!("{base}: runtime handlers are not set")
    );
    assert_eq!(
        runtime_refusal(&[handler("runc", true)], "").unwrap(),
        format!("{base}: the handler \"\" is not known")
    );
    assert_eq!(
        runtime_refusal(&[handler("kata", false)], "kata").unwrap(),
        "can't set `spec.hostUsers: false`, RuntimeClass handler \"kata\" does not support user namespaces"
    );
}
