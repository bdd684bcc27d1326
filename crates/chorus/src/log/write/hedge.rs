//! Hedged fragment writes. Under heavy-tailed store latency one slow request
//! holds back every record behind it (acknowledgements are in order), so a
//! fragment write that has not answered after a delay is sent again beside
//! the first, to the same replica, and the first answer that settles it
//! counts. Safe for the same reason a retry after a lost response is: a
//! fragment is created only if absent, and a create that finds the key
//! compares the stored bytes with its own (`Replica::write_fragment`), so
//! whichever copy lands first the other succeeds, and a fence placed first
//! fences both. The window is unaffected: a hedge repeats a fragment already
//! issued, never one past it.
//!
//! The delay is a percentile of the replica's own recent write latencies
//! ([`WriteLatencies`]), so only the tail of each replica's latency is sent
//! twice: a replica that is slow all the time is judged against its own
//! typical answer and never hedged for being itself, and under steady
//! latency nothing is, because the delay is never below 1.25 times the
//! median.
//!
//! A late request is hedged even when its fragment already has a quorum
//! from the other replicas: it still holds a place in its lane's window,
//! and a lane whose window is full takes no new fragments, which leaves
//! their quorum to the remaining replicas alone. (Sparing those hedges was
//! measured: 15–20 % fewer requests, and a p99 at 1,000 records/s of
//! 26–28 ms instead of 23 ms under log-normal latency.)

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

/// Runs `attempt`; if it has not answered after `delay`, runs a second one
/// beside it. Returns the first outcome that `settles`; if one that does
/// not settle (a transient error) comes first, the other's outcome,
/// whatever it is. The flag says whether a second attempt was made.
pub async fn hedged<T, E, Fut>(
    delay: Option<Duration>,
    settles: impl Fn(&Result<T, E>) -> bool,
    mut attempt: impl FnMut() -> Fut,
) -> (Result<T, E>, bool)
where
    Fut: Future<Output = Result<T, E>>,
{
    let first = attempt();
    tokio::pin!(first);
    let Some(delay) = delay else {
        return (first.await, false);
    };
    // `biased`: polled in order, not at random, so a seeded simulation
    // replays the same way.
    tokio::select! {
        biased;
        outcome = &mut first => return (outcome, false),
        () = tokio::time::sleep(delay) => {}
    }
    let second = attempt();
    tokio::pin!(second);
    let outcome = tokio::select! {
        biased;
        outcome = &mut first => if settles(&outcome) { outcome } else { second.await },
        outcome = &mut second => if settles(&outcome) { outcome } else { first.await },
    };
    (outcome, true)
}

/// Latencies kept per replica: enough for a steady high percentile, few
/// enough to follow a change within a second or so of writes.
const KEPT: usize = 128;

/// No hedging until a replica has answered this many writes.
const MIN_SAMPLES: usize = 16;

/// The hedge delay is recomputed after this many new latencies, so sorting
/// is not a per-request cost.
const REFRESH_EVERY: usize = 8;

/// The shortest hedge delay: a store that answers faster has no tail worth
/// a second request (memory, a local disk at rest).
const MIN_DELAY: Duration = Duration::from_millis(1);

/// The recent fragment-write latencies of one replica (each from the start
/// of the attempt that succeeded, its hedge included, so earlier failed
/// attempts and their backoff do not count), and the hedge delay they give.
/// Kept across segments. A hedged write answers no sooner than its delay, so
/// recording it leaves the latencies below the delay, and the percentile,
/// as they were.
#[derive(Debug, Clone, Default)]
pub struct WriteLatencies {
    recent: VecDeque<Duration>,
    /// `recent`, sorted, as of the last refresh.
    sorted: Vec<Duration>,
    since_refresh: usize,
}

impl WriteLatencies {
    /// Records one write's latency.
    pub fn record(&mut self, latency: Duration) {
        if self.recent.len() == KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(latency);
        self.since_refresh += 1;
        if self.since_refresh >= REFRESH_EVERY || self.sorted.len() < MIN_SAMPLES {
            self.sorted.clear();
            self.sorted.extend(&self.recent);
            self.sorted.sort_unstable();
            self.since_refresh = 0;
        }
    }

    /// How long a write to this replica may take before it is hedged.
    pub fn hedge_delay(&self, percentile: u8) -> Option<Duration> {
        hedge_delay(&self.sorted, percentile)
    }
}

