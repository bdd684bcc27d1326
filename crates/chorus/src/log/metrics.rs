//! The log's metrics, through the `metrics` facade (listed in
//! docs/operations.md, Metrics). Names carry the `chorus_` prefix; replica
//! labels are positions in the replica list.

use std::time::Duration;

use metrics::{Counter, Histogram, counter, gauge, histogram};

/// The handles of the per-record append counters, found once per writer: a
/// lookup in the recorder's registry for every record was a measurable
/// share of a busy writer's CPU.
#[derive(Debug)]
pub struct AppendMetrics {
    records: Counter,
    bytes: Counter,
}

impl AppendMetrics {
    /// The handles, from the recorder installed now.
    pub fn registered() -> AppendMetrics {
        AppendMetrics {
            records: counter!("chorus_append_records_total"),
            bytes: counter!("chorus_append_bytes_total"),
        }
    }

    /// An append of `bytes` was admitted.
    pub fn admitted(&self, bytes: usize) {
        self.records.increment(1);
        self.bytes.increment(bytes as u64);
    }
}

/// An append was refused or failed; `reason` is a short label.
pub fn append_failed(reason: &'static str) {
    counter!("chorus_append_failures_total", "reason" => reason).increment(1);
}

/// The histogram of records' latency from admission to durability: found
/// once per committed fragment, recorded into once per record.
pub fn commit_latency() -> Histogram {
    histogram!("chorus_commit_latency_seconds")
}

/// A fragment of `bytes` was written to replica `replica`.
pub fn fragment_written(replica: usize, bytes: usize) {
    let replica = replica.to_string();
    counter!("chorus_fragments_total", "replica" => replica.clone()).increment(1);
    counter!("chorus_fragment_bytes_total", "replica" => replica).increment(bytes as u64);
}

/// A lane retried a request.
pub fn lane_retry(replica: usize) {
    counter!("chorus_lane_retries_total", "replica" => replica.to_string()).increment(1);
}

/// A lane sent a fragment write again beside one that had not answered.
pub fn lane_hedge(replica: usize) {
    counter!("chorus_lane_hedges_total", "replica" => replica.to_string()).increment(1);
}

/// A lane was shed for the rest of its segment.
pub fn lane_shed(replica: usize, reason: &'static str) {
    counter!("chorus_lane_sheds_total", "replica" => replica.to_string(), "reason" => reason)
        .increment(1);
}

/// The rotation state: 0 idle, 1 draining, 2 sealing.
pub fn rotation_state(state: u8) {
    gauge!("chorus_rotation_state").set(f64::from(state));
}

/// A segment was sealed and folded (or sealing failed).
pub fn seal_finished(ok: bool, degraded: bool) {
    let outcome = match (ok, degraded) {
        (false, _) => "failed",
        (true, true) => "degraded",
        (true, false) => "ok",
    };
    counter!("chorus_seals_total", "outcome" => outcome).increment(1);
}

/// A recovery started.
pub fn recovery_started() {
    counter!("chorus_recovery_runs_total").increment(1);
}

/// A recovery finished after `elapsed`.
pub fn recovery_finished(elapsed: Duration, ok: bool) {
    let outcome = if ok { "ok" } else { "failed" };
    histogram!("chorus_recovery_seconds", "outcome" => outcome).record(elapsed.as_secs_f64());
}
