//! The tokio runtimes a run executes on: current-thread, with the paused
//! clock (virtual time), so that a run is a function of its seed. The
//! runtime phase gets one of its own whose blocking pool is gated
//! ([`GatedRuntime`]).

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The paused current-thread runtime the log and lease phases run on.
pub(crate) fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds")
}

/// The runtime phase's discipline for tokio's blocking pool; see
/// [`GatedRuntime`].
#[derive(Debug, Default)]
struct BlockingGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    /// Pool threads spawned and not stopped yet.
    alive: usize,
    /// Whether pool threads may run: the runtime thread is draining them.
    open: bool,
    /// Open for good: the runtime is being dropped.
    shut: bool,
}

/// How long the runtime thread waits for the pool to drain before calling
/// it a hang (a blocking task of the system under test that never ends).
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

impl BlockingGate {
    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().expect("blocking gate")
    }

    /// Tokio names a pool thread on the spawning (runtime) thread, as it
    /// spawns it: counting here cannot miss a thread that has not started.
    fn spawned(&self) {
        self.state().alive += 1;
    }

    /// A pool thread starts: it waits until the runtime thread drains.
    fn starting(&self) {
        let mut state = self.state();
        while !state.open && !state.shut {
            state = self.changed.wait(state).expect("blocking gate");
        }
    }

    fn stopped(&self) {
        self.state().alive -= 1;
        self.changed.notify_all();
    }

    /// The runtime thread is about to park: every blocking task spawned so
    /// far runs to its end, and its thread exits, before it goes on.
    fn drain(&self) {
        let mut state = self.state();
        if state.alive == 0 {
            return;
        }
        state.open = true;
        self.changed.notify_all();
        let started = Instant::now();
        while state.alive > 0 && !state.shut {
            let (next, _) = self
                .changed
                .wait_timeout(state, Duration::from_millis(100))
                .expect("blocking gate");
            state = next;
            assert!(
                started.elapsed() < DRAIN_LIMIT,
                "a blocking task of the system under test ran for over {DRAIN_LIMIT:?}"
            );
        }
        state.open = false;
    }

    /// Lets every pool thread go (the runtime is being dropped).
    fn shut(&self) {
        self.state().shut = true;
        self.changed.notify_all();
    }
}

/// The paused current-thread runtime the runtime phase runs on, with its
/// blocking pool gated.
///
/// The `chorus` runtime encodes and restores snapshots with
/// `tokio::task::spawn_blocking`, on the blocking pool, in real time. The
/// paused clock does not advance while a blocking task is in flight, so only
/// the order of events within one virtual instant is at stake, but with
/// tokio's defaults that order depends on the host's load: a task may finish
/// before the runtime first polls its `JoinHandle` (when the runtime thread
/// is preempted right after waking the pool thread) and its continuation
/// then runs at once, ahead of other work ready at that instant; or it
/// finishes later and its wake-up lands on the scheduler's remote queue at
/// any point. The settings below make the order a function of the seed:
///
/// - Blocking tasks run only while the runtime thread waits for them: pool
///   threads wait at a gate when they start (`on_thread_start`), and the
///   runtime thread, whenever it is about to park (nothing else can run at
///   the current instant), opens the gate and waits until every pool thread
///   spawned so far has finished and exited (`on_thread_park`, with the
///   threads counted as tokio names them and as they stop). One pool thread
///   at most (`max_blocking_threads`) runs them in the order they were
///   spawned, and it exits as soon as it is idle (`thread_keep_alive`), so no
///   thread outlives a drain to pick up a later task unseen. A blocking task
///   thus always completes at the first park after it was spawned.
/// - Its wake-up then waits on the remote queue, which the scheduler reads
///   only once the local queue is empty (`global_queue_interval`), and the
///   timer driver is polled after every task (`event_interval`).
///
/// Without them, one seed in twenty diverged between two runs on a loaded
/// machine (docs/testing.md, "Determinism").
pub(crate) struct GatedRuntime {
    gate: Arc<BlockingGate>,
    runtime: tokio::runtime::Runtime,
}

impl GatedRuntime {
    /// A paused current-thread runtime with its blocking pool gated.
    pub(crate) fn new() -> GatedRuntime {
        let gate = Arc::new(BlockingGate::default());
        let (names, starts, stops, parks) =
            (gate.clone(), gate.clone(), gate.clone(), gate.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .global_queue_interval(u32::MAX)
            .event_interval(1)
            .max_blocking_threads(1)
            .thread_keep_alive(Duration::ZERO)
            .thread_name_fn(move || {
                names.spawned();
                "chorus-sim-blocking".to_owned()
            })
            .on_thread_start(move || starts.starting())
            .on_thread_stop(move || stops.stopped())
            .on_thread_park(move || parks.drain())
            .build()
            .expect("a current-thread runtime builds");
        GatedRuntime { gate, runtime }
    }

    /// Runs `future` to completion on this runtime.
    pub(crate) fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

impl Drop for GatedRuntime {
    /// Opens the gate for good: the runtime, dropped after this, waits for
    /// its pool threads to exit.
    fn drop(&mut self) {
        self.gate.shut();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However fast the blocking pool is, a blocking task's continuation runs
    /// only once nothing else can run at its virtual instant: a task that is
    /// still yielding (ready work at the same instant) always finishes first,
    /// and blocking tasks spawned back to back (a pool thread still finishing
    /// the previous one could take the next at once) complete in spawn order.
    /// With tokio's defaults the empty closures below finish at once and
    /// their continuations run first in most rounds (90 of 100 when measured).
    #[test]
    fn blocking_work_completes_only_when_nothing_else_can_run() {
        let runtime = GatedRuntime::new();
        let orders = runtime.block_on(async {
            let mut orders = Vec::new();
            for _ in 0..100 {
                let log = Arc::new(Mutex::new(String::new()));
                let blocking = tokio::spawn({
                    let log = log.clone();
                    async move {
                        tokio::task::spawn_blocking(|| ())
                            .await
                            .expect("blocking task");
                        log.lock().expect("log").push('b');
                    }
                });
                let busy = tokio::spawn({
                    let log = log.clone();
                    async move {
                        for _ in 0..100 {
                            tokio::task::yield_now().await;
                        }
                        log.lock().expect("log").push('o');
                    }
                });
                blocking.await.expect("blocking side");
                busy.await.expect("busy side");
                orders.push(log.lock().expect("log").clone());
            }
            orders
        });
        drop(runtime);
        let early = orders.iter().filter(|order| *order != "ob").count();
        assert_eq!(early, 0, "{orders:?}");
    }
}
