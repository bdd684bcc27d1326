//! The WAL's status, shared by the writer, its acknowledgement task and
//! SlateDB's observers: what is durable (the last WAL file id and sequence
//! number), what is still in flight, and why the WAL closed.

use std::sync::{Arc, Mutex};

use slatedb::wal::{WalError, WalEvent, WalObserver, WalStatus, WalStatusListener};
use tokio::sync::watch;

/// The status and its listeners.
///
/// A change goes, in this order, to the status SlateDB reads
/// ([`SharedStatus::get`]), to the listeners, and to a watch channel on
/// which flushes wait for "durable up to file N". SlateDB advances its
/// durable sequence number in its listener, and takes the replay point of a
/// memtable it freezes from the status; so once a flush or a durable put
/// resolved, both already show it. Changes happen one at a time under the
/// listeners' lock, so events arrive in order (no `WalFlushed` after
/// `WalClosed`); a listener must therefore not call back into the WAL
/// (SlateDB's only records the durable sequence number and the status).
pub(crate) struct SharedStatus {
    current: Mutex<WalStatus>,
    published: watch::Sender<WalStatus>,
    listeners: Mutex<Vec<WalStatusListener>>,
}

impl SharedStatus {
    /// A WAL whose files up to `last_flushed_wal_id` are durable.
    pub(crate) fn new(last_flushed_wal_id: u64, last_flushed_seq: Option<u64>) -> Arc<Self> {
        let status = WalStatus {
            closed_reason: None,
            estimated_bytes: 0,
            last_flushed_wal_id,
            last_flushed_seq,
            buffered_wal_entries_count: 0,
        };
        let (published, _) = watch::channel(status.clone());
        Arc::new(SharedStatus {
            current: Mutex::new(status),
            published,
            listeners: Mutex::default(),
        })
    }

    /// The status now: `Err` once closed, as SlateDB expects.
    pub(crate) fn get(&self) -> Result<WalStatus, WalStatus> {
        let status = self.current().clone();
        if status.closed_reason.is_some() {
            Err(status)
        } else {
            Ok(status)
        }
    }

    /// A receiver of every change, for waiting on durability.
    pub(crate) fn watch(&self) -> watch::Receiver<WalStatus> {
        self.published.subscribe()
    }

    fn current(&self) -> std::sync::MutexGuard<'_, WalStatus> {
        self.current.lock().expect("status lock poisoned")
    }

    /// A record of `bytes` was handed to the log and is not durable yet.
    pub(crate) fn admitted(&self, bytes: usize) {
        self.change(|status| {
            status.estimated_bytes += bytes;
            status.buffered_wal_entries_count += 1;
            None
        });
    }

    /// WAL file `wal_id` of `bytes`, whose rows reach sequence `seq`, is
    /// durable: tells the listeners, unless the WAL closed already.
    pub(crate) fn flushed(&self, wal_id: u64, seq: u64, bytes: usize) {
        self.change(|status| {
            status.estimated_bytes = status.estimated_bytes.saturating_sub(bytes);
            status.buffered_wal_entries_count = status.buffered_wal_entries_count.saturating_sub(1);
            status.last_flushed_wal_id = status.last_flushed_wal_id.max(wal_id);
            status.last_flushed_seq = Some(status.last_flushed_seq.map_or(seq, |s| s.max(seq)));
            status
                .closed_reason
                .is_none()
                .then(|| WalEvent::WalFlushed(status.clone()))
        });
    }

    /// The WAL closed for `reason` (`WalError::Closed` on a clean close);
    /// the first reason stands.
    pub(crate) fn close(&self, reason: WalError) {
        self.change(|status| {
            if status.closed_reason.is_some() {
                return None;
            }
            status.closed_reason = Some(reason);
            Some(WalEvent::WalClosed(status.clone()))
        });
    }

    /// Applies `change` to the status, tells the listeners the event it
    /// returns, then wakes the waiters.
    fn change(&self, change: impl FnOnce(&mut WalStatus) -> Option<WalEvent>) {
        let listeners = self.listeners.lock().expect("listener lock poisoned");
        let (status, event) = {
            let mut current = self.current();
            let event = change(&mut current);
            (current.clone(), event)
        };
        if let Some(event) = event {
            for listener in listeners.iter() {
                listener(event.clone());
            }
        }
        self.published.send_replace(status);
    }
}

/// SlateDB's view of the WAL's status.
pub(crate) struct Observer(pub(crate) Arc<SharedStatus>);

impl WalObserver for Observer {
    fn status(&self) -> Result<WalStatus, WalStatus> {
        self.0.get()
    }

    fn subscribe(&self, listener: WalStatusListener) -> Result<(), WalError> {
        self.0
            .listeners
            .lock()
            .expect("listener lock poisoned")
            .push(listener);
        Ok(())
    }
}
