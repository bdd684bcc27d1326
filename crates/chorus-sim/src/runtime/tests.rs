//! The checkers catch what they claim to catch, fed directly.

use std::time::Duration;

use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::etcd::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest,
};
use chorus::kv::lease::SERVER_LEASE_ID_BASE;
use chorus::kv::{Applied, Condition, IdempotencyKey, KvState, Outcome};
use chorus::kv::{EtcdCommand, EtcdResponse};
use chorus::lease::{DatabaseKey, Generation, HolderId, Incarnation, LeaseRecord, Term};
use chorus::runtime::{Change, Phase, RuntimeError};
use chorus::snapshot::{Head, PayloadId, PublicationSequence, PublisherId, Sha256Digest};

use super::RuntimePhase;
use super::check::{KeyedOp, PutState};
use super::etcd::draw_request;
use super::etcd_model::{EtcdModel, Known};
use super::mvcc::{Answers, Digests};
use super::workload::{WriteKind, increment, prepare, put};
use crate::trace::Trace;

fn bytes(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

/// A phase whose clocks agree.
async fn phase(trace: &mut Trace) -> RuntimePhase<'_> {
    let mut phase = RuntimePhase::new(1, trace).await;
    phase.settings.timing.max_skew_ms = 0;
    phase
}

/// The record of a put of `key` that `phase` knows as pending.
fn put_record(phase: &mut RuntimePhase<'_>, key: &str, value: &str) -> Bytes {
    phase.puts.insert(bytes(key), PutState::Pending);
    phase.put_values.insert(bytes(key), bytes(value));
    put(&bytes(key), &bytes(value), Condition::Absent)
        .encode()
        .unwrap()
}

fn state_with(records: &[(u64, &Bytes)]) -> KvState {
    let mut state = KvState::default();
    for (index, record) in records {
        state.apply(RecordIndex(*index), record);
    }
    state
}

