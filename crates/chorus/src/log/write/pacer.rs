//! Spreads fragment cuts over the window. Without pacing, under sustained
//! load the window's slots free almost together (one round trip after they
//! were spent) and are spent at once again: the first fragment takes the
//! whole queue, the rest carry a record or two, and new records wait most of
//! a round trip for the next slot. Cutting at most one fragment per
//! (round trip / window) while fragments are in flight keeps the slots
//! staggered, so a record waits about 1/window of a round trip instead.
//!
//! When commit times vary (heavy-tailed stores), cuts are also spaced by at
//! least the round trip's smoothed deviation. Acknowledgements are in order,
//! so a record waits for the slowest quorum among the fragments cut before it
//! that are still in flight: the more of them, the likelier one is late, and
//! the tail grows with their number. Spacing cuts by the spread of commit
//! times keeps that number down, at the cost of a record waiting up to one
//! spacing for its cut; under steady latency the deviation is near zero and
//! the window share decides alone. Pure: the pipeline feeds it the clock.

use std::time::Duration;

use tokio::time::Instant;

/// Weight of a new round-trip sample in the smoothed estimate (1/8, as TCP's
/// smoothed RTT): steady under jitter, follows a lasting change within a few
/// dozen fragments.
const SAMPLE_WEIGHT_DIVISOR: u32 = 8;

/// Weight of a new sample's distance from the smoothed round trip in the
/// smoothed deviation (1/4, as TCP's RTTVAR).
const DEVIATION_WEIGHT_DIVISOR: u32 = 4;

/// The deviation spaces cuts by at most this share of the round trip, so
/// that it never holds a cut back more than half a round trip, however wild
/// the store.
const MAX_DEVIATION_SPACING_DIVISOR: u32 = 2;

/// When the next fragment may be cut.
#[derive(Debug)]
pub struct Pacer {
    enabled: bool,
    window: u32,
    /// Smoothed time from cutting a fragment to its quorum commit.
    round_trip: Option<Duration>,
    /// Smoothed mean distance of a sample from `round_trip`.
    deviation: Duration,
    last_cut: Option<Instant>,
}

impl Pacer {
    /// A pacer for `window` fragments in flight per lane; `enabled` false
    /// cuts whenever the window allows.
    pub fn new(enabled: bool, window: u64) -> Pacer {
        Pacer {
            enabled,
            window: u32::try_from(window.max(1)).unwrap_or(u32::MAX),
            round_trip: None,
            deviation: Duration::ZERO,
            last_cut: None,
        }
    }

    /// A fragment was cut at `now`.
    pub fn cut(&mut self, now: Instant) {
        self.last_cut = Some(now);
    }

    /// A fragment cut at `cut_at` committed at `now`.
    pub fn committed(&mut self, cut_at: Instant, now: Instant) {
        let sample = now.saturating_duration_since(cut_at);
        self.round_trip = Some(match self.round_trip {
            // The deviation starts at zero, not at half the first sample as
            // TCP's does: a new log should not start with wide spacing.
            None => sample,
            Some(smoothed) => {
                // Against the old smoothed value, then update it (RFC 6298's
                // order).
                let distance = sample.abs_diff(smoothed);
                self.deviation = moved_toward(self.deviation, distance, DEVIATION_WEIGHT_DIVISOR);
                moved_toward(smoothed, sample, SAMPLE_WEIGHT_DIVISOR)
            }
        });
    }

    /// The earliest time the next fragment may be cut, or `None` for at once:
    /// one spacing after the last cut, the spacing being the larger of the
    /// window's share of the round trip and its deviation (at most half of it);
    /// always at once when nothing is in flight (an idle log adds no delay)
    /// or a full fragment is queued (waiting would not make it bigger).
    pub fn not_before(&self, in_flight: bool, full_fragment_queued: bool) -> Option<Instant> {
        if !self.enabled || !in_flight || full_fragment_queued {
            return None;
        }
        let round_trip = self.round_trip?;
        let spread = self
            .deviation
            .min(round_trip / MAX_DEVIATION_SPACING_DIVISOR);
        let spacing = (round_trip / self.window).max(spread);
        Some(self.last_cut? + spacing)
    }
}

