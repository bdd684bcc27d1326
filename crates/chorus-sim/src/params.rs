//! The shape of one run, drawn from its seed: replica count, window and
//! writer settings. Settings are small so that rotation, backpressure, lane
//! shedding and the window limit are all reached within a few hundred steps.

use std::time::Duration;

use chorus::log::LogConfig;
use rand::Rng;
use rand::rngs::StdRng;

/// The parameters of one run.
#[derive(Debug, Clone)]
pub struct Params {
    /// N: 1, 3 or 5.
    pub replicas: usize,
    /// The per-replica fragment window.
    pub window: u32,
    /// The settings every writer and recovery uses.
    pub config: LogConfig,
    /// Largest payload the workload appends (at most `max_record_bytes`).
    pub max_payload_bytes: usize,
    /// How often faults are injected, 1 (rarely) to 4 (a storm): scales the
    /// weights of the fault actions.
    pub fault_intensity: u32,
}

fn millis(rng: &mut StdRng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.random_range(range))
}

impl Params {
    /// Draws the parameters of a run.
    pub fn draw(rng: &mut StdRng) -> Params {
        let replicas = match rng.random_range(0..10) {
            0 => 1,
            1..=6 => 3,
            _ => 5,
        };
        let window = rng.random_range(1..=4);
        let max_fragment_bytes = rng.random_range(256..=4096u64);
        let max_record_bytes = (max_fragment_bytes - 8).min(1024);
        let max_segment_bytes = rng.random_range(512..=16 * 1024u64);
        let retry_backoff_min = millis(rng, 1..=20);
        let retry_backoff_max = retry_backoff_min.max(millis(rng, 20..=500));
        // Settings added later take their defaults.
        #[allow(clippy::needless_update)]
        let config = LogConfig {
            max_fragment_bytes,
            max_record_bytes,
            max_inflight_bytes: rng.random_range(max_record_bytes..=64 * 1024),
            max_inflight_records: rng.random_range(8..=512),
            max_replica_lag_bytes: max_fragment_bytes * rng.random_range(1..=8),
            lane_stall_timeout: millis(rng, 100..=2000),
            max_segment_bytes,
            max_active_segment_bytes: max_segment_bytes * rng.random_range(1..=8),
            linger: if rng.random_bool(0.7) {
                Duration::ZERO
            } else {
                millis(rng, 1..=20)
            },
            retry_backoff_min,
            retry_backoff_max,
            register_rounds: if rng.random_bool(0.8) { 16 } else { 4 },
            // Hedged fragment writes in about half the runs, decided by
            // values already drawn, so the runs without them keep the
            // schedules their seeds had.
            hedge_after_percentile: (retry_backoff_min.as_millis() % 2 == 1)
                .then_some(50 + (max_segment_bytes % 50) as u8),
            repair_interval: if rng.random_bool(0.5) {
                None
            } else {
                Some(millis(rng, 1000..=20_000))
            },
            ..LogConfig::default()
        };
        config
            .validate()
            .expect("the simulator draws valid settings");
        let max_payload_bytes = if rng.random_bool(0.7) {
            (max_record_bytes as usize).min(200)
        } else {
            max_record_bytes as usize
        };
        Params {
            replicas,
            window,
            config,
            max_payload_bytes,
            fault_intensity: rng.random_range(1..=4),
        }
    }
}

impl std::fmt::Display for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.config;
        write!(
            f,
            "replicas={} window={} max_fragment_bytes={} max_segment_bytes={} \
             max_active_segment_bytes={} max_inflight_bytes={} max_inflight_records={} \
             max_replica_lag_bytes={} lane_stall_timeout={:?} linger={:?} backoff={:?}..{:?} \
             register_rounds={} hedge_after_percentile={:?} max_payload_bytes={} fault_intensity={}",
            self.replicas,
            self.window,
            c.max_fragment_bytes,
            c.max_segment_bytes,
            c.max_active_segment_bytes,
            c.max_inflight_bytes,
            c.max_inflight_records,
            c.max_replica_lag_bytes,
            c.lane_stall_timeout,
            c.linger,
            c.retry_backoff_min,
            c.retry_backoff_max,
            c.register_rounds,
            c.hedge_after_percentile,
            self.max_payload_bytes,
            self.fault_intensity,
        )
    }
}
