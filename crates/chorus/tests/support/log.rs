//! A log over in-memory replicas with fault injection, for protocol tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::{DynBlobStore, FaultController, FaultyStore, MemoryStore};
use chorus::codec::Fragment;
use chorus::ids::{Epoch, FragmentIndex, RecordIndex, SegmentId};
use chorus::log::layout::{SEALED_PREFIX, fragment_key, segment_prefix};
use chorus::log::{ErrorKind, LogConfig, LogError, LogStores, Reader, Recovery, Writer};
use chorus::register::{Manifest, ManifestStore, MemoryRegister, initialize};

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
            let store: DynBlobStore = Arc::new(MemoryStore::new(format!("memory://r{position}")));
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
        open_log(&self.stores, config).await
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

    /// The register's current record.
    pub async fn manifest(&self) -> Manifest {
        read_manifest(self.stores.register.as_ref()).await
    }

    /// Another view of the same replicas and register, with fault controllers
    /// of its own: faults injected there affect only whoever opens this view
    /// (one writer), not the rest of the cluster.
    pub fn private_view(&self, seed: u64) -> (LogStores, Vec<FaultController>) {
        self.private_view_with_register(seed, Arc::clone(&self.stores.register))
    }

    /// [`Cluster::private_view`] with a register of the caller's choosing (for
    /// example a fault-injecting wrapper around this cluster's register).
    pub fn private_view_with_register(
        &self,
        seed: u64,
        register: Arc<dyn ManifestStore>,
    ) -> (LogStores, Vec<FaultController>) {
        let mut controllers = Vec::new();
        let mut replicas = Vec::new();
        for (position, ((identity, _), raw)) in
            self.stores.replicas.iter().zip(&self.raw).enumerate()
        {
            let controller = FaultController::new(seed + position as u64);
            let store: DynBlobStore = Arc::new(FaultyStore::new(raw.clone(), controller.clone()));
            replicas.push((identity.clone(), store));
            controllers.push(controller);
        }
        (LogStores { replicas, register }, controllers)
    }

    /// Writes `fragment` straight into replica `replica`'s store, at the key of
    /// its position in `segment`, bypassing every writer.
    pub async fn put_fragment(&self, replica: usize, segment: SegmentId, fragment: &Fragment) {
        self.raw[replica]
            .create(&fragment_key(segment, fragment.index()), fragment.encode())
            .await
            .expect("direct fragment write");
    }

    /// The fragment positions replica `replica` holds of `segment`.
    pub async fn fragments_on(&self, replica: usize, segment: SegmentId) -> Vec<String> {
        keys_under(&self.raw[replica], &segment_prefix(segment)).await
    }

    /// The fences replica `replica` holds in `segment`.
    pub async fn fences_on(&self, replica: usize, segment: SegmentId) -> Vec<Fragment> {
        let mut fences = Vec::new();
        for key in self.fragments_on(replica, segment).await {
            let blob = self.raw[replica].get(&key).await.expect("get fragment");
            let fragment = Fragment::decode(&blob.bytes).expect("valid fragment");
            if fragment.is_fence() {
                fences.push(fragment);
            }
        }
        fences
    }

    /// The records of every valid data fragment replica `replica` holds of
    /// `segment`, in position order.
    pub async fn records_on(&self, replica: usize, segment: SegmentId) -> Vec<Bytes> {
        let mut records = Vec::new();
        for key in self.fragments_on(replica, segment).await {
            let Ok(blob) = self.raw[replica].get(&key).await else {
                continue;
            };
            if let Ok(fragment) = Fragment::decode(&blob.bytes) {
                records.extend(fragment.records().iter().cloned());
            }
        }
        records
    }

    /// The sealed-object keys replica `replica` holds.
    pub async fn sealed_on(&self, replica: usize) -> Vec<String> {
        keys_under(&self.raw[replica], SEALED_PREFIX).await
    }

    /// The end-of-scenario check: every acknowledged record at or above the
    /// truncation floor reads back with identical bytes, with dense indices
    /// from the floor, both through a [`Reader`] and through a fresh recovery's
    /// replay. Heals every replica first. Returns the recovered records.
    pub async fn verify_acked(
        &self,
        acked: &BTreeMap<RecordIndex, Bytes>,
    ) -> Vec<(RecordIndex, Bytes)> {
        self.heal();
        let floor = self.manifest().await.trunc;
        let acked: BTreeMap<RecordIndex, Bytes> = acked
            .range(floor..)
            .map(|(index, record)| (*index, record.clone()))
            .collect();
        let acked = &acked;
        let read = self.read_from(floor.0).await.expect("reader");
        assert_dense_from(floor, &read);
        assert_acked_present(acked, &read);
        let recovered = self.recovered_records().await;
        assert_dense_from(floor, &recovered);
        assert_acked_present(acked, &recovered);
        let read_after = self
            .read_from(floor.0)
            .await
            .expect("reader after recovery");
        assert_eq!(read_after, recovered, "reader and replay disagree");
        recovered
    }
}

