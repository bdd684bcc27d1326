//! The open-loop driver: records are due at fixed times whatever the system
//! does, and each record's latency runs from when it was due, not from when
//! it was sent, so a system that falls behind is charged for the queue it
//! builds (no coordinated omission).

use std::time::Duration;

use bytes::Bytes;
use chorus::timer::Timer;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;

use crate::schedule::due;
use crate::systems::System;

/// One cell's load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// Offered rate, records per second.
    pub rate: f64,
    /// Records in the cell.
    pub records: u64,
    /// Records at the start left out of the latency percentiles.
    pub warmup: u64,
    /// Most records outstanding at once; a record due beyond it is dropped.
    pub max_outstanding: usize,
    /// How long after the last record is due the driver waits for stragglers;
    /// records still outstanding then count as failed.
    pub drain: Duration,
    /// What the driver waits for the next due record by: a record sent late
    /// counts its lateness as latency, so [`Timer::Precise`] in a benchmark
    /// (tokio's timer sends up to a millisecond late).
    pub timer: Timer,
}

/// What happened in one cell.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Run {
    /// Records acknowledged.
    pub acked: u64,
    /// Records dropped at the outstanding cap.
    pub dropped: u64,
    /// Records the system refused.
    pub refused: u64,
    /// Records that failed or were not acknowledged by the drain deadline.
    pub failed: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
    /// Acknowledgement latencies past the warm-up, from due time, sorted.
    pub latencies: Vec<Duration>,
    /// The measurement window: from the first measured record's due time
    /// to when the record after the last would be due.
    pub window: Duration,
    /// Acknowledgements that arrived within the window.
    pub acked_in_window: u64,
    /// Largest delay between a record's due time and its submission: how
    /// far the driver itself fell behind (it is counted in the latencies).
    pub max_send_lag: Duration,
}

impl Run {
    /// Acknowledgements per second within the window. A system that keeps
    /// up acknowledges as many records per second as are due, whatever its
    /// latency (the warm-up covers the first acknowledgements' delay); one
    /// that falls behind acknowledges fewer.
    pub fn achieved_rate(&self) -> f64 {
        if self.window.is_zero() {
            0.0
        } else {
            self.acked_in_window as f64 / self.window.as_secs_f64()
        }
    }
}

/// Offers `load` to `system`, each record a clone of `record`.
pub async fn run(system: &dyn System, load: &Load, record: &Bytes) -> Run {
    let start = Instant::now();
    let last_due = start + due(load.records.saturating_sub(1), load.rate);
    let deadline = last_due + load.drain;
    let window = (start + due(load.warmup, load.rate))..(start + due(load.records, load.rate));
    let mut outcome = Run {
        window: window.end - window.start,
        ..Run::default()
    };
    let mut outstanding = FuturesUnordered::new();
    let mut next = 0;
    loop {
        let now = Instant::now();
        while next < load.records && start + due(next, load.rate) <= now {
            let due_at = start + due(next, load.rate);
            outcome.max_send_lag = outcome.max_send_lag.max(now - due_at);
            if outstanding.len() >= load.max_outstanding {
                outcome.dropped += 1;
            } else {
                match system.submit(next, record.clone()) {
                    Ok(ack) => {
                        let seq = next;
                        outstanding.push(async move {
                            let result = ack.await;
                            (seq, due_at, Instant::now(), result)
                        });
                    }
                    Err(_) => outcome.refused += 1,
                }
            }
            next += 1;
        }
        if next == load.records && outstanding.is_empty() {
            break;
        }
        let wake = if next < load.records {
            start + due(next, load.rate)
        } else {
            deadline
        };
        // Completions first: a finished record frees its outstanding slot
        // before the next due record is checked against the cap.
        tokio::select! {
            biased;
            Some((seq, due_at, acked_at, result)) = outstanding.next() => {
                match result {
                    Ok(()) => {
                        outcome.acked += 1;
                        outcome.acked_in_window += u64::from(window.contains(&acked_at));
                        if seq >= load.warmup {
                            outcome.latencies.push(acked_at - due_at);
                        }
                    }
                    Err(error) => {
                        outcome.failed += 1;
                        outcome.first_error.get_or_insert_with(|| error.to_string());
                    }
                }
            }
            () = arrive(load.timer, wake) => {
                if next == load.records {
                    // The drain deadline passed with records outstanding.
                    outcome.failed += outstanding.len() as u64;
                    outcome
                        .first_error
                        .get_or_insert_with(|| format!("not acknowledged {:?} after the last was due", load.drain));
                    break;
                }
            }
        }
    }
    outcome.latencies.sort_unstable();
    outcome
}

/// A wait at least this long ends [`SPIN_MARGIN`] early and spins the rest.
const SPIN_FROM: Duration = Duration::from_millis(2);
/// How early a long wait ends before its deadline, to spin the rest.
const SPIN_MARGIN: Duration = Duration::from_micros(200);

