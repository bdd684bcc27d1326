//! A latency-injecting wrapper around any [`BlobStore`], for benchmarks and the
//! simulator: each operation waits a fixed or randomly drawn time first, by
//! the precise [`Timer`] unless told otherwise. The distributions
//! ([`Latency`]) are also sampled on their own, by benchmarks that inject
//! latency below other clients of the same stores.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use futures::future::BoxFuture;

use super::layer::Layer;
use super::{BlobError, DynBlobStore, Op};
use crate::timer::Timer;

/// A latency distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    /// No added latency.
    None,
    /// Always this long.
    Fixed(Duration),
    /// Uniform in `[min, max]`.
    Uniform {
        /// Shortest delay.
        min: Duration,
        /// Longest delay.
        max: Duration,
    },
    /// `min` plus an exponentially distributed extra with mean `mean_extra`: a
    /// floor with a long tail, as real object stores show.
    ShiftedExponential {
        /// Shortest delay.
        min: Duration,
        /// Mean of the extra delay above `min`.
        mean_extra: Duration,
    },
    /// Log-normal: the logarithm of the delay is normal around `ln(median)`
    /// with standard deviation `sigma`. A heavier tail than the shifted
    /// exponential: the p99 is `median · e^(2.33 σ)`.
    LogNormal {
        /// The median delay.
        median: Duration,
        /// Standard deviation of the delay's logarithm (finite, ≥ 0).
        sigma: f64,
    },
    /// `base`, except that a fraction `probability` of requests take `spike`:
    /// a steady store with rare long stalls.
    Spiky {
        /// The usual delay.
        base: Duration,
        /// The delay of a stalled request.
        spike: Duration,
        /// Fraction of requests that stall, in `[0, 1]`.
        probability: f64,
    },
}

impl Latency {
    /// Draws one delay. Deterministic for a seeded `rng`, so a benchmark or a
    /// simulation replays the same delays.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        match *self {
            Latency::None => Duration::ZERO,
            Latency::Fixed(delay) => delay,
            Latency::Uniform { min, max } => {
                assert!(min <= max, "uniform latency needs min <= max");
                rng.random_range(min..=max)
            }
            Latency::ShiftedExponential { min, mean_extra } => {
                // Inverse-CDF sampling; 1 - u lies in (0, 1], so ln is finite.
                let u: f64 = rng.random();
                min + mean_extra.mul_f64(-(1.0 - u).ln())
            }
            Latency::LogNormal { median, sigma } => {
                assert!(
                    sigma.is_finite() && sigma >= 0.0,
                    "log-normal latency needs a finite sigma >= 0"
                );
                // Capped so a far-out draw cannot overflow a Duration.
                median.mul_f64((sigma * standard_normal(rng)).exp().min(1e6))
            }
            Latency::Spiky {
                base,
                spike,
                probability,
            } => {
                assert!(
                    (0.0..=1.0).contains(&probability),
                    "spiky latency needs a probability in [0, 1]"
                );
                if rng.random::<f64>() < probability {
                    spike
                } else {
                    base
                }
            }
        }
    }
}

/// One standard normal draw (Box–Muller), so the crate needs no
/// distributions dependency for one formula.
fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    // 1 - u lies in (0, 1], so ln is finite.
    let radius = (-2.0 * (1.0 - rng.random::<f64>()).ln()).sqrt();
    radius * (std::f64::consts::TAU * rng.random::<f64>()).cos()
}

/// The latency of each operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyProfile {
    /// Latency of `create`.
    pub create: Latency,
    /// Latency of `update`.
    pub update: Latency,
    /// Latency of `get` and `get_range`.
    pub get: Latency,
    /// Latency of `head`.
    pub head: Latency,
    /// Latency of `list`.
    pub list: Latency,
    /// Latency of `delete`.
    pub delete: Latency,
}

impl LatencyProfile {
    /// The same latency for every operation.
    pub fn uniform(latency: Latency) -> LatencyProfile {
        LatencyProfile {
            create: latency,
            update: latency,
            get: latency,
            head: latency,
            list: latency,
            delete: latency,
        }
    }

    fn of(&self, op: Op) -> Latency {
        match op {
            Op::Create => self.create,
            Op::Update => self.update,
            Op::Get => self.get,
            Op::Head => self.head,
            Op::List => self.list,
            Op::Delete => self.delete,
        }
    }
}

/// A [`BlobStore`](super::BlobStore) that delays each call according to a [`LatencyProfile`].
#[derive(Debug, Clone)]
pub struct LatencyStore {
    inner: DynBlobStore,
    profile: LatencyProfile,
    rng: Arc<Mutex<StdRng>>,
    timer: Timer,
}

impl LatencyStore {
    /// Wraps `inner`; random latencies follow `seed`.
    pub fn new(inner: DynBlobStore, profile: LatencyProfile, seed: u64) -> LatencyStore {
        LatencyStore {
            inner,
            profile,
            rng: Arc::new(Mutex::new(StdRng::seed_from_u64(seed))),
            timer: Timer::Precise,
        }
    }

    /// Waits by `timer` instead ([`Timer::Tokio`] on a paused test clock).
    pub fn with_timer(mut self, timer: Timer) -> LatencyStore {
        self.timer = timer;
        self
    }

    /// Wraps `inner` so that every operation first waits `delay`: the
    /// benchmarks' model of a remote object store.
    pub fn fixed(inner: DynBlobStore, delay: Duration) -> LatencyStore {
        LatencyStore::new(inner, LatencyProfile::uniform(Latency::Fixed(delay)), 0)
    }

