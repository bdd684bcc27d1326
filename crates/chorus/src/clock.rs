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
//!
//! A deadline must also pass while the host or VM is suspended, since the
//! other nodes' wall clocks go on meanwhile. `Instant` cannot promise that (on
//! Linux it is `CLOCK_MONOTONIC`, which stops during suspend), so
//! [`SystemClock`] reads `CLOCK_BOOTTIME` on Linux and Android, which does not.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of wall-clock and monotonic time; see the module docs.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch by this node's wall clock.
    fn wall_ms(&self) -> u64;

    /// The current monotonic instant, for this process's own deadlines. It
    /// should count time the host spent suspended (see [`SystemClock`]), or a
    /// lease holder trusts its lease for that much longer than the document says.
    fn now(&self) -> Instant;
}

/// A shared, dynamically typed clock.
pub type DynClock = Arc<dyn Clock>;

/// The operating system's clocks.
///
/// The monotonic face counts suspended time where the system has a clock for
/// it: on Linux and Android it follows `CLOCK_BOOTTIME`, expressed as an
/// `Instant` (one anchor per process, so all `SystemClock`s agree), and it
/// never runs behind `Instant::now()`. Elsewhere, or if that clock cannot be
/// read, it is `Instant::now()`, whose behaviour across a suspend depends on
/// the platform (macOS's `CLOCK_UPTIME_RAW`, for one, stops).
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
        let Some(anchor) = boot_anchor() else {
            return Instant::now();
        };
        // Boot time first: a pause between the two reads then understates the
        // suspend (harmless, the next reading catches up) instead of inventing one.
        let boot_now = boot_time();
        anchor.at(boot_now, Instant::now())
    }
}

/// The process's one anchor, so instants of every `SystemClock` are comparable.
static BOOT_ANCHOR: OnceLock<Option<BootAnchor>> = OnceLock::new();

/// The anchor, read on first use; `None` without a boot-time clock.
fn boot_anchor() -> Option<&'static BootAnchor> {
    BOOT_ANCHOR
        .get_or_init(|| {
            let instant = Instant::now();
            boot_time().map(|boot| BootAnchor::new(instant, boot))
        })
        .as_ref()
}

/// Maps readings of the boot-time clock onto `Instant`s: an `Instant` and a
/// boot-time reading taken together, and the time suspended since then.
#[derive(Debug)]
struct BootAnchor {
    instant: Instant,
    boot: Duration,
    /// The most time spent suspended since the anchor that any reading showed,
    /// in nanoseconds. Only ever raised, so the face never goes back, even if
    /// the boot-time clock stops answering.
    suspended_ns: AtomicU64,
}

impl BootAnchor {
    fn new(instant: Instant, boot: Duration) -> BootAnchor {
        BootAnchor {
            instant,
            boot,
            suspended_ns: AtomicU64::new(0),
        }
    }

    /// `instant_now` plus the time suspended since the anchor: boot time
    /// elapsed (`boot_now`, if it could be read) beyond `Instant` elapsed.
    fn at(&self, boot_now: Option<Duration>, instant_now: Instant) -> Instant {
        if let Some(boot_now) = boot_now {
            let booted = boot_now.saturating_sub(self.boot);
            let awake = instant_now.saturating_duration_since(self.instant);
            let suspended = booted.saturating_sub(awake).as_nanos();
            let suspended = u64::try_from(suspended).unwrap_or(u64::MAX);
            self.suspended_ns.fetch_max(suspended, Ordering::Relaxed);
        }
        instant_now + Duration::from_nanos(self.suspended_ns.load(Ordering::Relaxed))
    }
}

/// Time since boot including suspend (`CLOCK_BOOTTIME`); `None` if it cannot be read.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn boot_time() -> Option<Duration> {
    let mut now = std::mem::MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: `now` points to writable memory for one `timespec`, which
    // clock_gettime fills when it returns 0.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, now.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: clock_gettime returned 0, so it initialised `now`.
    let now = unsafe { now.assume_init() };
    let seconds = u64::try_from(now.tv_sec).ok()?;
    let nanos = u32::try_from(now.tv_nsec).ok()?;
    Some(Duration::new(seconds, nanos))
}

/// No boot-time clock here: [`SystemClock`] uses `Instant` alone.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boot_time() -> Option<Duration> {
    None
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

    #[test]
    fn system_clock_never_runs_behind_instant_nor_back() {
        let clock = SystemClock;
        let mut last = clock.now();
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(5));
            let before = Instant::now();
            let now = clock.now();
            assert!(now >= before, "behind Instant by {:?}", before - now);
            assert!(now >= last, "went back by {:?}", last - now);
            last = now;
        }
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn system_clock_reads_the_boot_time_clock_here() {
        assert!(boot_time().is_some());
        assert!(boot_anchor().is_some());
    }

    const BOOT: Duration = Duration::from_secs(1_000);

    #[test]
    fn a_suspend_moves_the_deadline_face_forward() {
        let start = Instant::now();
        let anchor = BootAnchor::new(start, BOOT);
        // One second of Instant, sixty-one of boot time: a 60 s suspend.
        let woken = anchor.at(
            Some(BOOT + Duration::from_secs(61)),
            start + Duration::from_secs(1),
        );
        assert_eq!(woken, start + Duration::from_secs(61));
    }

    #[test]
    fn the_deadline_face_keeps_a_suspend_when_the_boot_clock_fails() {
        let start = Instant::now();
        let anchor = BootAnchor::new(start, BOOT);
        let woken = anchor.at(
            Some(BOOT + Duration::from_secs(61)),
            start + Duration::from_secs(1),
        );
        assert_eq!(woken, start + Duration::from_secs(61));
        // The boot-time clock stops answering: Instant goes on from there.
        let later = anchor.at(None, start + Duration::from_secs(2));
        assert_eq!(later, start + Duration::from_secs(62));
    }

    #[test]
    fn a_boot_reading_behind_instant_never_moves_the_deadline_face_back() {
        let start = Instant::now();
        let anchor = BootAnchor::new(start, BOOT);
        let now = start + Duration::from_secs(1);
        assert_eq!(anchor.at(Some(BOOT + Duration::from_millis(500)), now), now);
        assert_eq!(anchor.at(Some(BOOT - Duration::from_secs(1)), now), now);
    }
}
