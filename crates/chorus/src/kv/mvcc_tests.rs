//! The multi-version machine against etcd v3.4's answers.

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;

use super::etcd::*;
use super::*;

fn b(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: b(key),
        value: b(value),
        ..PutRequest::default()
    }
}

fn delete(key: &str, range_end: &str) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: b(key),
        range_end: b(range_end),
        prev_kv: false,
    }
}

fn get(key: &str, range_end: &str) -> RangeRequest {
    RangeRequest {
        key: b(key),
        range_end: b(range_end),
        ..RangeRequest::default()
    }
}

fn compare(key: &str, result: CompareResult, target: CompareTarget) -> Compare {
    Compare {
        key: b(key),
        range_end: Bytes::new(),
        result,
        target,
    }
}

/// Applies `command` as the next record, through its log encoding.
fn apply(state: &mut KvState, command: EtcdCommand) -> Result<EtcdResponse, EtcdError> {
    let record = command.encode();
    assert_eq!(EtcdCommand::decode(&record).unwrap(), command);
    match state.apply(state.applied_end(), &record) {
        Applied::Etcd(answer) => answer,
        other => panic!("not an etcd answer: {other:?}"),
    }
}

fn apply_txn(state: &mut KvState, txn: TxnRequest) -> TxnResponse {
    match apply(state, EtcdCommand::Txn(txn)) {
        Ok(EtcdResponse::Txn(response)) => response,
        other => panic!("{other:?}"),
    }
}

fn apply_put(state: &mut KvState, key: &str, value: &str) -> PutResponse {
    match apply(state, EtcdCommand::Put(put(key, value))) {
        Ok(EtcdResponse::Put(response)) => response,
        other => panic!("{other:?}"),
    }
}

fn keys(response: &RangeResponse) -> Vec<String> {
    response
        .kvs
        .iter()
        .map(|kv| String::from_utf8(kv.key.to_vec()).unwrap())
        .collect()
}

fn http_put(state: &mut KvState, key: &str, value: &str) -> Applied {
    let record = Command::Single(Operation::Put {
        key: b(key),
        value: b(value),
        condition: Condition::None,
    })
    .encode()
    .unwrap();
    state.apply(state.applied_end(), &record)
}

#[test]
fn the_revision_moves_once_per_record_that_changes_something() {
    let mut state = KvState::default();
    assert_eq!(state.revision(), 1);
    assert_eq!(apply_put(&mut state, "a", "1").header_revision, 2);
    // The same value again is a change.
    assert_eq!(apply_put(&mut state, "a", "1").header_revision, 3);
    let nothing = apply(&mut state, EtcdCommand::DeleteRange(delete("zz", "")));
    assert_eq!(
        nothing,
        Ok(EtcdResponse::DeleteRange(DeleteRangeResponse {
            header_revision: 3,
            deleted: 0,
            prev_kvs: Vec::new()
        }))
    );
    let read_only = apply_txn(
        &mut state,
        TxnRequest {
            success: vec![RequestOp::Range(get("a", ""))],
            ..TxnRequest::default()
        },
    );
    assert_eq!(read_only.header_revision, 3);
    // A failed compare whose branch only reads changes nothing either.
    let failed = apply_txn(
        &mut state,
        TxnRequest {
            compare: vec![compare(
                "a",
                CompareResult::Equal,
                CompareTarget::Version(9),
            )],
            success: vec![RequestOp::Put(put("b", "1"))],
            failure: vec![RequestOp::Range(get("b", ""))],
        },
    );
    assert!(!failed.succeeded);
    assert_eq!((failed.header_revision, state.revision()), (3, 3));
    // An HTTP write is a transaction in the same revision space.
    http_put(&mut state, "h", "1");
    assert_eq!(state.revision(), 4);
    let entry = state.get(b"h").unwrap();
    assert_eq!((entry.mod_revision, entry.create_revision), (4, 4));
    let a = state.get(b"a").unwrap();
    assert_eq!(
        (a.create_revision, a.mod_revision, a.version, a.lease),
        (2, 3, 2, 0)
    );
}

