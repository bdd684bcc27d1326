//! etcd's guarantees under faults: the history checker, tested on
//! hand-made histories (`etcd_history::tests`).

#[path = "support/etcd_history.rs"]
mod etcd_history;
