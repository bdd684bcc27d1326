//! etcd's leases in the machine, against etcd v3.4's answers.

use bytes::Bytes;

use super::etcd::*;
use super::etcd_test_support::{apply, b};
use super::lease::{MAX_LEASE_TTL_SECS, MIN_LEASE_TTL_SECS, SERVER_LEASE_ID_BASE};
use super::*;

fn grant(state: &mut KvState, id: i64, ttl: i64) -> Result<LeaseGrantResponse, EtcdError> {
    match apply(
        state,
        EtcdCommand::LeaseGrant(LeaseGrantRequest { id, ttl }),
    )? {
        EtcdResponse::LeaseGrant(response) => Ok(response),
        other => panic!("{other:?}"),
    }
}

fn revoke(state: &mut KvState, id: i64) -> Result<LeaseRevokeResponse, EtcdError> {
    match apply(state, EtcdCommand::LeaseRevoke(LeaseRevokeRequest { id }))? {
        EtcdResponse::LeaseRevoke(response) => Ok(response),
        other => panic!("{other:?}"),
    }
}

fn put(key: &str, lease: i64) -> EtcdCommand {
    EtcdCommand::Put(PutRequest {
        key: b(key),
        value: b("v"),
        lease,
        ..PutRequest::default()
    })
}

fn attached(state: &KvState, id: i64) -> Vec<Bytes> {
    state
        .leases()
        .get(id)
        .unwrap()
        .keys
        .iter()
        .cloned()
        .collect()
}

#[test]
fn grants_choose_ids_raise_short_ttls_and_move_no_revision() {
    let mut state = KvState::default();
    let chosen = grant(&mut state, 0, 1).unwrap();
    assert_eq!(chosen.id, SERVER_LEASE_ID_BASE);
    assert_eq!(
        (chosen.ttl, chosen.header_revision),
        (MIN_LEASE_TTL_SECS, 1)
    );
    let named = grant(&mut state, 7, 60).unwrap();
    assert_eq!((named.id, named.ttl), (7, 60));
    assert_eq!(state.revision(), 1, "a grant changes no key");
    assert_eq!(grant(&mut state, 7, 60), Err(EtcdError::LeaseExists));
    assert_eq!(
        grant(&mut state, 8, MAX_LEASE_TTL_SECS + 1),
        Err(EtcdError::LeaseTtlTooLarge)
    );
    // etcd checks the TTL before the id.
    assert_eq!(
        grant(&mut state, 7, MAX_LEASE_TTL_SECS + 1),
        Err(EtcdError::LeaseTtlTooLarge)
    );
    let ids: Vec<i64> = state.leases().iter().map(|(id, _)| id).collect();
    assert_eq!(ids, vec![7, SERVER_LEASE_ID_BASE]);
}

#[test]
fn puts_attach_keys_and_moves_detach_them() {
    let mut state = KvState::default();
    grant(&mut state, 1, 10).unwrap();
    grant(&mut state, 2, 10).unwrap();
    assert_eq!(
        apply(&mut state, put("k", 3)),
        Err(EtcdError::LeaseNotFound)
    );
    apply(&mut state, put("k", 1)).unwrap();
    apply(&mut state, put("j", 1)).unwrap();
    assert_eq!(attached(&state, 1), vec![b("j"), b("k")]);
    assert_eq!(state.get(b"k").unwrap().lease, 1);
    // A put naming another lease moves the key; ignore_lease keeps it.
    apply(&mut state, put("k", 2)).unwrap();
    assert_eq!(
        (attached(&state, 1), attached(&state, 2)),
        (vec![b("j")], vec![b("k")])
    );
    let keep = EtcdCommand::Put(PutRequest {
        key: b("k"),
        value: b("w"),
        ignore_lease: true,
        ..PutRequest::default()
    });
    apply(&mut state, keep).unwrap();
    assert_eq!(state.get(b"k").unwrap().lease, 2);
    // A put without a lease, and a delete, detach.
    apply(&mut state, put("k", 0)).unwrap();
    assert!(attached(&state, 2).is_empty());
    let delete = EtcdCommand::DeleteRange(DeleteRangeRequest {
        key: b("j"),
        ..DeleteRangeRequest::default()
    });
    apply(&mut state, delete).unwrap();
    assert!(attached(&state, 1).is_empty());
}

