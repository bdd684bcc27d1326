//! Lease timing settings and their relationships.

use std::time::Duration;

/// Timing of a lease. Relationships (checked by [`LeaseConfig::validate`]):
/// `safety_margin < ttl` and `store_call_timeout < ttl - safety_margin`, so a
/// holder always has time for at least one refresh call before it must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long an acquire or refresh keeps others out. Longer means fewer
    /// refresh requests (cost) but a longer wait before a standby can take over
    /// a crashed holder (failover latency).
    pub ttl: Duration,
    /// How much earlier than `ttl` the holder stops writing, measured on its own
    /// monotonic clock from before the write was sent. Must exceed the largest
    /// wall-clock skew between any holder and any contender (the contender
    /// judges expiry by its own wall clock), plus monotonic drift over `ttl`.
    pub safety_margin: Duration,
    /// Bound on each store call; a call that takes longer fails as transient
    /// with an unknown outcome, which is then settled by reading back.
    pub store_call_timeout: Duration,
}

impl Default for LeaseConfig {
    fn default() -> LeaseConfig {
        LeaseConfig {
            ttl: Duration::from_secs(10),
            safety_margin: Duration::from_secs(2),
            store_call_timeout: Duration::from_secs(2),
        }
    }
}

/// A [`LeaseConfig`] whose settings contradict each other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid lease config: {reason}")]
pub struct LeaseConfigError {
    reason: String,
}

impl LeaseConfig {
    /// How long the holder may write after sending an acquire or refresh.
    pub fn write_window(&self) -> Duration {
        self.ttl.saturating_sub(self.safety_margin)
    }

    /// Checks the relationships listed on the type.
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        let fail = |reason: String| Err(LeaseConfigError { reason });
        if self.ttl < Duration::from_millis(1) {
            return fail(format!(
                "ttl_ms={} must be at least 1",
                self.ttl.as_millis()
            ));
        }
        if self.safety_margin >= self.ttl {
            return fail(format!(
                "safety_margin_ms={} must be below ttl_ms={}",
                self.safety_margin.as_millis(),
                self.ttl.as_millis()
            ));
        }
        if self.store_call_timeout.is_zero() || self.store_call_timeout >= self.write_window() {
            return fail(format!(
                "store_call_timeout_ms={} must be non-zero and below ttl_ms - safety_margin_ms={}",
                self.store_call_timeout.as_millis(),
                self.write_window().as_millis()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_bad_relationships_are_named() {
        LeaseConfig::default().validate().unwrap();
        let secs = Duration::from_secs;
        let bad = [
            (secs(5), secs(5), secs(1), "safety_margin_ms=5000"),
            (secs(5), secs(1), secs(4), "store_call_timeout_ms=4000"),
            (secs(5), secs(1), Duration::ZERO, "store_call_timeout_ms=0"),
            (Duration::ZERO, Duration::ZERO, secs(1), "ttl_ms=0"),
        ];
        for (ttl, safety_margin, store_call_timeout, named) in bad {
            let config = LeaseConfig {
                ttl,
                safety_margin,
                store_call_timeout,
            };
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains(named), "{error}");
        }
    }
}
