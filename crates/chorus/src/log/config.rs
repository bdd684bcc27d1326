//! Writer settings, with validated defaults. Each setting names its unit and says
//! what it trades.

use std::time::Duration;

use crate::codec::{
    FRAME_HEADER_BYTES, MAX_FRAGMENT_PAYLOAD_BYTES, MAX_RECORD_BYTES, MAX_SEALED_PAYLOAD_BYTES,
};

const MIB: u64 = 1024 * 1024;

/// Settings of a log writer. The per-replica `window` is not here: it is fixed
/// in the register when the log is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// Largest fragment payload. Bigger fragments mean fewer store requests
    /// (cost) and more throughput per request, at the price of more memory per
    /// in-flight fragment. Default 4 MiB.
    pub max_fragment_bytes: u64,
    /// Largest record accepted by `append`, at most 64 MiB (the record
    /// codec's limit). Default 1 MiB.
    pub max_record_bytes: u64,
    /// Bytes admitted but not yet durable; `append` refuses beyond it
    /// (backpressure), bounding memory. Default 64 MiB.
    pub max_inflight_bytes: u64,
    /// Records admitted but not yet durable; bounds per-record bookkeeping
    /// independently of record size. Default 1,048,576.
    pub max_inflight_records: u64,
    /// How far (in fragment bytes) one replica may fall behind the others before
    /// it is shed for the rest of the segment. Default 64 MiB.
    pub max_replica_lag_bytes: u64,
    /// A replica that makes no progress for this long while it has work is shed
    /// for the rest of the segment. Default 5 s.
    pub lane_stall_timeout: Duration,
    /// A segment is rotated (sealed into one object) once it holds this many
    /// framed record bytes (each record plus its 4-byte length prefix).
    /// Larger segments mean fewer directory entries and seals; smaller ones
    /// bound recovery reads and seal memory. Plus one record, at most 4 GiB
    /// (the sealed codec's limit). Default 64 MiB.
    pub max_segment_bytes: u64,
    /// While the previous segment is still being sealed, the active segment may
    /// grow to this many framed bytes before `append` refuses with
    /// `ActiveSegmentFull`. At most 4 GiB (the sealed codec's limit). Default 1 GiB.
    pub max_active_segment_bytes: u64,
    /// How long the batcher waits for more records before cutting a fragment
    /// that is not full. Zero gives the lowest latency; a few milliseconds
    /// saves requests (cost) under moderate load. Default 0.
    pub linger: Duration,
    /// Spread fragment cuts over the window: while fragments are in flight,
    /// cut the next one no sooner than (smoothed cut-to-commit time) / window
    /// after the previous one, unless a full fragment is queued. An idle log
    /// still cuts at once. Without it, under sustained load the window's
    /// slots free together and are spent at once on one large and several
    /// tiny fragments, and records wait most of a round trip for the next
    /// slot; with it, about 1/window of one. When commit times vary, the
    /// spacing is at least their smoothed deviation (at most half the round
    /// trip): fewer fragments in flight means fewer chances that an earlier
    /// one's late quorum holds a record back. Default true.
    pub pace_fragments: bool,
    /// Hedge fragment writes: one that has not answered after this
    /// percentile of its replica's recent write latencies (and at least 1.25
    /// times their median) is sent again to the same replica, beside the
    /// first, and the first answer counts. Under heavy-tailed store latency
    /// it trims the slow requests that hold back every record behind them,
    /// for at most about (100 − percentile) % more fragment writes; under steady
    /// latency, or from a replica that is slow all the time, none is sent
    /// twice. `None` never hedges. 50 to 99. Default 70.
    pub hedge_after_percentile: Option<u8>,
    /// First delay before retrying a failed store request; doubles per attempt.
    pub retry_backoff_min: Duration,
    /// Longest delay between retries of one store request.
    pub retry_backoff_max: Duration,
    /// Rounds of the register CAS loop per transition.
    pub register_rounds: u32,
    /// How often a live writer checks every sealed copy on every replica and
    /// heals missing or damaged ones (it also runs at start and after a
    /// degraded seal). Each pass reads every retained sealed object once per
    /// replica: shorter intervals find damage sooner and cost more reads.
    /// `None` disables periodic repair. Default 5 min.
    pub repair_interval: Option<Duration>,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            max_fragment_bytes: 4 * MIB,
            max_record_bytes: MIB,
            max_inflight_bytes: 64 * MIB,
            max_inflight_records: 1 << 20,
            max_replica_lag_bytes: 64 * MIB,
            lane_stall_timeout: Duration::from_secs(5),
            max_segment_bytes: 64 * MIB,
            max_active_segment_bytes: 1024 * MIB,
            linger: Duration::ZERO,
            pace_fragments: true,
            hedge_after_percentile: Some(70),
            retry_backoff_min: Duration::from_millis(10),
            retry_backoff_max: Duration::from_secs(1),
            register_rounds: crate::register::DEFAULT_MAX_ROUNDS,
            repair_interval: Some(Duration::from_secs(300)),
        }
    }
}