#[test]
fn a_revoke_deletes_its_keys_at_one_revision() {
    let mut state = KvState::default();
    grant(&mut state, 1, 10).unwrap();
    for key in ["b", "a", "c"] {
        apply(&mut state, put(key, 1)).unwrap();
    }
    apply(&mut state, put("other", 0)).unwrap();
    let before = state.revision();
    let revoked = revoke(&mut state, 1).unwrap();
    assert_eq!(revoked.header_revision, before + 1);
    assert_eq!(revoked.deleted, 3);
    assert_eq!(state.revision(), before + 1);
    assert!(state.leases().get(1).is_none());
    let changes: Vec<(Revision, Vec<Bytes>)> = state
        .history()
        .changes(before + 1, before + 1)
        .map(|(at, changes)| (at, changes.iter().map(|c| c.key.clone()).collect()))
        .collect();
    assert_eq!(changes, vec![(before + 1, vec![b("a"), b("b"), b("c")])]);
    assert!(state.get(b"other").is_some());
    // A lease with no key revokes without a revision; an unknown one is refused.
    grant(&mut state, 2, 10).unwrap();
    let empty = revoke(&mut state, 2).unwrap();
    assert_eq!((empty.header_revision, empty.deleted), (before + 1, 0));
    assert_eq!(revoke(&mut state, 2), Err(EtcdError::LeaseNotFound));
    assert_eq!(revoke(&mut state, 0), Err(EtcdError::LeaseNotFound));
}

#[test]
fn transactions_check_and_compare_leases() {
    let mut state = KvState::default();
    grant(&mut state, 5, 10).unwrap();
    apply(&mut state, put("k", 5)).unwrap();
    let on_lease = |lease| Compare {
        key: b("k"),
        range_end: Bytes::new(),
        result: CompareResult::Equal,
        target: CompareTarget::Lease(lease),
    };
    let txn = |compare, lease| {
        EtcdCommand::Txn(TxnRequest {
            compare: vec![compare],
            success: vec![RequestOp::Put(PutRequest {
                key: b("t"),
                lease,
                ..PutRequest::default()
            })],
            failure: vec![],
        })
    };
    let Ok(EtcdResponse::Txn(held)) = apply(&mut state, txn(on_lease(5), 5)) else {
        panic!("a put on a live lease applies")
    };
    assert!(held.succeeded);
    assert_eq!(attached(&state, 5), vec![b("k"), b("t")]);
    assert_eq!(
        apply(&mut state, txn(on_lease(5), 6)),
        Err(EtcdError::LeaseNotFound)
    );
    // The branch not taken is not checked.
    let Ok(EtcdResponse::Txn(failed)) = apply(&mut state, txn(on_lease(6), 6)) else {
        panic!("the put on an unknown lease is in the branch not taken")
    };
    assert!(!failed.succeeded);
}

#[test]
fn leases_survive_a_snapshot_and_a_dangling_key_is_refused() {
    let mut state = KvState::default();
    grant(&mut state, 1, 10).unwrap();
    grant(&mut state, 0, 30).unwrap();
    apply(&mut state, put("k", 1)).unwrap();
    let restored = KvState::decode_snapshot(&state.encode_snapshot()).unwrap();
    assert_eq!(restored, state);
    assert_eq!(attached(&restored, 1), vec![b("k")]);
    // The same state without its lease section's first lease: k dangles.
    let mut without = state.clone();
    without.leases.remove(1);
    let error = KvState::decode_snapshot(&without.encode_snapshot()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("a lease the snapshot does not hold"),
        "{error}"
    );
}

#[test]
fn an_http_put_detaches_a_key_and_a_revoke_spares_it() {
    let mut state = KvState::default();
    grant(&mut state, 1, 10).unwrap();
    apply(&mut state, put("k", 1)).unwrap();
    apply(&mut state, put("j", 1)).unwrap();
    let http_put = Command::Single(Operation::Put {
        key: b("k"),
        value: b("from http"),
        condition: Condition::None,
    });
    state.apply(state.applied_end(), &http_put.encode().unwrap());
    assert_eq!(state.get(b"k").unwrap().lease, 0);
    assert_eq!(attached(&state, 1), vec![b("j")]);
    assert_eq!(revoke(&mut state, 1).unwrap().deleted, 1);
    assert!(state.get(b"k").is_some() && state.get(b"j").is_none());
}
