//! Sleeps that end when they are due, for injected latency and paced load.
//!
//! tokio's timer has millisecond granularity: a sleep ends at the first
//! tick at or after its deadline, rounded up, and later still when the
//! runtime is busy. A benchmark that injects 10 ms of store latency with it
//! measures 10–12 ms, so 5–20 % of every light-load figure would be the
//! timer. [`Timer::Precise`] instead registers the deadline with one
//! dedicated thread, which waits on a condition variable until the earliest
//! deadline (the kernel's high-resolution timers; on Linux the thread asks
//! for 1 µs of timer slack instead of the default 50 µs) and wakes each
//! sleeper as its deadline passes: tens of microseconds late, not a
//! millisecond, and it never spins. [`Timer::Tokio`] is tokio's own, which
//! follows a paused test clock.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Which clock ends a sleep; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Timer {
    /// tokio's timer: millisecond ticks, and it follows a paused clock.
    Tokio,
    /// The dedicated timer thread: ends within tens of microseconds of the
    /// deadline, on the real clock.
    #[default]
    Precise,
}

impl Timer {
    /// Sleeps for `duration`.
    pub async fn sleep(self, duration: Duration) {
        if !duration.is_zero() {
            self.sleep_until(tokio::time::Instant::now() + duration)
                .await;
        }
    }

    /// Sleeps until `deadline`.
    pub async fn sleep_until(self, deadline: tokio::time::Instant) {
        match self {
            Timer::Tokio => tokio::time::sleep_until(deadline).await,
            Timer::Precise => precise_sleep_until(deadline.into_std()).await,
        }
    }
}

/// Sleeps until `deadline` by the timer thread.
async fn precise_sleep_until(deadline: Instant) {
    if deadline <= Instant::now() {
        return;
    }
    let (wake, woken) = oneshot::channel();
    TimerThread::get().add(deadline, wake);
    // An error means the sender was dropped unsent, which the thread never
    // does; ending the sleep then is all that is left to do.
    let _ = woken.await;
}

/// One sleeper: its deadline, the order it came in, and how to wake it.
struct Sleeper {
    deadline: Instant,
    order: u64,
    wake: oneshot::Sender<()>,
}

impl Sleeper {
    fn key(&self) -> (Instant, u64) {
        (self.deadline, self.order)
    }
}

impl PartialEq for Sleeper {
    fn eq(&self, other: &Sleeper) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Sleeper {}

impl PartialOrd for Sleeper {
    fn partial_cmp(&self, other: &Sleeper) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Sleeper {
    /// Reversed, so the [`BinaryHeap`] (a max-heap) pops the earliest.
    fn cmp(&self, other: &Sleeper) -> Ordering {
        other.key().cmp(&self.key())
    }
}

/// The sleepers waiting, earliest first.
#[derive(Default)]
struct Queue {
    sleepers: BinaryHeap<Sleeper>,
    next_order: u64,
}

/// The process's one timer thread and its queue.
struct TimerThread {
    queue: Mutex<Queue>,
    /// Signalled when a sleeper earlier than every other arrives.
    earlier: Condvar,
}

impl TimerThread {
    /// The timer thread, started on first use.
    fn get() -> &'static TimerThread {
        static THREAD: OnceLock<&'static TimerThread> = OnceLock::new();
        THREAD.get_or_init(|| {
            let timer: &'static TimerThread = Box::leak(Box::new(TimerThread {
                queue: Mutex::default(),
                earlier: Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("chorus-timer".to_owned())
                .spawn(move || timer.run())
                .expect("the timer thread starts");
            timer
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic under the lock leaves the heap whole: every operation on
        // it is a single push or pop.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, deadline: Instant, wake: oneshot::Sender<()>) {
        let mut queue = self.lock();
        let order = queue.next_order;
        queue.next_order += 1;
        let earliest = queue
            .sleepers
            .peek()
            .is_none_or(|first| deadline < first.deadline);
        queue.sleepers.push(Sleeper {
            deadline,
            order,
            wake,
        });
        drop(queue);
        if earliest {
            self.earlier.notify_one();
        }
    }

    /// Wakes every sleeper whose deadline passed, then waits for the next
    /// deadline or an earlier sleeper; forever.
    fn run(&self) {
        ask_for_fine_timer_slack();
        let mut queue = self.lock();
        loop {
            let now = Instant::now();
            while queue
                .sleepers
                .peek()
                .is_some_and(|first| first.deadline <= now)
            {
                let sleeper = queue.sleepers.pop().expect("peeked");
                // A sleeper that gave up waiting dropped its receiver.
                let _ = sleeper.wake.send(());
            }
            queue = match queue.sleepers.peek().map(|first| first.deadline - now) {
                None => self
                    .earlier
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(wait) => {
                    self.earlier
                        .wait_timeout(queue, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

/// Asks the kernel to end this thread's timed waits within 1 µs of their
/// deadline rather than the default 50 µs (Linux's timer slack).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn ask_for_fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes
    // only this thread's timer slack; it touches no memory of ours.
    let failed = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) } != 0;
    if failed {
        tracing::debug!("the timer thread keeps the default timer slack");
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn ask_for_fine_timer_slack() {}

#[cfg(test)]
mod tests {
    use futures::future::join_all;

    use super::*;

    /// Every sleep ends no earlier than its deadline, whatever order the
    /// deadlines arrive in (a later one first, an earlier one while the
    /// thread waits for it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn precise_sleeps_never_end_before_their_deadline() {
        let start = tokio::time::Instant::now();
        let delays_ms = [7u64, 1, 5, 0, 3, 3, 9, 2];
        let ended = join_all(delays_ms.iter().map(|ms| async move {
            let deadline = start + Duration::from_millis(*ms);
            Timer::Precise.sleep_until(deadline).await;
            (deadline, tokio::time::Instant::now())
        }))
        .await;
        for (deadline, at) in ended {
            assert!(at >= deadline, "woken {:?} early", deadline - at);
        }
    }

    /// A sleep given up (its future dropped while the thread holds its
    /// deadline) costs the others nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_sleep_leaves_the_others_running() {
        let started = Instant::now();
        let cut = tokio::time::timeout(
            Duration::from_millis(1),
            Timer::Precise.sleep(Duration::from_secs(60)),
        )
        .await;
        assert!(cut.is_err());
        Timer::Precise.sleep(Duration::from_millis(4)).await;
        assert!(started.elapsed() >= Duration::from_millis(4));
    }

    /// The tokio timer follows a paused clock (as the tests of the
    /// stores that inject latency need).
    #[tokio::test(start_paused = true)]
    async fn the_tokio_timer_follows_a_paused_clock() {
        let start = tokio::time::Instant::now();
        Timer::Tokio.sleep(Duration::from_secs(3600)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3600));
    }

    #[test]
    fn sleepers_pop_earliest_first_and_in_arrival_order_on_ties() {
        let at = Instant::now();
        let mut heap = BinaryHeap::new();
        for (order, ms) in [(0u64, 5u64), (1, 1), (2, 5), (3, 0)] {
            let (wake, _) = oneshot::channel();
            heap.push(Sleeper {
                deadline: at + Duration::from_millis(ms),
                order,
                wake,
            });
        }
        let popped: Vec<u64> = std::iter::from_fn(|| heap.pop().map(|s| s.order)).collect();
        assert_eq!(popped, [3, 1, 0, 2]);
    }
}
