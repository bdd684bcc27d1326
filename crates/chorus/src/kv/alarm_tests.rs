//! etcd's alarms, space accounting and HashKV in the machine.

use super::etcd::*;
use super::etcd_test_support::{apply, b};
use super::*;

fn put(key: &str, value: &str) -> EtcdCommand {
    EtcdCommand::Put(PutRequest {
        key: b(key),
        value: b(value),
        ..PutRequest::default()
    })
}

fn alarm(action: AlarmAction, member_id: u64) -> EtcdCommand {
    EtcdCommand::Alarm(AlarmRequest {
        action,
        member: AlarmMember {
            member_id,
            alarm: AlarmType::NoSpace,
        },
    })
}

fn txn_putting(key: &str) -> EtcdCommand {
    EtcdCommand::Txn(TxnRequest {
        compare: vec![],
        success: vec![],
        failure: vec![RequestOp::Put(PutRequest {
            key: b(key),
            ..PutRequest::default()
        })],
    })
}

#[test]
fn the_quota_charges_what_etcd_charges() {
    assert_eq!(put("ab", "cde").quota_cost(), 256 + 5);
    // The larger branch's direct puts; nested transactions are free.
    let nested = EtcdCommand::Txn(TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Txn(TxnRequest::default())],
        failure: vec![],
    });
    assert_eq!(nested.quota_cost(), 0);
    assert_eq!(txn_putting("k").quota_cost(), 257);
    let grant = EtcdCommand::LeaseGrant(LeaseGrantRequest { id: 1, ttl: 10 });
    assert_eq!(grant.quota_cost(), 64);
    let delete = EtcdCommand::DeleteRange(DeleteRangeRequest {
        key: b("k"),
        ..DeleteRangeRequest::default()
    });
    assert_eq!(delete.quota_cost(), 0);
}

#[test]
fn nospace_refuses_what_adds_data_until_it_is_cleared() {
    let mut state = KvState::default();
    apply(&mut state, put("k", "v")).unwrap();
    let raised = apply(&mut state, alarm(AlarmAction::Activate, 9)).unwrap();
    let EtcdResponse::Alarm(raised) = raised else {
        panic!("{raised:?}")
    };
    assert_eq!(raised.alarms.len(), 1);
    assert!(state.out_of_space());
    assert_eq!(apply(&mut state, put("j", "v")), Err(EtcdError::NoSpace));
    assert_eq!(apply(&mut state, txn_putting("j")), Err(EtcdError::NoSpace));
    let grant = EtcdCommand::LeaseGrant(LeaseGrantRequest { id: 1, ttl: 10 });
    assert_eq!(apply(&mut state, grant), Err(EtcdError::NoSpace));
    // Deletes and compactions free space, so they are served.
    let delete = EtcdCommand::DeleteRange(DeleteRangeRequest {
        key: b("k"),
        ..DeleteRangeRequest::default()
    });
    apply(&mut state, delete).unwrap();
    let compact = EtcdCommand::Compact(CompactionRequest {
        revision: state.revision(),
        physical: true,
    });
    apply(&mut state, compact).unwrap();
    // A snapshot keeps the alarm.
    let restored = KvState::decode_snapshot(&state.encode_snapshot()).unwrap();
    assert_eq!(restored, state);
    assert!(restored.out_of_space());
    // Clearing another member's alarm clears nothing; clearing ours does.
    let EtcdResponse::Alarm(other) = apply(&mut state, alarm(AlarmAction::Deactivate, 8)).unwrap()
    else {
        panic!("an alarm answer")
    };
    assert!(other.alarms.is_empty());
    apply(&mut state, alarm(AlarmAction::Deactivate, 9)).unwrap();
    assert!(!state.out_of_space());
    apply(&mut state, put("j", "v")).unwrap();
}

#[test]
fn the_size_counts_current_keys_and_values_and_survives_a_snapshot() {
    let mut state = KvState::default();
    apply(&mut state, put("a", "1234")).unwrap();
    apply(&mut state, put("bb", "1")).unwrap();
    apply(&mut state, put("a", "12")).unwrap();
    assert_eq!(state.size_bytes(), (1 + 2) + (2 + 1));
    let delete = EtcdCommand::DeleteRange(DeleteRangeRequest {
        key: b("bb"),
        ..DeleteRangeRequest::default()
    });
    apply(&mut state, delete).unwrap();
    assert_eq!(state.size_bytes(), 3);
    let restored = KvState::decode_snapshot(&state.encode_snapshot()).unwrap();
    assert_eq!(restored.size_bytes(), 3);
}

#[test]
fn hash_kv_is_the_same_for_the_same_history_and_moves_with_it() {
    let mut state = KvState::default();
    apply(&mut state, put("a", "1")).unwrap();
    apply(&mut state, put("b", "2")).unwrap();
    let (at_three, compacted, hashed) = state.hash_kv(0).unwrap();
    assert_eq!((compacted, hashed), (0, 3));
    let restored = KvState::decode_snapshot(&state.encode_snapshot()).unwrap();
    assert_eq!(restored.hash_kv(0).unwrap().0, at_three);
    apply(&mut state, put("a", "changed")).unwrap();
    assert_ne!(state.hash_kv(0).unwrap().0, at_three);
    // A past revision hashes as it did then, whatever came after.
    assert_eq!(state.hash_kv(3).unwrap().0, at_three);
    assert_eq!(state.hash_kv(5), Err(EtcdError::FutureRevision));
    let compact = EtcdCommand::Compact(CompactionRequest {
        revision: 4,
        physical: true,
    });
    apply(&mut state, compact).unwrap();
    assert_eq!(state.hash_kv(3), Err(EtcdError::Compacted));
    assert_eq!(state.hash_kv(0).unwrap().1, 4);
}