#[tokio::test(start_paused = true)]
async fn a_state_that_lost_an_acknowledged_put_is_caught() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    let a = put_record(&mut phase, "a", "1");
    let b = put_record(&mut phase, "b", "2");
    phase.puts.insert(bytes("a"), PutState::Acked(0));
    phase.puts.insert(bytes("b"), PutState::Acked(1));
    let whole = state_with(&[(0, &a), (1, &b)]);
    phase.check_state(&whole, 2, "whole").unwrap();
    // Below its index, the put need not be there yet.
    phase
        .check_state(&state_with(&[(0, &a)]), 1, "prefix")
        .unwrap();
    let lost = state_with(&[(0, &a)]);
    let error = phase.check_state(&lost, 2, "lost").unwrap_err();
    assert!(error.contains("lost the put"), "{error}");
    // The right value at another index is a different write.
    let moved = state_with(&[(0, &a), (2, &b)]);
    let error = phase.check_state(&moved, 3, "moved").unwrap_err();
    assert!(error.contains("lost the put"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_state_holding_a_put_that_never_committed_is_caught() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    let a = put_record(&mut phase, "a", "1");
    phase.puts.insert(bytes("a"), PutState::NotCommitted);
    let error = phase
        .check_state(&state_with(&[(0, &a)]), 1, "state")
        .unwrap_err();
    assert!(error.contains("failed without committing"), "{error}");
    let error = phase.on_applied(0, 0, &a, &Applied::done(2)).unwrap_err();
    assert!(error.contains("failed"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn processes_that_apply_different_records_at_one_index_are_caught() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    let a = put_record(&mut phase, "a", "1");
    let b = put_record(&mut phase, "b", "2");
    phase.on_applied(0, 0, &a, &Applied::done(2)).unwrap();
    phase.on_applied(1, 0, &a, &Applied::done(2)).unwrap();
    let error = phase.on_applied(1, 0, &b, &Applied::done(2)).unwrap_err();
    assert!(error.contains("another process applied"), "{error}");
    // One write applied at two indices is a duplicate.
    let error = phase.on_applied(0, 1, &a, &Applied::done(2)).unwrap_err();
    assert!(error.contains("indices 0 and 1"), "{error}");
    // An applied record must agree with the ack at its index.
    phase.acked.insert(2, b.clone());
    let c = put_record(&mut phase, "c", "3");
    let error = phase.on_applied(0, 2, &c, &Applied::done(2)).unwrap_err();
    assert!(error.contains("was acknowledged"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_counter_below_an_acknowledged_increment_is_caught() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    let first = increment(&KvState::default()).encode().unwrap();
    let state = state_with(&[(0, &first)]);
    let second = increment(&state).encode().unwrap();
    phase.acked_increments.insert(1, 0);
    phase.acked_increments.insert(2, 1);
    phase
        .check_state(&state_with(&[(0, &first), (1, &second)]), 2, "both")
        .unwrap();
    let error = phase.check_state(&state, 2, "one").unwrap_err();
    assert!(error.contains("counter"), "{error}");
}

/// A keyed operation `phase` knows, and the record of an attempt of it
/// stamped at `at_ms`, prepared against an empty table.
fn keyed_attempt(phase: &mut RuntimePhase<'_>, at_ms: u64) -> (IdempotencyKey, Bytes) {
    let key = IdempotencyKey::new("op-000001").unwrap();
    let op = KeyedOp {
        target: bytes("x000001"),
        value: bytes("o1"),
        first: None,
    };
    let record = prepare(&op.attempt(&key), &KvState::default(), at_ms).unwrap();
    phase.keyed.insert(key.clone(), op);
    (key, record)
}

#[tokio::test(start_paused = true)]
async fn a_keyed_retry_applied_twice_is_caught() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    let (_, first) = keyed_attempt(&mut phase, 1);
    let (_, retry) = keyed_attempt(&mut phase, 2);
    assert_ne!(first, retry, "each attempt carries its writer's time");
    let no_op = Applied::Duplicate {
        original: RecordIndex(0),
        outcome: Outcome::Done { revision: 2 },
    };
    phase.on_applied(0, 0, &first, &Applied::done(2)).unwrap();
    phase.on_applied(1, 0, &first, &Applied::done(2)).unwrap();
    phase.on_applied(0, 1, &retry, &no_op).unwrap();
    // Another process applies the retry as a write of its own.
    let error = phase
        .on_applied(1, 1, &retry, &Applied::done(2))
        .unwrap_err();
    assert!(error.contains("a retry applied twice"), "{error}");
    // A no-op naming another index than the first application.
    let elsewhere = Applied::Duplicate {
        original: RecordIndex(7),
        outcome: Outcome::Done { revision: 2 },
    };
    let error = phase.on_applied(1, 9, &retry, &elsewhere).unwrap_err();
    assert!(error.contains("exactly-once"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_state_that_forgot_or_reapplied_a_keyed_put_is_caught() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    let (_, first) = keyed_attempt(&mut phase, 1);
    phase.on_applied(0, 0, &first, &Applied::done(2)).unwrap();
    let remembered = state_with(&[(0, &first)]);
    phase.check_state(&remembered, 1, "remembered").unwrap();
    // The same put without its key: the table does not remember it.
    let unkeyed = put(&bytes("x000001"), &bytes("o1"), Condition::None)
        .encode()
        .unwrap();
    let forgot = state_with(&[(0, &unkeyed)]);
    let error = phase.check_state(&forgot, 1, "forgot").unwrap_err();
    assert!(error.contains("should remember"), "{error}");
    // The put applied again later: its version moved.
    let again = state_with(&[(0, &first), (1, &unkeyed)]);
    let error = phase.check_state(&again, 2, "again").unwrap_err();
    assert!(error.contains("exactly-once"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_keyed_attempt_is_answered_from_the_table_once_its_key_applied() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    let (key, first) = keyed_attempt(&mut phase, 1);
    let state = state_with(&[(0, &first)]);
    let attempt = phase.keyed[&key].attempt(&key);
    assert_eq!(
        prepare(&attempt, &state, 5),
        Err(Applied::Duplicate {
            original: RecordIndex(0),
            outcome: Outcome::Done { revision: 2 }
        })
    );
    // The same key for another put is refused, not answered.
    let other = WriteKind::Keyed {
        key,
        target: bytes("x000002"),
        value: bytes("o2"),
    };
    assert!(matches!(
        prepare(&other, &state, 5),
        Err(Applied::KeyReused { .. })
    ));
}

fn lease(holder: &str, generation: u64, released: bool) -> LeaseRecord {
    LeaseRecord {
        database_key: DatabaseKey::new("simkv").unwrap(),
        holder_id: HolderId::new(holder).unwrap(),
        incarnation: Some(Incarnation(generation.into())),
        term: Term(1),
        generation: Generation(generation),
        acquired_at_ms: 0,
        expires_at_ms: 1,
        released,
    }
}

fn head(holder: &str, generation: u64, sequence: u64) -> Head {
    Head {
        database_key: DatabaseKey::new("simkv").unwrap(),
        holder_id: HolderId::new(holder).unwrap(),
        term: Term(1),
        lease_generation: Generation(generation),
        publication_sequence: PublicationSequence(sequence),
        snapshot: PayloadId {
            generation: Generation(generation),
            sequence: PublicationSequence(sequence),
        },
        wal_index: RecordIndex(0),
        payload_size_bytes: 0,
        payload_sha256: Sha256Digest::of(b""),
        publisher_id: PublisherId(0),
        updated_at_ms: 0,
    }
}

#[tokio::test(start_paused = true)]
async fn a_head_written_under_a_superseded_lease_is_caught() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    let window = phase.settings.snapshot.head_call_timeout;
    let second = Duration::from_secs(1);
    phase.on_lease_landed(Duration::ZERO, lease("a", 1, false));
    phase.on_head_landed(second, head("a", 1, 1)).unwrap();
    phase.on_lease_landed(10 * second, lease("b", 2, false));
    // Sent while a's lease vouched, landed just after it ended: allowed.
    let late = 10 * second + window / 2;
    phase.on_head_landed(late, head("a", 1, 2)).unwrap();
    assert_eq!(phase.stats.late_head_writes, 1);
    // Later than any call could take: fenced publication.
    let error = phase
        .on_head_landed(10 * second + window * 2, head("a", 1, 3))
        .unwrap_err();
    assert!(error.contains("fenced publication"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn head_history_must_move_forward() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    phase.on_lease_landed(Duration::ZERO, lease("a", 1, false));
    phase
        .on_head_landed(Duration::ZERO, head("a", 1, 2))
        .unwrap();
    let error = phase
        .on_head_landed(Duration::ZERO, head("a", 1, 2))
        .unwrap_err();
    assert!(error.contains("HEAD history"), "{error}");
    let error = phase
        .on_head_landed(Duration::ZERO, head("b", 2, 3))
        .unwrap_err();
    assert!(error.contains("lease document's token"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_stops_unasked_or_with_an_error_is_caught() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    let holder = HolderId::new("n0-1").unwrap();
    phase.on_stopped(0, &holder, true, Ok(())).unwrap();
    let error = phase.on_stopped(0, &holder, false, Ok(())).unwrap_err();
    assert!(error.contains("no shutdown asked for"), "{error}");
    // A damaged read is no reason to stop, whatever the runtime classes it
    // as, nor is one during a shutdown.
    let damaged = RuntimeError {
        phase: Phase::ObserveHead,
        message: "HEAD.json: checksum mismatch".into(),
        transient: false,
    };
    for asked in [false, true] {
        let error = phase
            .on_stopped(0, &holder, asked, Err(damaged.clone()))
            .unwrap_err();
        assert!(error.contains("should have retried"), "{error}");
    }
}

fn etcd_put(key: &str, value: &str) -> Bytes {
    EtcdCommand::Put(PutRequest {
        key: bytes(key),
        value: bytes(value),
        prev_kv: true,
        ..PutRequest::default()
    })
    .encode()
}

/// `records` applied from index 0, with the change each one made.
fn applied(records: &[Bytes]) -> (KvState, Vec<Change<Applied>>) {
    let mut state = KvState::default();
    let mut changes = Vec::new();
    for (index, record) in records.iter().enumerate() {
        let output = state.apply(RecordIndex(index as u64), record);
        changes.push(Change {
            index: RecordIndex(index as u64),
            record: record.clone(),
            output,
            revision: state.revision() as u64,
        });
    }
    (state, changes)
}

#[test]
fn etcd_answers_that_differ_or_name_another_revision_are_caught() {
    let (_, changes) = applied(&[etcd_put("e/a", "1"), etcd_put("e/a", "2")]);
    let second = &changes[1];
    let mut answers = Answers::default();
    answers.on_applied(0, &changes[0]).unwrap();
    answers.on_applied(0, second).unwrap();
    answers.on_applied(1, second).unwrap();
    answers.on_acked(1, &second.output).unwrap();
    assert_eq!(answers.compared, 2);
    // Another process answering otherwise (no prev_kv), or the acknowledgement.
    let Applied::Etcd(Ok(EtcdResponse::Put(mut put))) = second.output.clone() else {
        panic!("{:?}", second.output);
    };
    put.prev_kv = None;
    let other = Applied::Etcd(Ok(EtcdResponse::Put(put)));
    let differs = Change {
        output: other.clone(),
        ..second.clone()
    };
    let error = answers.on_applied(2, &differs).unwrap_err();
    assert!(error.contains("another answer at that index"), "{error}");
    assert!(answers.on_acked(1, &other).is_err());
    // A header revision that is not the store revision after the record.
    let behind = Change {
        revision: second.revision + 1,
        ..second.clone()
    };
    let error = Answers::default().on_applied(0, &behind).unwrap_err();
    assert!(error.contains("header revision"), "{error}");
}

#[test]
fn states_that_differ_at_one_applied_end_are_caught() {
    let common = [etcd_put("e/a", "1"), etcd_put("e/b", "2")];
    let compact = EtcdCommand::Compact(CompactionRequest {
        revision: 2,
        physical: false,
    })
    .encode();
    let (state, _) = applied(&[common[0].clone(), common[1].clone(), compact.clone()]);
    let (same, _) = applied(&[common[0].clone(), common[1].clone(), compact]);
    let mut digests = Digests::default();
    digests.check(&state, "n0").unwrap();
    digests.check(&same, "n1").unwrap();
    assert_eq!(digests.compared, 1);
    // The same map and store revision at the same end, but the history not
    // compacted: the third record deleted nothing instead.
    let nothing = EtcdCommand::DeleteRange(DeleteRangeRequest {
        key: bytes("e/absent"),
        ..DeleteRangeRequest::default()
    })
    .encode();
    let (uncompacted, _) = applied(&[common[0].clone(), common[1].clone(), nothing]);
    assert_eq!(uncompacted.revision(), state.revision());
    let error = digests.check(&uncompacted, "n2").unwrap_err();
    assert!(error.contains("differ"), "{error}");
    // The same (empty) map, revisions and number of changes, but another
    // key came and went.
    let came_and_went = |key: &str| {
        let delete = EtcdCommand::DeleteRange(DeleteRangeRequest {
            key: bytes(key),
            ..DeleteRangeRequest::default()
        });
        applied(&[etcd_put(key, "1"), delete.encode()]).0
    };
    digests.check(&came_and_went("e/x"), "n0").unwrap();
    let error = digests.check(&came_and_went("e/y"), "n1").unwrap_err();
    assert!(error.contains("differ"), "{error}");
}

/// A short run: etcd writes are acknowledged, and R11 and R12 compare
/// answers and states across processes.
#[test]
fn a_short_run_acknowledges_etcd_writes_and_compares_their_answers_and_states() {
    let report = crate::run_once(crate::SimOptions {
        seed: 3,
        steps: 600,
        verbose: false,
    });
    assert!(report.failure.is_none(), "{:?}", report.failure);
    let stats = &report.stats.runtime;
    assert!(stats.etcd_acked > 0, "{stats:?}");
    assert!(stats.etcd_answers_compared > 0, "{stats:?}");
    assert!(stats.states_compared > 0, "{stats:?}");
    assert!(stats.etcd_model_checked > 0, "{stats:?}");
}

/// Drawn etcd requests applied by the machine, one per index, with the
/// revisions around each.
fn drawn_history(count: u64) -> (Vec<Bytes>, Vec<Applied>, Vec<u64>) {
    let mut state = KvState::default();
    let (mut records, mut outputs, mut revisions) = (Vec::new(), Vec::new(), vec![1]);
    for index in 0..count {
        let record = draw_request(index, &state).encode();
        outputs.push(state.apply(RecordIndex(index), &record));
        records.push(record);
        revisions.push(state.revision() as u64);
    }
    (records, outputs, revisions)
}

fn replay(
    model: &mut EtcdModel,
    history: &(Vec<Bytes>, Vec<Applied>, Vec<u64>),
) -> Result<(), String> {
    let (records, outputs, revisions) = history;
    model.advance(|index| {
        let index = index as usize;
        Some(Known {
            record: records.get(index)?,
            before: revisions[index],
            after: revisions[index + 1],
            answer: outputs.get(index),
        })
    })
}

#[test]
fn the_etcd_model_expects_every_answer_the_machine_gives() {
    let history = drawn_history(3000);
    let mut model = EtcdModel::default();
    replay(&mut model, &history).unwrap();
    assert_eq!(model.checked, 3000);
}

#[test]
fn an_etcd_answer_or_revision_the_model_does_not_expect_is_caught() {
    let (records, outputs, revisions) = drawn_history(300);
    // A transaction that answers the other branch.
    let mut flipped = outputs.clone();
    let at = flipped
        .iter()
        .position(|output| matches!(output, Applied::Etcd(Ok(EtcdResponse::Txn(_)))))
        .unwrap();
    if let Applied::Etcd(Ok(EtcdResponse::Txn(txn))) = &mut flipped[at] {
        txn.succeeded = !txn.succeeded;
    }
    let history = (records.clone(), flipped, revisions.clone());
    let error = replay(&mut EtcdModel::default(), &history).unwrap_err();
    assert!(error.contains(&format!("index {at} answered")), "{error}");
    // A record that left the store revision one too high from there on.
    let mut higher = revisions.clone();
    higher[200..].iter_mut().for_each(|revision| *revision += 1);
    let error = replay(&mut EtcdModel::default(), &(records, outputs, higher)).unwrap_err();
    assert!(error.contains("leaves the store revision"), "{error}");
}

/// A short run: leases are granted, kept alive across a takeover,
/// expired and revoked, and R14 and R13 check them. (A seed whose
/// schedule does all of that; a new action in the schedule changes which.)
#[test]
fn a_short_run_grants_keeps_alive_across_a_takeover_expires_and_revokes_leases() {
    let report = crate::run_once(crate::SimOptions {
        seed: 7,
        steps: 600,
        verbose: false,
    });
    assert!(report.failure.is_none(), "{:?}", report.failure);
    let stats = &report.stats.runtime;
    let counts = [
        stats.lease_grants,
        stats.lease_keep_alives_acked,
        stats.lease_kept_across_takeovers,
        stats.lease_expiries,
        stats.lease_revokes,
        stats.lease_keys_deleted,
    ];
    assert!(counts.iter().all(|count| *count > 0), "{stats:?}");
}

/// Short runs: processes hand each other records, the receivers apply
/// some at once, and R1 and R8 hold.
#[test]
fn short_runs_hand_records_between_processes() {
    let (mut handed, mut applied) = (0, 0);
    for seed in 0..6 {
        let report = crate::run_once(crate::SimOptions {
            seed,
            steps: 600,
            verbose: false,
        });
        assert!(
            report.failure.is_none(),
            "seed {seed}: {:?}",
            report.failure
        );
        handed += report.stats.runtime.records_handed_over;
        applied += report.stats.runtime.records_applied_from_peers;
    }
    assert!(
        handed > 0 && applied > 0,
        "handed {handed}, applied {applied}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_ended_before_its_ttl_passed_is_caught_unless_the_client_revoked_it() {
    let mut trace = Trace::new(false);
    let mut phase = phase(&mut trace).await;
    phase.leases.note_granted(7, 4_000, 10_000);
    let error = phase.on_expiry_decided(0, 7, 9_999).unwrap_err();
    assert!(error.contains("must live until 10000 ms"), "{error}");
    phase.on_expiry_decided(0, 7, 10_000).unwrap();
    // A revoke seen applied (at the latest now, 0 ms) while it must live.
    let revoke = EtcdCommand::LeaseRevoke(LeaseRevokeRequest { id: 7 }).encode();
    let (_, changes) = applied(&[
        EtcdCommand::LeaseGrant(LeaseGrantRequest { id: 7, ttl: 4 }).encode(),
        revoke.clone(),
    ]);
    let error = phase
        .on_lease_record_applied(&revoke, &changes[1].output)
        .unwrap_err();
    assert!(error.contains("its revoke applied"), "{error}");
    // The client asked for it: no expiry.
    phase.leases.note_revoke_asked(7, 0);
    phase
        .on_lease_record_applied(&revoke, &changes[1].output)
        .unwrap();
    phase.on_expiry_decided(0, 7, 1).unwrap();
}

/// Lease requests applied by the machine from index 0: two grants (one
/// naming no id), keys attached and moved between leases, a put and a
/// revoke naming a lease that does not exist, both revokes.
fn lease_history() -> (Vec<Bytes>, Vec<Applied>, Vec<u64>) {
    let chosen = SERVER_LEASE_ID_BASE;
    let grant = |id, ttl| EtcdCommand::LeaseGrant(LeaseGrantRequest { id, ttl }).encode();
    let revoke = |id| EtcdCommand::LeaseRevoke(LeaseRevokeRequest { id }).encode();
    let put = |key: &str, lease| {
        EtcdCommand::Put(PutRequest {
            key: bytes(key),
            value: bytes("v"),
            lease,
            prev_kv: true,
            ..PutRequest::default()
        })
        .encode()
    };
    let records = vec![
        grant(0, 1),
        grant(5, 3),
        put("e/a", chosen),
        put("e/b", chosen),
        put("e/c", 5),
        put("e/a", 5),
        put("e/x", 99),
        revoke(chosen),
        revoke(99),
        revoke(5),
        grant(5, 2),
    ];
    let (_, changes) = applied(&records);
    let mut revisions = vec![1];
    revisions.extend(changes.iter().map(|change| change.revision));
    let outputs = changes.into_iter().map(|change| change.output).collect();
    (records, outputs, revisions)
}

#[test]
fn the_etcd_model_expects_the_machines_lease_answers() {
    let history = lease_history();
    let mut model = EtcdModel::default();
    replay(&mut model, &history).unwrap();
    assert_eq!(model.checked, history.0.len() as u64);
    let (_, outputs, revisions) = &history;
    // The first revoke deletes e/b only (e/a moved to lease 5), the
    // second e/a and e/c at one revision.
    let deleted = |index: usize| match &outputs[index] {
        Applied::Etcd(Ok(EtcdResponse::LeaseRevoke(revoke))) => revoke.deleted,
        other => panic!("{other:?}"),
    };
    assert_eq!((deleted(7), deleted(9)), (1, 2));
    assert_eq!(revisions[10] - revisions[9], 1);
}

#[test]
fn a_revoke_that_leaves_a_key_or_a_grant_of_an_id_in_use_is_caught() {
    let (records, outputs, revisions) = lease_history();
    // The second revoke answers one key deleted, not two.
    let mut fewer = outputs.clone();
    if let Applied::Etcd(Ok(EtcdResponse::LeaseRevoke(revoke))) = &mut fewer[9] {
        revoke.deleted = 1;
    }
    let history = (records.clone(), fewer, revisions.clone());
    let error = replay(&mut EtcdModel::default(), &history).unwrap_err();
    assert!(error.contains("index 9 answered"), "{error}");
    // The machine chose the id of the lease granted at index 1.
    let mut reused = outputs.clone();
    if let Applied::Etcd(Ok(EtcdResponse::LeaseGrant(grant))) = &mut reused[0] {
        grant.id = 5;
    }
    let history = (records.clone(), reused, revisions.clone());
    let error = replay(&mut EtcdModel::default(), &history).unwrap_err();
    assert!(error.contains("index 1 answered"), "{error}");
    // A put naming a missing lease applied rather than refused.
    let mut accepted = outputs;
    accepted[6] = accepted[5].clone();
    let error = replay(&mut EtcdModel::default(), &(records, accepted, revisions)).unwrap_err();
    assert!(error.contains("index 6 answered"), "{error}");
}