/// Recovers `stores`, replays everything, and starts the writer.
pub async fn open_log(
    stores: &LogStores,
    config: LogConfig,
) -> Result<(Writer, Vec<(RecordIndex, Bytes)>), LogError> {
    let recovery = Recovery::run(stores.clone(), config).await?;
    let records = replay_all(&recovery).await?;
    Ok((recovery.start().await?, records))
}

/// Consumes a recovery's replay from its floor to its end.
pub async fn replay_all(recovery: &Recovery) -> Result<Vec<(RecordIndex, Bytes)>, LogError> {
    let mut replay = recovery.replay(recovery.floor())?;
    let mut records = Vec::new();
    while let Some(record) = replay.next().await? {
        records.push(record);
    }
    Ok(records)
}

/// The current record of `register`.
pub async fn read_manifest(register: &dyn ManifestStore) -> Manifest {
    let current = register
        .read()
        .await
        .expect("register read")
        .expect("register initialized");
    Manifest::from_fields(&current.fields).expect("valid register")
}

async fn keys_under(store: &DynBlobStore, prefix: &str) -> Vec<String> {
    store
        .list(prefix)
        .await
        .expect("list")
        .into_iter()
        .map(|meta| meta.key)
        .collect()
}

/// A data fragment of `epoch` at `index`, holding `records` from `first` on.
pub fn data_fragment(epoch: Epoch, index: u64, first: u64, records: &[Bytes]) -> Fragment {
    Fragment::Data {
        epoch,
        index: FragmentIndex(index),
        first: RecordIndex(first),
        records: records.to_vec(),
    }
}

/// Appends `count` records tagged `tag` one at a time, awaiting each ack, and
/// records them in `acked`. Any refusal fails the test.
pub async fn append_acked(
    writer: &Writer,
    tag: &str,
    count: u64,
    acked: &mut BTreeMap<RecordIndex, Bytes>,
) {
    append_acked_within(writer, tag, count, acked, Duration::ZERO).await;
}

/// [`append_acked`] as an application would run it under backpressure:
/// a retryable refusal (`ActiveSegmentFull` while a rotation lands, for
/// example) is tried again for up to 10 s.
pub async fn append_acked_retrying(
    writer: &Writer,
    tag: &str,
    count: u64,
    acked: &mut BTreeMap<RecordIndex, Bytes>,
) {
    append_acked_within(writer, tag, count, acked, Duration::from_secs(10)).await;
}

/// Appends like [`append_acked`], retrying a retryable refusal of one record
/// for up to `patience`.
async fn append_acked_within(
    writer: &Writer,
    tag: &str,
    count: u64,
    acked: &mut BTreeMap<RecordIndex, Bytes>,
    patience: Duration,
) {
    for sequence in 0..count {
        let record = payload(tag, sequence);
        let deadline = tokio::time::Instant::now() + patience;
        let completion = loop {
            match writer.append(record.clone()) {
                Ok(completion) => break completion,
                Err(refused)
                    if refused.kind() == ErrorKind::Retry
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(other) => panic!("append {tag}-{sequence} not admitted: {other}"),
            }
        };
        let receipt = completion.await.expect("acknowledged");
        assert!(
            acked.insert(receipt.index, record).is_none(),
            "index reused"
        );
    }
}

/// Polls `condition` every few milliseconds until it holds; panics after `limit`.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Asserts that `records` hold exactly the indices `start, start + 1, …`.
pub fn assert_dense_from(start: RecordIndex, records: &[(RecordIndex, Bytes)]) {
    for (offset, (index, _)) in records.iter().enumerate() {
        assert_eq!(
            index.0,
            start.0 + offset as u64,
            "indices are not dense from {start}"
        );
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
