//! A log over in-memory replicas with fault injection, for protocol tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::{DynBlobStore, FaultController, FaultyStore, ObjectStoreBlobs};
use chorus::ids::RecordIndex;
use chorus::log::{LogConfig, LogError, LogStores, Reader, Recovery, Writer};
use chorus::register::{ManifestStore, MemoryRegister, initialize};

/// N in-memory replicas, each behind its own fault controller, and a register.
pub struct Cluster {
    /// Fault controllers, one per replica.
    pub faults: Vec<FaultController>,
    /// The replicas without fault injection.
    pub raw: Vec<DynBlobStore>,
    /// What writers and readers open.
    pub stores: LogStores,
}

impl Cluster {
    /// A fresh log of `replicas` replicas with the given window.
    pub async fn new(replicas: usize, window: u32) -> Cluster {
        Self::with_register(replicas, window, Arc::new(MemoryRegister::new())).await
    }

    /// A fresh log with a given register.
    pub async fn with_register(
        replicas: usize,
        window: u32,
        register: Arc<dyn ManifestStore>,
    ) -> Cluster {
        let mut faults = Vec::new();
        let mut raw = Vec::new();
        let mut stored = Vec::new();
        for position in 0..replicas {
            let memory = Arc::new(object_store::memory::InMemory::new());
            let store: DynBlobStore = Arc::new(ObjectStoreBlobs::new(
                memory,
                "",
                format!("memory://r{position}"),
            ));
            let controller = FaultController::new(position as u64 + 1);
            let faulty: DynBlobStore =
                Arc::new(FaultyStore::new(store.clone(), controller.clone()));
            stored.push((format!("memory://r{position}"), faulty));
            raw.push(store);
            faults.push(controller);
        }
        let identities = stored
            .iter()
            .map(|(identity, _)| identity.clone())
            .collect();
        initialize(register.as_ref(), identities, window)
            .await
            .unwrap();
        Cluster {
            faults,
            raw,
            stores: LogStores {
                replicas: stored,
                register,
            },
        }
    }

    /// Recovers, replays everything, and returns the writer with the replayed records.
    pub async fn open(
        &self,
        config: LogConfig,
    ) -> Result<(Writer, Vec<(RecordIndex, Bytes)>), LogError> {
        let recovery = Recovery::run(self.stores.clone(), config).await?;
        let mut replay = recovery.replay(recovery.floor())?;
        let mut records = Vec::new();
        while let Some(record) = replay.next().await? {
            records.push(record);
        }
        Ok((recovery.start().await?, records))
    }

    /// Recovers and returns the replayed records (the writer is shut down).
    pub async fn recovered_records(&self) -> Vec<(RecordIndex, Bytes)> {
        let (writer, records) = self.open(test_config()).await.expect("recovery");
        writer.shutdown(Duration::from_secs(5)).await.unwrap();
        records
    }

    /// Everything a reader returns from `from` until it catches up.
    pub async fn read_from(&self, from: u64) -> Result<Vec<(RecordIndex, Bytes)>, LogError> {
        let mut reader = Reader::new(&self.stores, RecordIndex(from));
        let mut records = Vec::new();
        while let Some(record) = reader.try_next().await? {
            records.push(record);
        }
        Ok(records)
    }

    /// Heals every replica.
    pub fn heal(&self) {
        for controller in &self.faults {
            controller.clear();
        }
    }
}

/// Settings that make tests fast: small fragments and segments, short timeouts.
pub fn test_config() -> LogConfig {
    LogConfig {
        max_fragment_bytes: 64 * 1024,
        max_record_bytes: 16 * 1024,
        max_inflight_bytes: 16 * 1024 * 1024,
        max_replica_lag_bytes: 1024 * 1024,
        lane_stall_timeout: Duration::from_millis(500),
        max_segment_bytes: 1024 * 1024,
        max_active_segment_bytes: 64 * 1024 * 1024,
        retry_backoff_min: Duration::from_millis(5),
        retry_backoff_max: Duration::from_millis(50),
        ..LogConfig::default()
    }
}

/// A record payload that names its writer and sequence number.
pub fn payload(tag: &str, sequence: u64) -> Bytes {
    Bytes::from(format!("{tag}-{sequence:08}"))
}

/// Asserts that every acknowledged record is in `records` with identical bytes.
pub fn assert_acked_present(
    acked: &BTreeMap<RecordIndex, Bytes>,
    records: &[(RecordIndex, Bytes)],
) {
    let found: BTreeMap<RecordIndex, Bytes> = records.iter().cloned().collect();
    for (index, bytes) in acked {
        assert_eq!(
            found.get(index),
            Some(bytes),
            "acknowledged record {index} lost or changed"
        );
    }
    let indices: Vec<u64> = records.iter().map(|(i, _)| i.0).collect();
    if let (Some(first), Some(last)) = (indices.first(), indices.last()) {
        assert_eq!(
            indices,
            (*first..=*last).collect::<Vec<_>>(),
            "indices are not dense"
        );
    }
}