#[test]
fn one_transaction_is_one_revision_and_reads_see_its_earlier_writes() {
    let mut state = KvState::default();
    apply_put(&mut state, "a", "old");
    let response = apply_txn(
        &mut state,
        TxnRequest {
            compare: vec![compare(
                "a",
                CompareResult::Equal,
                CompareTarget::Value(b("old")),
            )],
            success: vec![
                RequestOp::Range(get("a", "")),
                RequestOp::Put(put("a", "new")),
                RequestOp::Range(get("a", "")),
                RequestOp::Put(put("b", "1")),
                RequestOp::DeleteRange(delete("nothing", "")),
                RequestOp::Range(RangeRequest {
                    revision: 2,
                    ..get("a", "")
                }),
                RequestOp::Txn(TxnRequest {
                    // Evaluated against the state before the transaction.
                    compare: vec![compare(
                        "b",
                        CompareResult::Equal,
                        CompareTarget::Version(0),
                    )],
                    success: vec![RequestOp::Put(put("c", "1"))],
                    failure: Vec::new(),
                }),
            ],
            failure: Vec::new(),
        },
    );
    assert!(response.succeeded);
    assert_eq!(response.header_revision, 3);
    let [
        ResponseOp::Range(before),
        ResponseOp::Put(put_a),
        ResponseOp::Range(after),
        ResponseOp::Put(_),
        ResponseOp::DeleteRange(nothing),
        ResponseOp::Range(past),
        ResponseOp::Txn(nested),
    ] = &response.responses[..]
    else {
        panic!("{response:?}")
    };
    // etcd: a read answers the revision being written once something changed.
    assert_eq!(
        (before.header_revision, before.kvs[0].value.as_ref()),
        (2, &b"old"[..])
    );
    assert_eq!(put_a.header_revision, 3);
    assert_eq!(
        (after.header_revision, after.kvs[0].value.as_ref()),
        (3, &b"new"[..])
    );
    // etcd's mvcc `DeleteRange` answers `beginRev + 1` when it deleted
    // something or the transaction changed anything before it (the real
    // etcd does so in tests/etcd_differential.rs).
    assert_eq!((nothing.header_revision, nothing.deleted), (3, 0));
    assert_eq!(past.kvs[0].value, b("old"));
    assert!(nested.succeeded);
    assert_eq!(nested.header_revision, 0, "etcd leaves nested headers at 0");
    for key in ["a", "b", "c"] {
        assert_eq!(state.get(key.as_bytes()).unwrap().mod_revision, 3, "{key}");
    }
    assert_eq!(state.get(b"a").unwrap().version, 2);
}

#[test]
fn a_delete_resets_the_version_and_a_new_put_creates_again() {
    let mut state = KvState::default();
    apply_put(&mut state, "k", "1");
    apply_put(&mut state, "k", "2");
    let deleted = apply(
        &mut state,
        EtcdCommand::DeleteRange(DeleteRangeRequest {
            prev_kv: true,
            ..delete("k", "")
        }),
    )
    .unwrap();
    let EtcdResponse::DeleteRange(deleted) = deleted else {
        panic!()
    };
    assert_eq!((deleted.header_revision, deleted.deleted), (4, 1));
    assert_eq!(deleted.prev_kvs[0].version, 2);
    apply_put(&mut state, "k", "3");
    let entry = state.get(b"k").unwrap();
    assert_eq!(
        (entry.create_revision, entry.mod_revision, entry.version),
        (5, 5, 1)
    );
    let prev = apply(
        &mut state,
        EtcdCommand::Put(PutRequest {
            prev_kv: true,
            ..put("k", "4")
        }),
    );
    let Ok(EtcdResponse::Put(prev)) = prev else {
        panic!()
    };
    assert_eq!(prev.prev_kv.unwrap().value, b("3"));
}

