//! One lane per replica: the in-order window discipline. A lane issues fragment
//! k on its replica only after fragment k − window succeeded there, which is
//! what makes recovery's fence final.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use tokio::task::AbortHandle;

use crate::log::replica::Replica;

/// A lane's bookkeeping for the active segment. Pure apart from the abort
/// handles of its requests.
#[derive(Debug)]
pub struct Lane {
    /// The replica it writes to.
    pub replica: Replica,
    /// Shed for the rest of the segment.
    pub shed: bool,
    /// Fragments `0..acked_prefix` succeeded on this replica.
    acked_prefix: u64,
    /// Succeeded fragments beyond the prefix.
    acked_ahead: BTreeSet<u64>,
    /// Fragments `0..issued` have been issued.
    issued: u64,
    /// Bytes cut for this lane and not yet acknowledged by it.
    lag_bytes: u64,
    /// Last time the lane made progress (or became busy).
    last_progress: Instant,
    /// Requests in flight (ordered, so cancellation order is deterministic).
    requests: BTreeMap<u64, AbortHandle>,
}

impl Lane {
    /// A fresh lane for a new segment.
    pub fn new(replica: Replica, now: Instant) -> Lane {
        Lane {
            replica,
            shed: false,
            acked_prefix: 0,
            acked_ahead: BTreeSet::new(),
            issued: 0,
            lag_bytes: 0,
            last_progress: now,
            requests: BTreeMap::new(),
        }
    }

    /// Whether fragment `fragment` may be issued: `fragment − window` has succeeded.
    pub fn may_issue(&self, fragment: u64, window: u64) -> bool {
        !self.shed && fragment < self.acked_prefix + window
    }

    /// Whether the lane could issue the next cut fragment right away.
    pub fn has_room(&self, next: u64, window: u64) -> bool {
        self.issued == next && self.may_issue(next, window)
    }

    /// The next fragment this lane should issue, if the window allows and it
    /// has been cut (`cut` fragments exist).
    pub fn next_to_issue(&self, cut: u64, window: u64) -> Option<u64> {
        (self.issued < cut && self.may_issue(self.issued, window)).then_some(self.issued)
    }

    /// Records that fragment `fragment` was issued, with its abort handle.
    pub fn issued(&mut self, fragment: u64, request: AbortHandle) {
        debug_assert_eq!(fragment, self.issued, "lanes issue in order");
        self.issued = fragment + 1;
        self.requests.insert(fragment, request);
    }

    /// A fragment of `bytes` was cut: the lane owes it.
    pub fn owe(&mut self, bytes: u64, now: Instant) {
        if !self.busy() {
            // An idle lane starts its stall clock when it gets work.
            self.last_progress = now;
        }
        self.lag_bytes += bytes;
    }

    /// Fragment `fragment` of `bytes` succeeded on this replica.
    pub fn acked(&mut self, fragment: u64, bytes: u64, now: Instant) {
        self.requests.remove(&fragment);
        self.acked_ahead.insert(fragment);
        while self.acked_ahead.remove(&self.acked_prefix) {
            self.acked_prefix += 1;
        }
        self.lag_bytes -= bytes;
        self.last_progress = now;
    }

    /// Whether fragment `fragment` succeeded here.
    pub fn has_acked(&self, fragment: u64) -> bool {
        fragment < self.acked_prefix || self.acked_ahead.contains(&fragment)
    }

    /// Bytes owed.
    pub fn lag_bytes(&self) -> u64 {
        self.lag_bytes
    }

    /// Whether the lane owes anything.
    pub fn busy(&self) -> bool {
        self.lag_bytes > 0 || self.issued > self.acked_prefix
    }

    /// Whether the lane has been busy without progress for longer than `timeout`.
    pub fn stalled(&self, now: Instant, timeout: Duration) -> bool {
        !self.shed && self.busy() && now.duration_since(self.last_progress) > timeout
    }

    /// Sheds the lane for the rest of the segment and cancels its requests.
    pub fn shed(&mut self) {
        self.shed = true;
        self.lag_bytes = 0;
        self.cancel();
    }

    /// Cancels every request in flight.
    pub fn cancel(&mut self) {
        for (_, request) in std::mem::take(&mut self.requests) {
            request.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::blob::ObjectStoreBlobs;

    fn lane() -> Lane {
        // The lane never reaches its store here; it needs one to exist.
        let memory = Arc::new(object_store::memory::InMemory::new());
        let store = Arc::new(ObjectStoreBlobs::new(memory, "", "memory://lane-test"));
        Lane::new(Replica { position: 0, store }, Instant::now())
    }

    fn handle() -> AbortHandle {
        tokio::spawn(async {}).abort_handle()
    }

    #[tokio::test]
    async fn the_window_bounds_issue_ahead_of_the_acked_prefix() {
        let window = 2;
        let mut lane = lane();
        let now = Instant::now();
        assert!(lane.has_room(0, window));
        for fragment in 0..2 {
            lane.owe(10, now);
            assert_eq!(lane.next_to_issue(fragment + 1, window), Some(fragment));
            lane.issued(fragment, handle());
        }
        lane.owe(10, now);
        // Fragment 2 waits for fragment 0.
        assert_eq!(lane.next_to_issue(3, window), None);
        assert!(!lane.has_room(2, window));
        // Fragment 1 succeeding first does not open the window.
        lane.acked(1, 10, now);
        assert_eq!(lane.next_to_issue(3, window), None);
        lane.acked(0, 10, now);
        assert_eq!(lane.next_to_issue(3, window), Some(2));
        assert!(lane.has_acked(1) && !lane.has_acked(2));
        assert_eq!(lane.lag_bytes(), 10);
    }

    #[tokio::test]
    async fn a_busy_lane_without_progress_stalls() {
        let mut lane = lane();
        let start = Instant::now();
        let timeout = Duration::from_secs(5);
        assert!(
            !lane.stalled(start + timeout * 2, timeout),
            "idle lanes never stall"
        );
        lane.owe(1, start);
        assert!(!lane.stalled(start + timeout, timeout));
        assert!(lane.stalled(start + timeout + Duration::from_millis(1), timeout));
        lane.shed();
        assert!(!lane.stalled(start + timeout * 2, timeout));
        assert!(!lane.may_issue(0, 4));
    }
}