/// The percentiles `LogConfig::hedge_after_percentile` may name: below the
/// median most writes would be sent twice, and the 100th never hedges.
const HEDGE_PERCENTILES: std::ops::RangeInclusive<u8> = 50..=99;

/// When fragment writes are hedged, as a command line gives it: a
/// percentile from 50 to 99 (`LogConfig::hedge_after_percentile`), or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgeAfter(pub Option<u8>);

impl std::str::FromStr for HedgeAfter {
    type Err = String;

    fn from_str(text: &str) -> Result<HedgeAfter, String> {
        if text == "off" {
            return Ok(HedgeAfter(None));
        }
        match text.parse::<u8>() {
            Ok(percentile) if HEDGE_PERCENTILES.contains(&percentile) => {
                Ok(HedgeAfter(Some(percentile)))
            }
            _ => Err(format!("{text:?}: give a percentile from 50 to 99, or off")),
        }
    }
}

/// A setting out of range; the message names the knob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid log setting: knob={knob}: {reason}")]
pub struct ConfigError {
    /// The offending setting.
    pub knob: &'static str,
    /// Why it is invalid.
    pub reason: String,
}

fn check(ok: bool, knob: &'static str, reason: impl FnOnce() -> String) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError {
            knob,
            reason: reason(),
        })
    }
}

