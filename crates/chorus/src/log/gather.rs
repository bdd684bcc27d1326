//! Waiting for one request per replica without letting a hung replica hold up
//! a quorum: once enough answers are in, the rest get a bounded grace period.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

/// Collects the outputs of `requests` as they finish. Once `enough` holds for
/// the outputs so far, the remaining requests get at most `grace` more; those
/// still running then are dropped (cancelled). Returns the outputs in
/// completion order.
pub async fn gather<F: Future>(
    requests: impl IntoIterator<Item = F>,
    grace: Duration,
    enough: impl Fn(&[F::Output]) -> bool,
) -> Vec<F::Output> {
    let mut pending: FuturesUnordered<F> = requests.into_iter().collect();
    let mut done = Vec::with_capacity(pending.len());
    let mut deadline = None;
    loop {
        let next = match deadline {
            None => pending.next().await,
            Some(deadline) => match tokio::time::timeout_at(deadline, pending.next()).await {
                Ok(next) => next,
                Err(_elapsed) => break,
            },
        };
        let Some(output) = next else { break };
        done.push(output);
        if deadline.is_none() && enough(&done) {
            deadline = Some(tokio::time::Instant::now() + grace);
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hung_request_is_abandoned_after_the_grace_period() {
        let delays = [10u64, 20, 1_000_000];
        let requests = delays.map(|ms| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ms
        });
        let started = tokio::time::Instant::now();
        let done = gather(requests, Duration::from_millis(100), |done| done.len() >= 2).await;
        assert_eq!(done, vec![10, 20]);
        assert_eq!(started.elapsed(), Duration::from_millis(120));
    }

    #[tokio::test(start_paused = true)]
    async fn without_enough_answers_everything_is_awaited() {
        let requests = [5u64, 50].map(|ms| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ms
        });
        let done = gather(requests, Duration::from_millis(1), |done| done.len() >= 3).await;
        assert_eq!(done, vec![5, 50]);
    }
}