/// The hedge delay for `sorted` latencies: their `percentile`-th, but never
/// below 1.25 times their median, so that under steady latency (every
/// answer near the median) nothing is sent twice, nor below [`MIN_DELAY`].
/// `None` (never hedge) until [`MIN_SAMPLES`] are known.
fn hedge_delay(sorted: &[Duration], percentile: u8) -> Option<Duration> {
    if sorted.len() < MIN_SAMPLES {
        return None;
    }
    let at = |percentile: usize| sorted[(sorted.len() - 1) * percentile / 100];
    Some(
        at(usize::from(percentile))
            .max(at(50) * 5 / 4)
            .max(MIN_DELAY),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Attempt `n` (from 0) answers `answers[n]` after `delays[n]`.
    async fn run(
        delay: Option<Duration>,
        delays: [Duration; 2],
        answers: [Result<u32, &'static str>; 2],
    ) -> (Result<u32, &'static str>, bool, u32) {
        let made = AtomicU32::new(0);
        let (outcome, hedged) = hedged(
            delay,
            |outcome| outcome != &Err("transient"),
            || {
                let n = made.fetch_add(1, Ordering::SeqCst) as usize;
                async move {
                    tokio::time::sleep(delays[n]).await;
                    answers[n]
                }
            },
        )
        .await;
        (outcome, hedged, made.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_before_the_delay_is_not_hedged() {
        let got = run(Some(5 * MS), [4 * MS, MS], [Ok(1), Ok(2)]).await;
        assert_eq!(got, (Ok(1), false, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_delay_nothing_is_hedged() {
        let got = run(None, [40 * MS, MS], [Ok(1), Ok(2)]).await;
        assert_eq!(got, (Ok(1), false, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_first_attempt_loses_to_the_hedge() {
        let start = tokio::time::Instant::now();
        let got = run(Some(5 * MS), [40 * MS, 10 * MS], [Ok(1), Ok(2)]).await;
        assert_eq!(got, (Ok(2), true, 2));
        assert_eq!(start.elapsed(), 15 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_attempt_answering_during_the_hedge_wins() {
        let got = run(Some(5 * MS), [8 * MS, 10 * MS], [Ok(1), Ok(2)]).await;
        assert_eq!(got, (Ok(1), true, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_settling_error_counts_at_once() {
        let got = run(Some(5 * MS), [8 * MS, 10 * MS], [Err("fenced"), Ok(2)]).await;
        assert_eq!(got, (Err("fenced"), true, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_error_waits_for_the_other_attempt() {
        let got = run(Some(5 * MS), [8 * MS, 10 * MS], [Err("transient"), Ok(2)]).await;
        assert_eq!(got, (Ok(2), true, 2));
        let got = run(Some(5 * MS), [20 * MS, 6 * MS], [Ok(1), Err("transient")]).await;
        assert_eq!(got, (Ok(1), true, 2));
        let got = run(
            Some(5 * MS),
            [8 * MS, 10 * MS],
            [Err("transient"), Err("transient")],
        )
        .await;
        assert_eq!(got, (Err("transient"), true, 2));
    }

    fn millis(values: impl IntoIterator<Item = u64>) -> WriteLatencies {
        let mut latencies = WriteLatencies::default();
        for value in values {
            latencies.record(Duration::from_millis(value));
        }
        latencies
    }

    #[test]
    fn nothing_is_hedged_before_enough_answers() {
        let latencies = millis(1..16);
        assert_eq!(latencies.hedge_delay(75), None);
        let latencies = millis(1..=16);
        assert_eq!(latencies.hedge_delay(75), Some(12 * MS));
    }

    #[test]
    fn the_delay_is_the_percentile_of_the_replicas_answers() {
        // 1..=104 ms: the 75th percentile is 78 ms, above 1.25 × the median.
        let latencies = millis(1..=104);
        assert_eq!(latencies.hedge_delay(75), Some(78 * MS));
        assert_eq!(latencies.hedge_delay(90), Some(93 * MS));
    }

    #[test]
    fn under_steady_latency_the_delay_stays_above_every_answer() {
        let latencies = millis((0..200).map(|i| 100 + i % 3));
        let delay = latencies.hedge_delay(99).unwrap();
        assert_eq!(delay, MS * 505 / 4);
        assert!(latencies.recent.iter().all(|&answer| answer < delay));
    }

    #[test]
    fn a_replica_slow_all_the_time_is_judged_by_its_own_answers() {
        let fast = millis((0..96).map(|i| 10 + i % 2));
        let slow = millis((0..96).map(|i| 50 + i % 2));
        assert_eq!(fast.hedge_delay(75), Some(MS * 25 / 2));
        assert_eq!(slow.hedge_delay(75), Some(MS * 125 / 2));
    }

    #[test]
    fn answers_faster_than_a_millisecond_are_not_hedged_sooner() {
        let mut latencies = WriteLatencies::default();
        for _ in 0..MIN_SAMPLES {
            latencies.record(Duration::from_micros(50));
        }
        assert_eq!(latencies.hedge_delay(99), Some(MIN_DELAY));
    }

    #[test]
    fn only_the_latest_answers_count() {
        let mut latencies = millis(std::iter::repeat_n(100, KEPT));
        for _ in 0..KEPT {
            latencies.record(10 * MS);
        }
        assert_eq!(latencies.hedge_delay(75), Some(MS * 25 / 2));
    }

    proptest::proptest! {
        /// The delay is at least the chosen percentile and the median of
        /// the answers.
        #[test]
        fn the_delay_bounds_the_percentile(
            mut answers in proptest::collection::vec(1u64..10_000, MIN_SAMPLES..300),
            percentile in 50u8..100,
        ) {
            answers.sort_unstable();
            let sorted: Vec<Duration> = answers.iter().map(|&a| Duration::from_millis(a)).collect();
            let delay = hedge_delay(&sorted, percentile).unwrap();
            let below = sorted.iter().filter(|&&a| a <= delay).count();
            let n = sorted.len();
            proptest::prop_assert!(below * 100 > (n - 1) * usize::from(percentile));
            proptest::prop_assert!(below * 2 >= n);
        }
    }
}