#[test]
fn compares_on_absent_keys_and_ranges_follow_etcd() {
    let mut state = KvState::default();
    apply_put(&mut state, "p/a", "1");
    apply_put(&mut state, "p/b", "1");
    let holds = |state: &KvState, compare: Compare| {
        state
            .plan(&TxnRequest {
                compare: vec![compare],
                ..TxnRequest::default()
            })
            .succeeded
    };
    use CompareResult::*;
    use CompareTarget::*;
    assert!(holds(&state, compare("x", Equal, Version(0))));
    assert!(holds(&state, compare("x", Equal, Create(0))));
    assert!(holds(&state, compare("x", Equal, Mod(0))));
    assert!(holds(&state, compare("x", Equal, Lease(0))));
    // A value compare fails on an absent key, whatever the relation.
    assert!(!holds(&state, compare("x", Equal, Value(Bytes::new()))));
    assert!(!holds(&state, compare("x", NotEqual, Value(b("v")))));
    assert!(holds(&state, compare("p/a", Less, Value(b("2")))));
    let range = |result, target| Compare {
        range_end: b("p0"),
        ..compare("p/", result, target)
    };
    assert!(holds(&state, range(Equal, Value(b("1")))));
    assert!(holds(&state, range(Less, Mod(4))));
    assert!(!holds(&state, range(Less, Mod(3))));
    assert!(holds(&state, range(Greater, Create(1))));
}

fn seeded(values: &[(&str, &str)]) -> KvState {
    let mut state = KvState::default();
    for (key, value) in values {
        apply_put(&mut state, key, value);
    }
    state
}

#[test]
fn range_limits_count_before_the_revision_filters() {
    // a@2, b@3, c@4, d@5, then b again @6.
    let mut state = seeded(&[("a", "1"), ("b", "1"), ("c", "1"), ("d", "1")]);
    apply_put(&mut state, "b", "2");
    let all = get("a", "\0");
    let limited = state
        .range(&RangeRequest {
            limit: 2,
            ..all.clone()
        })
        .unwrap();
    assert_eq!(
        (keys(&limited), limited.more, limited.count),
        (vec!["a".into(), "b".into()], true, 4)
    );
    assert_eq!(limited.header_revision, 6);
    let filtered = state
        .range(&RangeRequest {
            min_mod_revision: 4,
            limit: 1,
            ..all.clone()
        })
        .unwrap();
    // Count is every key in the range; more is judged after the filter.
    assert_eq!(
        (keys(&filtered), filtered.more, filtered.count),
        (vec!["b".into()], true, 4)
    );
    let narrow = state
        .range(&RangeRequest {
            max_create_revision: 3,
            min_create_revision: 3,
            ..all.clone()
        })
        .unwrap();
    assert_eq!(
        (keys(&narrow), narrow.more, narrow.count),
        (vec!["b".into()], false, 4)
    );
    let counted = state
        .range(&RangeRequest {
            count_only: true,
            limit: 1,
            ..all.clone()
        })
        .unwrap();
    assert_eq!(
        (counted.kvs.len(), counted.more, counted.count),
        (0, false, 4)
    );
    let keys_only = state
        .range(&RangeRequest {
            keys_only: true,
            ..get("b", "")
        })
        .unwrap();
    assert_eq!(
        (keys_only.kvs[0].value.len(), keys_only.kvs[0].version),
        (0, 2)
    );
    let prefix = state.range(&get("b", "c")).unwrap();
    assert_eq!(keys(&prefix), vec!["b".to_owned()]);
    let backwards = state.range(&get("c", "a")).unwrap();
    assert_eq!((backwards.kvs.len(), backwards.count), (0, 0));
    assert_eq!(state.range(&get("", "")), Err(EtcdError::EmptyKey));
}