impl LogConfig {
    /// Checks every setting and the relations between them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let frame = FRAME_HEADER_BYTES as u64;
        check(
            self.max_fragment_bytes > frame
                && self.max_fragment_bytes <= MAX_FRAGMENT_PAYLOAD_BYTES,
            "max_fragment_bytes",
            || {
                format!(
                    "{} is outside {}..={MAX_FRAGMENT_PAYLOAD_BYTES}",
                    self.max_fragment_bytes,
                    frame + 1
                )
            },
        )?;
        check(
            self.max_record_bytes <= MAX_RECORD_BYTES,
            "max_record_bytes",
            || {
                format!(
                    "{} exceeds the record codec's limit {MAX_RECORD_BYTES}",
                    self.max_record_bytes
                )
            },
        )?;
        check(
            self.max_record_bytes + frame <= self.max_fragment_bytes,
            "max_record_bytes",
            || {
                format!(
                    "{} plus a {frame}-byte frame exceeds max_fragment_bytes {}",
                    self.max_record_bytes, self.max_fragment_bytes
                )
            },
        )?;
        check(
            self.max_inflight_bytes >= self.max_record_bytes,
            "max_inflight_bytes",
            || {
                format!(
                    "{} is below max_record_bytes {}",
                    self.max_inflight_bytes, self.max_record_bytes
                )
            },
        )?;
        check(
            self.max_inflight_records > 0,
            "max_inflight_records",
            || "must be positive".into(),
        )?;
        check(
            self.max_replica_lag_bytes >= self.max_fragment_bytes,
            "max_replica_lag_bytes",
            || {
                format!(
                    "{} is below max_fragment_bytes {}",
                    self.max_replica_lag_bytes, self.max_fragment_bytes
                )
            },
        )?;
        check(
            self.hedge_after_percentile
                .is_none_or(|percentile| HEDGE_PERCENTILES.contains(&percentile)),
            "hedge_after_percentile",
            || {
                format!(
                    "{:?} is outside 50..=99 (below the median most writes would be sent twice)",
                    self.hedge_after_percentile
                )
            },
        )?;
        check(
            !self.lane_stall_timeout.is_zero(),
            "lane_stall_timeout",
            || "must be positive".into(),
        )?;
        check(self.max_segment_bytes > 0, "max_segment_bytes", || {
            "must be positive".into()
        })?;
        // The active segment holds at most max(max_active_segment_bytes,
        // max_segment_bytes + one framed record) (see admission), and all of
        // it becomes one sealed object.
        check(
            self.max_segment_bytes
                .saturating_add(self.max_record_bytes + frame)
                <= MAX_SEALED_PAYLOAD_BYTES,
            "max_segment_bytes",
            || {
                format!(
                    "{} plus one framed record of max_record_bytes {} exceeds the sealed codec's limit {MAX_SEALED_PAYLOAD_BYTES}",
                    self.max_segment_bytes, self.max_record_bytes
                )
            },
        )?;
        check(
            self.max_active_segment_bytes <= MAX_SEALED_PAYLOAD_BYTES,
            "max_active_segment_bytes",
            || {
                format!(
                    "{} exceeds the sealed codec's limit {MAX_SEALED_PAYLOAD_BYTES}",
                    self.max_active_segment_bytes
                )
            },
        )?;
        check(
            self.max_active_segment_bytes >= self.max_segment_bytes,
            "max_active_segment_bytes",
            || {
                format!(
                    "{} is below max_segment_bytes {}",
                    self.max_active_segment_bytes, self.max_segment_bytes
                )
            },
        )?;
        check(
            !self.retry_backoff_min.is_zero() && self.retry_backoff_min <= self.retry_backoff_max,
            "retry_backoff_min",
            || "must be positive and at most retry_backoff_max".into(),
        )?;
        check(self.register_rounds > 0, "register_rounds", || {
            "must be positive".into()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        LogConfig::default().validate().unwrap();
    }

    /// Defends the defaults the field docs (and docs/BENCHMARKS.md) promise, value by value.
    #[test]
    fn defaults_match_their_documentation() {
        let config = LogConfig::default();
        assert_eq!(config.max_fragment_bytes, 4 * 1024 * 1024);
        assert_eq!(config.max_record_bytes, 1024 * 1024);
        assert_eq!(config.max_inflight_bytes, 64 * 1024 * 1024);
        assert_eq!(config.max_inflight_records, 1_048_576);
        assert_eq!(config.max_replica_lag_bytes, 64 * 1024 * 1024);
        assert_eq!(config.lane_stall_timeout, Duration::from_secs(5));
        assert_eq!(config.max_segment_bytes, 64 * 1024 * 1024);
        assert_eq!(config.max_active_segment_bytes, 1024 * 1024 * 1024);
        assert_eq!(config.linger, Duration::ZERO);
        assert_eq!(config.hedge_after_percentile, Some(70));
        assert_eq!(config.repair_interval, Some(Duration::from_secs(5 * 60)));
    }

    #[test]
    fn hedging_is_a_percentile_or_off() {
        assert_eq!("75".parse(), Ok(HedgeAfter(Some(75))));
        assert_eq!("50".parse(), Ok(HedgeAfter(Some(50))));
        assert_eq!("99".parse(), Ok(HedgeAfter(Some(99))));
        assert_eq!("off".parse(), Ok(HedgeAfter(None)));
        for bad in ["49", "100", "", "never", "75%"] {
            let error = bad.parse::<HedgeAfter>().unwrap_err();
            assert!(error.contains("50 to 99, or off"), "{error}");
        }
    }

    #[test]
    fn each_bad_setting_is_named() {
        type Breaker = Box<dyn Fn(&mut LogConfig)>;
        let cases: Vec<(&str, Breaker)> = vec![
            ("max_fragment_bytes", Box::new(|c| c.max_fragment_bytes = 0)),
            (
                "max_record_bytes",
                Box::new(|c| c.max_record_bytes = c.max_fragment_bytes),
            ),
            ("max_inflight_bytes", Box::new(|c| c.max_inflight_bytes = 1)),
            (
                "max_inflight_records",
                Box::new(|c| c.max_inflight_records = 0),
            ),
            (
                "max_replica_lag_bytes",
                Box::new(|c| c.max_replica_lag_bytes = 1),
            ),
            (
                "lane_stall_timeout",
                Box::new(|c| c.lane_stall_timeout = Duration::ZERO),
            ),
            ("max_segment_bytes", Box::new(|c| c.max_segment_bytes = 0)),
            (
                "hedge_after_percentile",
                Box::new(|c| c.hedge_after_percentile = Some(49)),
            ),
            (
                "max_active_segment_bytes",
                Box::new(|c| c.max_active_segment_bytes = 1),
            ),
            (
                "retry_backoff_min",
                Box::new(|c| c.retry_backoff_min = Duration::ZERO),
            ),
            ("register_rounds", Box::new(|c| c.register_rounds = 0)),
        ];
        for (knob, break_it) in cases {
            let mut config = LogConfig::default();
            break_it(&mut config);
            let error = config.validate().unwrap_err();
            assert_eq!(error.knob, knob, "{error}");
            assert!(error.to_string().contains(knob));
        }
    }

    /// Every bound a codec enforces is refused here first, by name: past
    /// them a 65 MiB append panicked inside the pipeline task, and a segment
    /// past 4 GiB panicked its seal and then every recovery.
    #[test]
    fn settings_beyond_the_codec_limits_are_refused_by_name() {
        let gib = 1024 * MIB;
        type Breaker = Box<dyn Fn(&mut LogConfig)>;
        let cases: Vec<(&str, Breaker)> = vec![
            (
                "max_record_bytes",
                Box::new(|c| {
                    c.max_fragment_bytes = 128 * MIB;
                    c.max_record_bytes = MAX_RECORD_BYTES + 1;
                }),
            ),
            (
                "max_record_bytes",
                Box::new(|c| c.max_record_bytes = u64::MAX),
            ),
            (
                "max_segment_bytes",
                Box::new(move |c| {
                    c.max_segment_bytes = 4 * gib;
                    c.max_active_segment_bytes = 4 * gib;
                }),
            ),
            (
                "max_segment_bytes",
                Box::new(|c| c.max_segment_bytes = u64::MAX),
            ),
            (
                "max_active_segment_bytes",
                Box::new(move |c| c.max_active_segment_bytes = 5 * gib),
            ),
        ];
        for (knob, break_it) in cases {
            let mut config = LogConfig::default();
            break_it(&mut config);
            let error = config.validate().unwrap_err();
            assert_eq!(error.knob, knob, "{error}");
        }
        // The largest settings the codecs allow are valid.
        let largest = LogConfig {
            max_fragment_bytes: MAX_FRAGMENT_PAYLOAD_BYTES,
            max_record_bytes: MAX_RECORD_BYTES,
            max_inflight_bytes: MAX_RECORD_BYTES,
            max_replica_lag_bytes: MAX_FRAGMENT_PAYLOAD_BYTES,
            max_segment_bytes: MAX_SEALED_PAYLOAD_BYTES - MAX_RECORD_BYTES - 4,
            max_active_segment_bytes: MAX_SEALED_PAYLOAD_BYTES,
            ..LogConfig::default()
        };
        largest.validate().unwrap();
    }
}
