//! What a snapshot's checkpoint costs: the copy of the key-value state the
//! runtime takes while writes wait (`StateMachine::checkpoint`), for a
//! state of 100,000 keys of 1 KiB after 300,000 puts, its history filled to
//! the retention budget.
//!
//! `cargo bench -p chorus --bench checkpoint`; under `cargo test` it runs
//! once.

use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::{Command, Condition, KvState, Operation};
use chorus::runtime::StateMachine;
use criterion::{Criterion, criterion_group, criterion_main};

const KEYS: u64 = 100_000;
const PUTS: u64 = 300_000;
const VALUE_BYTES: usize = 1024;

fn filled_state() -> KvState {
    let mut state = KvState::default();
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    for i in 0..PUTS {
        let record = Command::Single(Operation::Put {
            key: Bytes::from(format!("key-{:06}", i % KEYS)),
            value: value.clone(),
            condition: Condition::None,
        })
        .encode()
        .expect("a put encodes");
        state.apply(RecordIndex(i), &record);
    }
    state
}

fn checkpoint(c: &mut Criterion) {
    let state = filled_state();
    let mut group = c.benchmark_group("checkpoint");
    group.sample_size(10);
    group.bench_function("kv_100k_keys_300k_puts", |b| {
        // The copy is dropped outside the timing, as the runtime drops it
        // off the state lock after encoding.
        b.iter_with_large_drop(|| state.checkpoint())
    });
    group.finish();
}

criterion_group!(benches, checkpoint);
criterion_main!(benches);