#[test]
fn sorting_follows_etcds_order_and_limit_rules() {
    // Versions: a 3, b 2, c 1.
    let mut state = seeded(&[("a", "z"), ("a", "z"), ("a", "z"), ("b", "y"), ("b", "y")]);
    apply_put(&mut state, "c", "x");
    let sorted = |order, target, limit| {
        keys(
            &state
                .range(&RangeRequest {
                    sort_order: order,
                    sort_target: target,
                    limit,
                    ..get("a", "\0")
                })
                .unwrap(),
        )
    };
    use SortOrder::*;
    use SortTarget::*;
    assert_eq!(sorted(Ascend, Version, 0), ["c", "b", "a"]);
    assert_eq!(sorted(Descend, Version, 0), ["a", "b", "c"]);
    assert_eq!(sorted(Descend, Key, 0), ["c", "b", "a"]);
    assert_eq!(sorted(Ascend, Value, 0), ["c", "b", "a"]);
    assert_eq!(sorted(Descend, Create, 0), ["c", "b", "a"]);
    assert_eq!(sorted(Ascend, Mod, 0), ["a", "b", "c"]);
    // No order with a non-key target sorts ascending...
    assert_eq!(sorted(None, Version, 0), ["c", "b", "a"]);
    // ...but keeps the limit, so only the first limit + 1 keys (in key
    // order) are sorted: a and b, of which b has the lower version.
    assert_eq!(sorted(None, Version, 1), ["b"]);
    assert_eq!(sorted(Ascend, Version, 1), ["c"]);
    // Ties keep key order, ascending or descending.
    let tied = seeded(&[("x", "1"), ("y", "1"), ("z", "1")]);
    let response = tied
        .range(&RangeRequest {
            sort_order: Descend,
            sort_target: Version,
            ..get("x", "\0")
        })
        .unwrap();
    assert_eq!(keys(&response), ["x", "y", "z"]);
}

#[test]
fn past_revisions_answer_what_was_current_then() {
    let mut state = KvState::default();
    apply_put(&mut state, "a", "1"); // 2
    apply_put(&mut state, "b", "1"); // 3
    apply_put(&mut state, "a", "2"); // 4
    apply(&mut state, EtcdCommand::DeleteRange(delete("b", ""))).unwrap(); // 5
    let at = |state: &KvState, revision| {
        state.range(&RangeRequest {
            revision,
            ..get("a", "\0")
        })
    };
    let values = |response: RangeResponse| -> Vec<(String, i64)> {
        response
            .kvs
            .iter()
            .map(|kv| {
                (
                    String::from_utf8(kv.value.to_vec()).unwrap(),
                    kv.mod_revision,
                )
            })
            .collect()
    };
    assert_eq!(values(at(&state, 1).unwrap()), []);
    assert_eq!(
        values(at(&state, 3).unwrap()),
        [("1".into(), 2), ("1".into(), 3)]
    );
    assert_eq!(
        values(at(&state, 4).unwrap()),
        [("2".into(), 4), ("1".into(), 3)]
    );
    assert_eq!(values(at(&state, 5).unwrap()), [("2".into(), 4)]);
    assert_eq!(at(&state, 4).unwrap().header_revision, 5);
    assert_eq!(at(&state, 6), Err(EtcdError::FutureRevision));
    // Compaction: etcd's bounds, then reads below it are refused.
    let compact = |revision| {
        EtcdCommand::Compact(CompactionRequest {
            revision,
            physical: false,
        })
    };
    assert_eq!(
        apply(&mut state, compact(6)),
        Err(EtcdError::FutureRevision)
    );
    assert_eq!(
        apply(&mut state, compact(3)),
        Ok(EtcdResponse::Compact(CompactionResponse {
            header_revision: 5
        }))
    );
    assert_eq!(state.compact_revision(), 3);
    assert_eq!(apply(&mut state, compact(3)), Err(EtcdError::Compacted));
    assert_eq!(apply(&mut state, compact(2)), Err(EtcdError::Compacted));
    assert_eq!(at(&state, 2), Err(EtcdError::Compacted));
    assert_eq!(
        values(at(&state, 3).unwrap()),
        [("1".into(), 2), ("1".into(), 3)]
    );
    assert_eq!(state.revision(), 5, "a compaction is no change");
    // A range inside a transaction is checked before anything applies.
    let txn = TxnRequest {
        success: vec![
            RequestOp::Put(put("c", "1")),
            RequestOp::Range(RangeRequest {
                revision: 2,
                ..get("a", "")
            }),
        ],
        ..TxnRequest::default()
    };
    assert_eq!(
        apply(&mut state, EtcdCommand::Txn(txn)),
        Err(EtcdError::Compacted)
    );
    assert!(state.get(b"c").is_none());
    assert_eq!(state.revision(), 5);
}

