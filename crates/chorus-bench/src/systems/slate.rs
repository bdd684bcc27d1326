//! SlateDB as it is meant to be used: one database on one bucket, each put
//! awaited until its write-ahead log flush is durable; and the same with
//! its write-ahead log on a Chorus log (`chorus-slatedb`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::DynBlobStore;
use futures::FutureExt;
use futures::future::BoxFuture;
use slatedb::{Db, Settings};

use chorus_slatedb::{ChorusWal, ChorusWalOptions};

use super::chorus_log::{Settings as ChorusSettings, create_log};
use super::{Ack, Error, Refused, System};
use crate::store::InjectedStore;

/// SlateDB's default `flush_interval`.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(100);

/// L0 tables allowed before SlateDB stalls writes for its compactor. The
/// compactor is off here (it would only add noise to a write benchmark),
/// so the cap is raised beyond what a cell can fill rather than let a
/// compactor nobody runs stall the writes.
const L0_MAX_SSTS: usize = 4096;

/// An open SlateDB database.
pub struct SlateDb {
    db: Db,
}

/// The settings of every database here: WAL flushes every
/// `flush_interval` (SlateDB's own WAL only), compactor and garbage
/// collector off.
fn settings(flush_interval: Duration) -> Settings {
    Settings {
        flush_interval: Some(flush_interval),
        compactor_options: None,
        garbage_collector_options: None,
        l0_max_ssts: L0_MAX_SSTS,
        l0_max_ssts_per_key: L0_MAX_SSTS,
        ..Settings::default()
    }
}

/// Opens a fresh database on the one store in `stores`, flushing its WAL
/// every `flush_interval`.
pub async fn open(
    stores: Vec<Arc<InjectedStore>>,
    flush_interval: Duration,
) -> Result<SlateDb, Error> {
    let [store] = <[_; 1]>::try_from(stores).map_err(|_| "SlateDB uses one bucket")?;
    let db = Db::builder("bench", store as Arc<dyn object_store::ObjectStore>)
        .with_settings(settings(flush_interval))
        .build()
        .await?;
    Ok(SlateDb { db })
}

/// Opens a fresh database on `bucket` whose WAL is a new Chorus log over
/// `replicas` with its register in `register`, written with `chorus`'s
/// settings.
pub async fn open_on_chorus(
    bucket: Arc<InjectedStore>,
    replicas: Vec<DynBlobStore>,
    register: DynBlobStore,
    chorus: &ChorusSettings,
) -> Result<SlateDb, Error> {
    let stores = create_log(replicas, register, chorus.window).await?;
    let wal = ChorusWal::new(
        stores,
        ChorusWalOptions {
            log: chorus.config.clone(),
            ..ChorusWalOptions::default()
        },
    );
    let db = Db::builder("bench", bucket as Arc<dyn object_store::ObjectStore>)
        .with_settings(settings(DEFAULT_FLUSH_INTERVAL))
        .with_wal_writer(Box::new(wal))
        .build()
        .await?;
    Ok(SlateDb { db })
}

impl System for SlateDb {
    fn submit(&self, seq: u64, record: Bytes) -> Result<Ack, Refused> {
        let db = self.db.clone();
        Ok(async move {
            // Big-endian keys arrive in order, the memtable's easy case.
            let written = db.put(seq.to_be_bytes(), record).await?;
            written.await_durable().await?;
            Ok(())
        }
        .boxed())
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        async move { Ok(self.db.close().await?) }.boxed()
    }
}