/// Sleeps until `deadline`, resuming on time even when the runtime had
/// nothing else to do.
///
/// A runtime whose threads all sleep takes tens to hundreds of
/// microseconds to resume a task the timer thread wakes, and a record sent
/// that late is charged the lateness as latency: at 100 records/s about
/// 1 % of a 10 ms store. So with [`Timer::Precise`] a wait of at least
/// [`SPIN_FROM`] ends [`SPIN_MARGIN`] early and this task spins on the
/// clock until the deadline: its worker thread is busy for at most the
/// margin, only at light load (waits that long happen at under 500
/// records/s), when the systems measured leave the cores idle anyway.
/// [`Timer::Tokio`] never spins: a paused test clock would not move.
async fn arrive(timer: Timer, deadline: Instant) {
    let wait = deadline.saturating_duration_since(Instant::now());
    if timer == Timer::Tokio || wait < SPIN_FROM {
        return timer.sleep_until(deadline).await;
    }
    timer.sleep_until(deadline - SPIN_MARGIN).await;
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::FutureExt;
    use futures::future::BoxFuture;

    use super::*;
    use crate::systems::{Ack, Error, Refused};

    /// A system whose records take `delays[seq % len]` each, or are refused
    /// when that delay is `None`; it records what it was sent.
    struct Scripted {
        delays: Vec<Option<Duration>>,
        sent: Mutex<Vec<u64>>,
    }

    impl System for Scripted {
        fn submit(&self, seq: u64, _record: Bytes) -> Result<Ack, Refused> {
            self.sent.lock().unwrap().push(seq);
            let delay = self.delays[seq as usize % self.delays.len()].ok_or(Refused)?;
            Ok(tokio::time::sleep(delay).map(Ok).boxed())
        }

        fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
            futures::future::ready(Ok(())).boxed()
        }
    }

    fn scripted(delays: &[Option<u64>]) -> Scripted {
        Scripted {
            delays: delays
                .iter()
                .map(|d| d.map(Duration::from_millis))
                .collect(),
            sent: Mutex::default(),
        }
    }

    fn load(rate: f64, records: u64) -> Load {
        Load {
            rate,
            records,
            warmup: 0,
            max_outstanding: 1000,
            drain: Duration::from_secs(1),
            timer: Timer::Tokio,
        }
    }

    /// A spun wait still ends no earlier than its deadline, long or short.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn arriving_by_the_precise_timer_is_never_early() {
        for wait in [Duration::from_micros(300), SPIN_FROM * 2] {
            let deadline = Instant::now() + wait;
            arrive(Timer::Precise, deadline).await;
            assert!(Instant::now() >= deadline, "{wait:?}");
        }
    }

    /// With tokio's timer the wait follows a paused clock (and does not
    /// spin on a clock that never moves).
    #[tokio::test(start_paused = true)]
    async fn arriving_by_the_tokio_timer_follows_a_paused_clock() {
        let deadline = Instant::now() + SPIN_FROM * 5;
        arrive(Timer::Tokio, deadline).await;
        assert_eq!(Instant::now(), deadline);
    }

    #[tokio::test(start_paused = true)]
    async fn latency_runs_from_the_due_time_at_the_offered_rate() {
        let system = scripted(&[Some(10)]);
        let outcome = run(&system, &load(100.0, 50), &Bytes::new()).await;
        assert_eq!(outcome.acked, 50);
        assert!(
            outcome
                .latencies
                .iter()
                .all(|l| *l == Duration::from_millis(10))
        );
        // 50 records 10 ms apart: a 500 ms window holding every acknowledgement
        // but the last, 10 ms late.
        assert_eq!(outcome.window, Duration::from_millis(500));
        assert_eq!(outcome.acked_in_window, 49);
        assert!((outcome.achieved_rate() - 98.0).abs() < 1e-9);
        assert_eq!(*system.sent.lock().unwrap(), (0..50).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn warm_up_records_are_written_but_not_measured() {
        let system = scripted(&[Some(50), Some(5), Some(5), Some(5)]);
        let outcome = run(
            &system,
            &Load {
                warmup: 1,
                ..load(100.0, 4)
            },
            &Bytes::new(),
        )
        .await;
        assert_eq!(outcome.acked, 4);
        assert_eq!(outcome.latencies, vec![Duration::from_millis(5); 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_drops_and_stragglers_are_counted_not_hidden() {
        let system = scripted(&[Some(1), None]);
        let outcome = run(&system, &load(1000.0, 10), &Bytes::new()).await;
        assert_eq!((outcome.acked, outcome.refused), (5, 5));

        // 1 outstanding at most, each taking 5 ms, one due every 1 ms.
        let system = scripted(&[Some(5)]);
        let capped = Load {
            max_outstanding: 1,
            ..load(1000.0, 10)
        };
        let outcome = run(&system, &capped, &Bytes::new()).await;
        assert_eq!(outcome.acked + outcome.dropped, 10);
        assert_eq!(outcome.acked, 2, "records due at 0 ms and 5 ms");

        let system = scripted(&[Some(1), Some(5_000)]);
        let outcome = run(&system, &load(1000.0, 4), &Bytes::new()).await;
        assert_eq!((outcome.acked, outcome.failed), (2, 2));
        assert!(
            outcome
                .first_error
                .as_deref()
                .unwrap()
                .contains("not acknowledged")
        );
        assert!((outcome.achieved_rate() - 500.0).abs() < 1e-9, "2 in 4 ms");
    }
}