#[test]
fn a_first_compaction_at_zero_is_accepted_as_etcd_accepts_it() {
    let mut state = KvState::default();
    let compact = |revision| {
        EtcdCommand::Compact(CompactionRequest {
            revision,
            physical: true,
        })
    };
    assert_eq!(
        apply(&mut state.clone(), compact(-1)),
        Err(EtcdError::Compacted)
    );
    assert!(apply(&mut state, compact(0)).is_ok());
    assert_eq!(apply(&mut state, compact(0)), Err(EtcdError::Compacted));
    assert!(apply(&mut state, compact(1)).is_ok());
}

#[test]
fn requests_are_refused_as_etcd_refuses_them() {
    let state = seeded(&[("a", "1")]);
    let refused = |command: EtcdCommand| command.validate(&state, DEFAULT_MAX_TXN_OPS).err();
    let txn = |success: Vec<RequestOp>| {
        EtcdCommand::Txn(TxnRequest {
            success,
            ..TxnRequest::default()
        })
    };
    use EtcdError::*;
    assert_eq!(refused(EtcdCommand::Put(put("", "v"))), Some(EmptyKey));
    assert_eq!(
        refused(EtcdCommand::DeleteRange(delete("", ""))),
        Some(EmptyKey)
    );
    let ignore_value = |key: &str, value: &str| PutRequest {
        ignore_value: true,
        ..put(key, value)
    };
    assert_eq!(
        refused(EtcdCommand::Put(ignore_value("a", "v"))),
        Some(ValueProvided)
    );
    assert_eq!(
        refused(EtcdCommand::Put(ignore_value("x", ""))),
        Some(KeyNotFound)
    );
    assert_eq!(refused(EtcdCommand::Put(ignore_value("a", ""))), None);
    let leased = PutRequest {
        lease: 7,
        ..put("a", "v")
    };
    assert_eq!(
        refused(EtcdCommand::Put(leased.clone())),
        Some(LeaseNotFound)
    );
    let ignore_lease = PutRequest {
        ignore_lease: true,
        ..leased.clone()
    };
    assert_eq!(refused(EtcdCommand::Put(ignore_lease)), Some(LeaseProvided));
    // Duplicate keys: puts, a put inside a deleted range, nested branches.
    let p = |key: &str| RequestOp::Put(put(key, "v"));
    let d = |key: &str, end: &str| RequestOp::DeleteRange(delete(key, end));
    let nested = |success, failure| {
        RequestOp::Txn(TxnRequest {
            success,
            failure,
            ..TxnRequest::default()
        })
    };
    assert_eq!(refused(txn(vec![p("k"), p("k")])), Some(DuplicateKey));
    assert_eq!(refused(txn(vec![d("a", "c"), p("b")])), Some(DuplicateKey));
    assert_eq!(refused(txn(vec![p("c"), d("a", "c")])), None);
    assert_eq!(refused(txn(vec![d("k", ""), p("k")])), Some(DuplicateKey));
    assert_eq!(
        refused(txn(vec![nested(vec![p("k")], vec![p("k")]), p("j")])),
        None
    );
    assert_eq!(
        refused(txn(vec![nested(vec![p("k")], vec![]), p("k")])),
        Some(DuplicateKey)
    );
    assert_eq!(
        refused(txn(vec![nested(vec![d("k", "")], vec![]), p("k")])),
        Some(DuplicateKey)
    );
    // etcd takes a from-key end literally: no conflict.
    assert_eq!(refused(txn(vec![d("a", "\0"), p("b")])), None);
    // The failure branch is checked on its own.
    let both = EtcdCommand::Txn(TxnRequest {
        success: vec![p("k")],
        failure: vec![p("k")],
        ..TxnRequest::default()
    });
    assert_eq!(refused(both), None);
    // Too many operations: the largest of compares and branches, and a
    // nested transaction's budget shrinks by its parent's.
    let many_named = |prefix: &str, count: usize| {
        (0..count)
            .map(|i| p(&format!("{prefix}{i}")))
            .collect::<Vec<_>>()
    };
    let many = |count: usize| many_named("k", count);
    assert_eq!(refused(txn(many(128))), None);
    assert_eq!(refused(txn(many(129))), Some(TooManyOps));
    // 128 - 1 (the outer txn) - 65 (the inner one) = 62 left for the innermost.
    let mut inner = many(64);
    inner.push(nested(many_named("n", 64), vec![]));
    assert_eq!(
        refused(txn(vec![nested(inner.clone(), vec![])])),
        Some(TooManyOps)
    );
    inner.pop();
    inner.push(nested(many_named("n", 62), vec![]));
    assert_eq!(refused(txn(vec![nested(inner, vec![])])), None);
    // The state-dependent checks look only at the taken branch.
    let untaken = EtcdCommand::Txn(TxnRequest {
        compare: vec![compare(
            "a",
            CompareResult::Equal,
            CompareTarget::Version(9),
        )],
        success: vec![RequestOp::Put(leased)],
        failure: vec![],
    });
    assert_eq!(refused(untaken), None);
    let empty_compare = EtcdCommand::Txn(TxnRequest {
        compare: vec![compare("", CompareResult::Equal, CompareTarget::Version(0))],
        ..TxnRequest::default()
    });
    assert_eq!(refused(empty_compare), Some(EmptyKey));
    let future = txn(vec![RequestOp::Range(RangeRequest {
        revision: 3,
        ..get("a", "")
    })]);
    assert_eq!(refused(future), Some(FutureRevision));
}