    async fn wait(&self, op: Op) {
        let delay = {
            let mut rng = self.rng.lock().expect("latency rng poisoned");
            self.profile.of(op).sample(&mut rng)
        };
        self.timer.sleep(delay).await;
    }
}

#[async_trait]
impl Layer for LatencyStore {
    fn inner(&self) -> &DynBlobStore {
        &self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        op: Op,
        _key: &str,
        call: BoxFuture<'_, Result<T, BlobError>>,
    ) -> Result<T, BlobError> {
        self.wait(op).await;
        call.await
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use object_store::memory::InMemory;
    use tokio::time::Instant;

    use super::*;
    use crate::blob::{BlobStore, ObjectStoreBlobs};

    /// Runs one call of `op` and returns how long it took in (paused) virtual time.
    async fn timed(store: &LatencyStore, op: Op) -> Duration {
        let version = store.inner.head("a").await.unwrap().version;
        let bytes = Bytes::from_static(b"new");
        let started = Instant::now();
        match op {
            Op::Create => drop(store.create("b", bytes).await.unwrap()),
            Op::Update => drop(store.update("a", &version, bytes).await.unwrap()),
            Op::Get => drop(store.get("a").await.unwrap()),
            Op::Head => drop(store.head("a").await.unwrap()),
            Op::List => drop(store.list("").await.unwrap()),
            Op::Delete => store.delete("b").await.unwrap(),
        }
        started.elapsed()
    }

    /// A latency set for one operation delays that operation and no other.
    #[tokio::test(start_paused = true)]
    async fn each_operation_waits_only_its_own_latency() {
        let delay = Duration::from_millis(40);
        for slow in Op::ALL {
            let mut profile = LatencyProfile::uniform(Latency::None);
            match slow {
                Op::Create => profile.create = Latency::Fixed(delay),
                Op::Update => profile.update = Latency::Fixed(delay),
                Op::Get => profile.get = Latency::Fixed(delay),
                Op::Head => profile.head = Latency::Fixed(delay),
                Op::List => profile.list = Latency::Fixed(delay),
                Op::Delete => profile.delete = Latency::Fixed(delay),
            }
            let inner = Arc::new(ObjectStoreBlobs::new(
                Arc::new(InMemory::new()),
                "",
                "memory",
            ));
            inner.create("a", Bytes::from_static(b"old")).await.unwrap();
            let store = LatencyStore::new(inner, profile, 1).with_timer(Timer::Tokio);
            for op in Op::ALL {
                let expected = if op == slow { delay } else { Duration::ZERO };
                assert_eq!(timed(&store, op).await, expected, "slow={slow} op={op}");
            }
            let started = Instant::now();
            store.get_range("a", 0..1).await.unwrap();
            let expected = if slow == Op::Get {
                delay
            } else {
                Duration::ZERO
            };
            assert_eq!(started.elapsed(), expected, "get_range counts as get");
        }
    }

    #[test]
    fn samples_stay_in_range_and_replay_from_the_seed() {
        let uniform = Latency::Uniform {
            min: Duration::from_millis(5),
            max: Duration::from_millis(10),
        };
        let tail = Latency::ShiftedExponential {
            min: Duration::from_millis(10),
            mean_extra: Duration::from_millis(2),
        };
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..100)
                .map(|_| (uniform.sample(&mut rng), tail.sample(&mut rng)))
                .collect::<Vec<_>>()
        };
        let samples = draw(7);
        assert_eq!(samples, draw(7));
        for (u, t) in samples {
            assert!(u >= Duration::from_millis(5) && u <= Duration::from_millis(10));
            assert!(t >= Duration::from_millis(10));
        }
    }

    /// `n` sorted draws of `latency` from seed 11.
    fn sorted_draws(latency: Latency, n: usize) -> Vec<Duration> {
        let mut rng = StdRng::seed_from_u64(11);
        let mut draws: Vec<_> = (0..n).map(|_| latency.sample(&mut rng)).collect();
        draws.sort_unstable();
        draws
    }

    #[test]
    fn log_normal_draws_center_on_the_median_with_the_expected_tail() {
        let median = Duration::from_millis(10);
        let draws = sorted_draws(Latency::LogNormal { median, sigma: 0.5 }, 40_000);
        let at = |q: f64| draws[(draws.len() as f64 * q) as usize].as_secs_f64() * 1000.0;
        // p50 = 10 ms; p99 = 10 · e^(0.5 · 2.326) ≈ 32.0 ms.
        assert!((at(0.5) - 10.0).abs() < 0.3, "p50 {}", at(0.5));
        assert!((at(0.99) - 32.0).abs() < 2.0, "p99 {}", at(0.99));
        let fixed = sorted_draws(Latency::LogNormal { median, sigma: 0.0 }, 10);
        assert!(fixed.iter().all(|d| *d == median), "sigma 0 is fixed");
    }

    #[test]
    fn spiky_draws_stall_the_given_fraction_of_requests() {
        let base = Duration::from_millis(10);
        let spike = Duration::from_millis(500);
        let draws = sorted_draws(
            Latency::Spiky {
                base,
                spike,
                probability: 0.01,
            },
            100_000,
        );
        let spikes = draws.iter().filter(|d| **d == spike).count();
        assert!(draws.iter().all(|d| *d == base || *d == spike));
        assert!((900..=1100).contains(&spikes), "{spikes} spikes");
    }
}
