//! Chorus: a fresh log over the given replicas, with its register as
//! `manifest.json` in a store of its own, opened through recovery as any
//! writer is, with the given [`Settings`] (the defaults of a new log unless
//! `--segment-mib`, `--no-pace` or `--window` say otherwise).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::DynBlobStore;
use chorus::log::{LogConfig, LogError, LogStores, Recovery, Writer};
use chorus::register::{DEFAULT_WINDOW, ObjectRegister, initialize};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::{Ack, Error, Refused, System};

/// How long a close waits for the last appends and the final seal.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// How a Chorus log under test is set up.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The writer's configuration.
    pub config: LogConfig,
    /// Fragments in flight per replica, fixed in the register.
    pub window: u32,
}

impl Default for Settings {
    /// The defaults of a new log: `LogConfig::default()` and the default window.
    fn default() -> Settings {
        Settings {
            config: LogConfig::default(),
            window: DEFAULT_WINDOW,
        }
    }
}

/// An open Chorus writer.
pub struct ChorusLog {
    writer: Writer,
}

/// A new log over `replicas` (each known by its name) with its register
/// in `register`, created with `window`.
pub async fn create_log(
    replicas: Vec<DynBlobStore>,
    register: DynBlobStore,
    window: u32,
) -> Result<LogStores, Error> {
    let replicas: Vec<(String, DynBlobStore)> = replicas
        .into_iter()
        .map(|store| (store.name().to_owned(), store))
        .collect();
    let register = Arc::new(ObjectRegister::new(register));
    let identities = replicas.iter().map(|(id, _)| id.clone()).collect();
    initialize(register.as_ref(), identities, window).await?;
    Ok(LogStores { replicas, register })
}

/// Initializes a log over `replicas` with its register in `register`, runs
/// recovery (nothing to replay) and starts the writer.
pub async fn open(
    replicas: Vec<DynBlobStore>,
    register: DynBlobStore,
    settings: &Settings,
) -> Result<ChorusLog, Error> {
    let stores = create_log(replicas, register, settings.window).await?;
    let recovery = Recovery::run(stores, settings.config.clone()).await?;
    let mut replay = recovery.replay(recovery.end())?;
    while replay.next().await?.is_some() {}
    Ok(ChorusLog {
        writer: recovery.start().await?,
    })
}

impl System for ChorusLog {
    fn submit(&self, _seq: u64, record: Bytes) -> Result<Ack, Refused> {
        match self.writer.append(record) {
            Ok(completion) => Ok(completion
                .map(|done| done.map(drop).map_err(Error::from))
                .boxed()),
            // Admission refuses at once when the in-flight budget is spent or
            // the active segment is full: the record was not taken.
            Err(LogError::Backpressure { .. } | LogError::ActiveSegmentFull { .. }) => Err(Refused),
            Err(error) => Ok(futures::future::ready(Err(error.into())).boxed()),
        }
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        async move { Ok(self.writer.shutdown(SHUTDOWN_TIMEOUT).await?) }.boxed()
    }
}