#[test]
fn a_refused_record_changes_nothing() {
    let mut state = seeded(&[("a", "1")]);
    let before = state.clone();
    let twice = EtcdCommand::Txn(TxnRequest {
        success: vec![RequestOp::Put(put("k", "1")), RequestOp::Put(put("k", "2"))],
        ..TxnRequest::default()
    });
    assert_eq!(apply(&mut state, twice), Err(EtcdError::DuplicateKey));
    assert_eq!(state.entries, before.entries);
    assert_eq!(state.history, before.history);
}

#[test]
fn snapshots_carry_revisions_and_history() {
    let mut state = seeded(&[("a", "1"), ("b", "2"), ("a", "3")]);
    apply(&mut state, EtcdCommand::DeleteRange(delete("b", ""))).unwrap();
    apply(
        &mut state,
        EtcdCommand::Compact(CompactionRequest {
            revision: 3,
            physical: false,
        }),
    )
    .unwrap();
    let restored = KvState::decode_snapshot(&state.encode_snapshot()).unwrap();
    assert_eq!(restored, state);
    assert_eq!(restored.history_bytes(), state.history_bytes());
    let encoded = state.encode_snapshot();
    for bit in 0..encoded.len() * 8 {
        let mut damaged = encoded.to_vec();
        damaged[bit / 8] ^= 1 << (bit % 8);
        assert!(KvState::decode_snapshot(&damaged).is_err(), "bit {bit}");
    }
}

#[test]
fn an_index_version_snapshot_maps_onto_revisions() {
    // Format 1: applied_end 3, a = "1" set by record 0, b = "22" by record 2.
    let bytes = super::tests::format_one_snapshot();
    let mut state = KvState::decode_snapshot(&bytes).unwrap();
    assert_eq!((state.revision(), state.compact_revision()), (3, 3));
    let b_entry = state.get(b"b").unwrap();
    assert_eq!(
        (
            b_entry.create_revision,
            b_entry.mod_revision,
            b_entry.version
        ),
        (3, 3, 1)
    );
    assert_eq!(state.get(b"a").unwrap().mod_revision, 1);
    let past = RangeRequest {
        revision: 2,
        ..get("a", "")
    };
    assert_eq!(state.range(&past), Err(EtcdError::Compacted));
    assert_eq!(apply_put(&mut state, "a", "x").header_revision, 4);
}