/// `smoothed` moved 1/`divisor` of the way toward `sample` (an exponentially
/// weighted moving average; never below zero, as `smoothed / divisor` is at
/// most `smoothed`).
fn moved_toward(smoothed: Duration, sample: Duration, divisor: u32) -> Duration {
    smoothed - smoothed / divisor + sample / divisor
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn pacer_with_round_trip(round_trip: Duration) -> (Pacer, Instant) {
        let mut pacer = Pacer::new(true, 4);
        let start = Instant::now();
        pacer.cut(start);
        pacer.committed(start, start + round_trip);
        (pacer, start + round_trip)
    }

    #[test]
    fn cuts_at_once_until_a_round_trip_is_known() {
        let mut pacer = Pacer::new(true, 4);
        let now = Instant::now();
        assert_eq!(pacer.not_before(true, false), None);
        pacer.cut(now);
        assert_eq!(pacer.not_before(true, false), None);
    }

    #[test]
    fn spaces_cuts_by_a_window_share_of_the_round_trip_while_in_flight() {
        let (mut pacer, now) = pacer_with_round_trip(10 * MS);
        pacer.cut(now);
        assert_eq!(pacer.not_before(true, false), Some(now + 10 * MS / 4));
    }

    #[test]
    fn an_idle_log_or_a_full_fragment_is_never_held_back() {
        let (mut pacer, now) = pacer_with_round_trip(10 * MS);
        pacer.cut(now);
        assert_eq!(pacer.not_before(false, false), None);
        assert_eq!(pacer.not_before(true, true), None);
        assert_eq!(pacer.not_before(false, true), None);
    }

    #[test]
    fn disabled_never_holds_back() {
        let mut pacer = Pacer::new(false, 4);
        let now = Instant::now();
        pacer.cut(now);
        pacer.committed(now, now + 10 * MS);
        assert_eq!(pacer.not_before(true, false), None);
    }

    #[test]
    fn the_round_trip_is_smoothed_toward_new_samples() {
        let (mut pacer, now) = pacer_with_round_trip(16 * MS);
        pacer.committed(now, now + 8 * MS);
        assert_eq!(pacer.round_trip, Some(15 * MS));
        for _ in 0..100 {
            pacer.committed(now, now + 8 * MS);
        }
        let settled = pacer.round_trip.unwrap();
        assert!(
            settled >= 8 * MS && settled < 8 * MS + MS / 10,
            "{settled:?}"
        );
    }

    /// A pacer that saw commits alternate between `low` and `high`, then cut at
    /// the returned instant.
    fn pacer_with_alternating_round_trips(
        window: u64,
        low: Duration,
        high: Duration,
    ) -> (Pacer, Instant) {
        let mut pacer = Pacer::new(true, window);
        let start = Instant::now();
        for i in 0..200 {
            let sample = if i % 2 == 0 { low } else { high };
            pacer.committed(start, start + sample);
        }
        pacer.cut(start);
        (pacer, start)
    }

    #[test]
    fn steady_commits_have_no_deviation() {
        let (mut pacer, now) = pacer_with_round_trip(10 * MS);
        for _ in 0..50 {
            pacer.committed(now, now + 10 * MS);
        }
        assert_eq!(pacer.deviation, Duration::ZERO);
    }

    #[test]
    fn the_deviation_is_measured_against_the_round_trip_before_the_sample() {
        // 8 ms against a smoothed 16 ms: a distance of 8 ms, a quarter of it
        // kept (against the updated 15 ms it would be 7 ms, 1.75 kept).
        let (mut pacer, now) = pacer_with_round_trip(16 * MS);
        pacer.committed(now, now + 8 * MS);
        assert_eq!(pacer.deviation, 2 * MS);
        assert_eq!(pacer.round_trip, Some(15 * MS));
    }

    #[test]
    fn varying_commits_space_cuts_by_their_deviation() {
        // Samples 6 and 14 ms settle the round trip near 10 ms and the
        // deviation near 4 ms, above the window's share (10 / 16).
        let (pacer, now) = pacer_with_alternating_round_trips(16, 6 * MS, 14 * MS);
        let spacing = pacer.not_before(true, false).unwrap() - now;
        assert!(spacing > 3 * MS && spacing < 5 * MS, "{spacing:?}");
        assert_eq!(spacing, pacer.deviation);
    }

    #[test]
    fn a_deviation_below_the_window_share_changes_nothing() {
        // 9.5 and 10.5 ms: deviation about 0.5 ms, window share 10 / 4 ms.
        let (pacer, now) = pacer_with_alternating_round_trips(4, 19 * MS / 2, 21 * MS / 2);
        let round_trip = pacer.round_trip.unwrap();
        assert!(pacer.deviation < MS);
        assert_eq!(pacer.not_before(true, false), Some(now + round_trip / 4));
    }

    #[test]
    fn the_deviation_spaces_by_at_most_half_the_round_trip() {
        let (pacer, now) = pacer_with_alternating_round_trips(16, MS, 100 * MS);
        let round_trip = pacer.round_trip.unwrap();
        assert!(pacer.deviation > round_trip / 2);
        assert_eq!(pacer.not_before(true, false), Some(now + round_trip / 2));
    }

    #[test]
    fn a_window_of_one_spaces_by_the_whole_round_trip() {
        let mut pacer = Pacer::new(true, 1);
        let now = Instant::now();
        pacer.cut(now);
        pacer.committed(now, now + 10 * MS);
        pacer.cut(now + 10 * MS);
        assert_eq!(pacer.not_before(true, false), Some(now + 20 * MS));
    }
}
