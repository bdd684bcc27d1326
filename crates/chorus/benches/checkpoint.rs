//! What a snapshot's checkpoint costs: the copy of the key-value state the
//! runtime takes while writes wait (`StateMachine::checkpoint`), for a
//! state of 100,000 keys of 1 KiB after 300,000 puts, its history filled to
//! the retention budget; for one that remembers 100,000 idempotency keys;
//! and for one with 1,000 etcd leases holding 100,000 keys between them.
//!
//! `cargo bench -p chorus --bench checkpoint`; under `cargo test` it runs
//! once, on states with a hundredth of those puts.

use std::cell::OnceCell;

use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::etcd::{LeaseGrantRequest, PutRequest};
use chorus::kv::{
    Body, Command, Condition, EtcdCommand, IdempotencyKey, KvState, Operation, Record, Retention,
    Stamp,
};
use chorus::runtime::StateMachine;
use criterion::{Criterion, criterion_group, criterion_main};

const KEYS: u64 = 100_000;
const PUTS: u64 = 300_000;
const VALUE_BYTES: usize = 1024;

fn filled_state() -> KvState {
    let mut state = KvState::default();
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    for i in 0..scaled(PUTS) {
        let put = Command::Single(Operation::Put {
            key: Bytes::from(format!("key-{:06}", i % scaled(KEYS))),
            value: value.clone(),
            condition: Condition::None,
        });
        apply(&mut state, i, None, Body::Command(put));
    }
    state
}

/// `n`, or a hundredth of it outside `cargo bench`.
fn scaled(n: u64) -> u64 {
    if std::env::args().any(|arg| arg == "--bench") {
        n
    } else {
        n / 100
    }
}

fn apply(state: &mut KvState, index: u64, stamp: Option<Stamp>, body: Body) {
    let record = Record { stamp, body }.encode().expect("a record encodes");
    state.apply(RecordIndex(index), &record);
}

fn small_put(key: String) -> Command {
    Command::Single(Operation::Put {
        key: Bytes::from(key),
        value: Bytes::from_static(b"0123456789abcdef"),
        condition: Condition::None,
    })
}

/// 100,000 puts, each with its own idempotency key, all remembered.
fn remembering_state() -> KvState {
    let mut state = KvState::default();
    for i in 0..scaled(100_000) {
        let stamp = Stamp {
            key: IdempotencyKey::new(format!("request-{i:08}")).expect("a valid key"),
            at_ms: 1_000 + i,
            retention: Retention::default(),
        };
        apply(
            &mut state,
            i,
            Some(stamp),
            Body::Command(small_put(format!("key-{i:06}"))),
        );
    }
    assert_eq!(state.idempotency().len() as u64, scaled(100_000));
    state
}

/// 1,000 leases, 100,000 keys attached to them in turn.
fn leased_state() -> KvState {
    const LEASES: i64 = 1_000;
    let mut state = KvState::default();
    for id in 1..=LEASES {
        let grant = EtcdCommand::LeaseGrant(LeaseGrantRequest { id, ttl: 60 });
        apply(&mut state, id as u64, None, Body::Etcd(grant));
    }
    for i in 0..scaled(100_000) {
        let put = EtcdCommand::Put(PutRequest {
            key: Bytes::from(format!("key-{i:06}")),
            value: Bytes::from_static(b"0123456789abcdef"),
            lease: 1 + (i as i64 % LEASES),
            ..PutRequest::default()
        });
        apply(&mut state, LEASES as u64 + 1 + i, None, Body::Etcd(put));
    }
    assert_eq!(state.leases().len() as i64, LEASES);
    assert_eq!(state.len() as u64, scaled(100_000));
    state
}

fn checkpoint(c: &mut Criterion) {
    let mut group = c.benchmark_group("checkpoint");
    group.sample_size(10);
    let cells = [
        ("kv_100k_keys_300k_puts", filled_state as fn() -> KvState),
        ("remembering_100k_idempotency_keys", remembering_state),
        ("leases_1k_holding_100k_keys", leased_state),
    ];
    for (name, build) in cells {
        // Built on first use, so a run filtered to one cell builds one state.
        let state = OnceCell::new();
        // The copy is dropped outside the timing, as the runtime drops it
        // off the state lock after encoding.
        group.bench_function(name, |b| {
            let state = state.get_or_init(build);
            b.iter_with_large_drop(|| state.checkpoint())
        });
    }
    group.finish();
}

criterion_group!(benches, checkpoint);
criterion_main!(benches);