/// One step of the random workload.
#[derive(Debug, Clone)]
enum Step {
    Put(u8, u8),
    Delete(u8, u8),
    Txn(u8, u8, u8),
    Http(u8, u8),
    Compact(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..6u8, any::<u8>()).prop_map(|(k, v)| Step::Put(k, v)),
        2 => (0..6u8, 0..3u8).prop_map(|(k, n)| Step::Delete(k, n)),
        2 => (0..6u8, 0..6u8, any::<u8>()).prop_map(|(a, b, v)| Step::Txn(a, b, v)),
        1 => (0..6u8, any::<u8>()).prop_map(|(k, v)| Step::Http(k, v)),
        1 => any::<u8>().prop_map(Step::Compact),
    ]
}

fn key(k: u8) -> String {
    format!("k{k}")
}

/// A model: every revision's full map, built from scratch.
type Model = BTreeMap<String, (u8, i64, i64, i64)>;

fn model_apply(model: &Model, step: &Step, revision: i64) -> Option<Model> {
    let mut next = model.clone();
    let put = |next: &mut Model, k: u8, v: u8| {
        let (create, version) = next
            .get(&key(k))
            .map_or((revision, 1), |(_, c, _, ver)| (*c, ver + 1));
        next.insert(key(k), (v, create, revision, version));
    };
    match *step {
        Step::Put(k, v) | Step::Http(k, v) => put(&mut next, k, v),
        Step::Delete(k, n) => {
            let (start, end) = (key(k), key(k.saturating_add(n)));
            next.retain(|name, _| {
                if n == 0 {
                    *name != start
                } else {
                    *name < start || *name >= end
                }
            });
        }
        Step::Txn(a, b, v) => {
            // If a exists: put b; else put a.
            if model.contains_key(&key(a)) {
                put(&mut next, b, v);
            } else {
                put(&mut next, a, v);
            }
        }
        Step::Compact(_) => {}
    }
    (next != *model).then_some(next)
}

fn run_step(state: &mut KvState, step: &Step) {
    let p = |k: u8, v: u8| PutRequest {
        key: b(&key(k)),
        value: Bytes::from(vec![v]),
        ..PutRequest::default()
    };
    let command = match *step {
        Step::Put(k, v) => EtcdCommand::Put(p(k, v)),
        Step::Http(k, v) => {
            let record = Command::Single(Operation::Put {
                key: b(&key(k)),
                value: Bytes::from(vec![v]),
                condition: Condition::None,
            })
            .encode()
            .unwrap();
            state.apply(state.applied_end(), &record);
            return;
        }
        Step::Delete(k, n) => EtcdCommand::DeleteRange(DeleteRangeRequest {
            key: b(&key(k)),
            range_end: if n == 0 {
                Bytes::new()
            } else {
                b(&key(k.saturating_add(n)))
            },
            prev_kv: true,
        }),
        Step::Txn(a, b_, v) => EtcdCommand::Txn(TxnRequest {
            compare: vec![compare(
                &key(a),
                CompareResult::Greater,
                CompareTarget::Version(0),
            )],
            success: vec![RequestOp::Range(get(&key(a), "")), RequestOp::Put(p(b_, v))],
            failure: vec![RequestOp::Put(p(a, v))],
        }),
        Step::Compact(at) => {
            let revision = state.compact_revision() + i64::from(at % 4);
            EtcdCommand::Compact(CompactionRequest {
                revision,
                physical: false,
            })
        }
    };
    let _ = apply(state, command);
}

