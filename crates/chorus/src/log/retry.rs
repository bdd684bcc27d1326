//! Repeating a store request that failed transiently, with doubling backoff.

use std::time::Duration;

/// The delay before retry `attempt` (1-based): `min` doubled per attempt, capped at `max`.
pub fn backoff_delay(attempt: u32, min: Duration, max: Duration) -> Duration {
    let factor = 1u32 << attempt.saturating_sub(1).min(16);
    (min * factor).min(max)
}

/// Runs `request` again, after `backoff`, while its error is `transient`,
/// at most `attempts` times in all; returns the last outcome. Only for
/// requests that are safe to repeat.
pub async fn retrying<T, E, F, Fut>(
    attempts: u32,
    (min, max): (Duration, Duration),
    transient: impl Fn(&E) -> bool,
    mut request: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        match request().await {
            Err(error) if transient(&error) && attempt < attempts => {
                tokio::time::sleep(backoff_delay(attempt, min, max)).await;
                attempt += 1;
            }
            outcome => return outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let delays: Vec<_> = (1..=5)
            .map(|a| backoff_delay(a, 10 * MS, 50 * MS))
            .collect();
        assert_eq!(delays, [10 * MS, 20 * MS, 40 * MS, 50 * MS, 50 * MS]);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_up_to_the_attempt_limit() {
        let calls = Cell::new(0);
        let outcome: Result<(), &str> = retrying(
            3,
            (MS, MS),
            |e| *e == "transient",
            || {
                calls.set(calls.get() + 1);
                async { Err("transient") }
            },
        )
        .await;
        assert_eq!((outcome, calls.get()), (Err("transient"), 3));

        calls.set(0);
        let outcome: Result<(), &str> = retrying(
            3,
            (MS, MS),
            |e| *e == "transient",
            || {
                calls.set(calls.get() + 1);
                async { Err("final") }
            },
        )
        .await;
        assert_eq!((outcome, calls.get()), (Err("final"), 1));

        calls.set(0);
        let outcome = retrying(
            3,
            (MS, MS),
            |e: &&str| *e == "transient",
            || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move { if n < 2 { Err("transient") } else { Ok(n) } }
            },
        )
        .await;
        assert_eq!(outcome, Ok(2));
    }
}
