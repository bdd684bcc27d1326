//! Injectable time.
//!
//! Protocol code never reads the system clock directly: it asks a [`Clock`], so
//! tests and the simulator can freeze, step and skew time. A clock has two
//! faces, because they answer different questions:
//!
//! - [`Clock::wall_ms`]: wall-clock milliseconds since the Unix epoch, written
//!   into documents other processes read (`expires_at_ms`). Different nodes'
//!   wall clocks disagree and may jump; the lease's safety margin absorbs the
//!   disagreement.
//! - [`Clock::now`]: a monotonic instant for a process's own deadlines (when must
//!   a lease holder stop writing?). Never compared across processes.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of wall-clock and monotonic time; see the module docs.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch by this node's wall clock.
    fn wall_ms(&self) -> u64;

    /// The current monotonic instant, for this process's own deadlines.
    fn now(&self) -> Instant;
}

/// A shared, dynamically typed clock.
pub type DynClock = Arc<dyn Clock>;

/// The operating system's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl SystemClock {
    /// The system clock as a [`DynClock`].
    pub fn shared() -> DynClock {
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    fn wall_ms(&self) -> u64 {
        // A wall clock before 1970 is a broken host; saturate rather than panic,
        // which makes every lease look expired (the safe direction for a holder
        // is decided by its monotonic deadline, not by this value).
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to, for tests and the simulator.
///
/// [`advance`](ManualClock::advance) moves both faces together (time passes);
/// [`step_wall`](ManualClock::step_wall) moves only the wall clock (an NTP step,
/// or skew between nodes), which is what makes clock-skew scenarios expressible.
#[derive(Debug)]
pub struct ManualClock {
    origin: Instant,
    state: Mutex<ManualState>,
}

#[derive(Debug)]
struct ManualState {
    elapsed: Duration,
    wall_ms: u64,
}

impl ManualClock {
    /// A clock whose wall face reads `wall_ms` and whose monotonic face starts now.
    pub fn new(wall_ms: u64) -> ManualClock {
        ManualClock {
            origin: Instant::now(),
            state: Mutex::new(ManualState {
                elapsed: Duration::ZERO,
                wall_ms,
            }),
        }
    }

    /// A new manual clock, shared.
    pub fn shared(wall_ms: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock::new(wall_ms))
    }

    fn state(&self) -> MutexGuard<'_, ManualState> {
        self.state.lock().expect("manual clock poisoned")
    }

    /// Lets `by` pass on both faces.
    pub fn advance(&self, by: Duration) {
        let mut state = self.state();
        state.elapsed += by;
        state.wall_ms = state.wall_ms.saturating_add(by.as_millis() as u64);
    }

    /// Moves only the wall face, forwards (`by_ms > 0`) or backwards.
    pub fn step_wall(&self, by_ms: i64) {
        let mut state = self.state();
        state.wall_ms = state.wall_ms.saturating_add_signed(by_ms);
    }
}

impl Clock for ManualClock {
    fn wall_ms(&self) -> u64 {
        self.state().wall_ms
    }

    fn now(&self) -> Instant {
        self.origin + self.state().elapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        let start = clock.now();
        assert_eq!((clock.wall_ms(), clock.now()), (1_000, start));
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.wall_ms(), 1_250);
        assert_eq!(clock.now() - start, Duration::from_millis(250));
        clock.step_wall(-2_000);
        assert_eq!(clock.wall_ms(), 0, "wall steps saturate at the epoch");
        assert_eq!(clock.now() - start, Duration::from_millis(250));
        clock.step_wall(500);
        assert_eq!(clock.wall_ms(), 500);
    }

    #[test]
    fn system_clock_is_after_2020_and_monotonic() {
        let clock = SystemClock;
        assert!(clock.wall_ms() > 1_577_836_800_000);
        let first = clock.now();
        assert!(clock.now() >= first);
    }
}