fn state_at(state: &KvState, revision: i64) -> Model {
    let response = state
        .range(&RangeRequest {
            revision,
            ..get("\0", "\0")
        })
        .unwrap();
    response
        .kvs
        .iter()
        .map(|kv| {
            let name = String::from_utf8(kv.key.to_vec()).unwrap();
            (
                name,
                (kv.value[0], kv.create_revision, kv.mod_revision, kv.version),
            )
        })
        .collect()
}

proptest! {
    #[test]
    fn every_retained_revision_reads_as_it_was(steps in prop::collection::vec(step(), 1..60)) {
        let mut state = KvState::default();
        let mut models: Vec<Model> = vec![Model::new(), Model::new()]; // revisions 0 and 1
        for step in &steps {
            let revision = state.revision();
            let changed = model_apply(&models[revision as usize], step, revision + 1);
            run_step(&mut state, step);
            match changed {
                Some(next) => {
                    prop_assert_eq!(state.revision(), revision + 1, "{:?}", step);
                    models.push(next);
                }
                None => prop_assert_eq!(state.revision(), revision, "{:?}", step),
            }
        }
        let restored = KvState::decode_snapshot(&state.encode_snapshot()).unwrap();
        prop_assert_eq!(&restored, &state);
        for revision in 1..=state.revision() {
            let expected = &models[revision as usize];
            if revision < state.compact_revision() {
                let past = RangeRequest { revision, ..get("\0", "\0") };
                prop_assert_eq!(state.range(&past), Err(EtcdError::Compacted));
                continue;
            }
            prop_assert_eq!(&state_at(&state, revision), expected, "revision {}", revision);
            prop_assert_eq!(&state_at(&restored, revision), expected);
        }
        let charged: usize = state.history().changes(0, state.revision())
            .flat_map(|(_, changes)| changes).map(mvcc::Change::charged_bytes).sum();
        prop_assert_eq!(state.history_bytes(), charged);
    }
}

#[test]
fn a_snapshot_keeps_a_key_changed_twice_in_one_transaction() {
    // A put then a from-key delete over the same key: etcd's duplicate check
    // lets it through, and the delete's previous entry is the put's, written
    // at the transaction's own revision.
    let mut state = KvState::default();
    apply_put(&mut state, "k", "old");
    let response = apply_txn(
        &mut state,
        TxnRequest {
            compare: Vec::new(),
            success: vec![
                RequestOp::Put(put("k", "new")),
                RequestOp::DeleteRange(delete("a", "\0")),
            ],
            failure: Vec::new(),
        },
    );
    assert_eq!(response.header_revision, 3);
    let restored = KvState::decode_snapshot(&state.encode_snapshot()).unwrap();
    assert_eq!(restored, state);
}

/// A read-only transaction answered from the state answers exactly what
/// the same transaction applied as a record answers, and changes nothing.
#[test]
fn a_read_only_transaction_read_from_the_state_answers_as_applied() {
    let mut state = KvState::default();
    apply_put(&mut state, "a", "1");
    apply_put(&mut state, "b", "2");
    apply_put(&mut state, "a", "3");
    for holds in [true, false] {
        let expected = if holds { b("3") } else { b("x") };
        let txn = TxnRequest {
            compare: vec![compare(
                "a",
                CompareResult::Equal,
                CompareTarget::Value(expected),
            )],
            success: vec![RequestOp::Range(get("a", "c"))],
            failure: vec![RequestOp::Range(RangeRequest {
                revision: 2,
                ..get("a", "")
            })],
        };
        let read = state.read_txn(&txn).unwrap();
        let before = state.clone();
        let applied = apply_txn(&mut state, txn);
        assert_eq!(read, applied);
        assert_eq!(read.succeeded, holds);
        assert_eq!(state.revision(), before.revision(), "a read writes nothing");
    }
    let future = TxnRequest {
        success: vec![RequestOp::Range(RangeRequest {
            revision: 9,
            ..get("a", "")
        })],
        ..TxnRequest::default()
    };
    assert_eq!(state.read_txn(&future), Err(EtcdError::FutureRevision));
}
