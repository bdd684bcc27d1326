//! The replicated log: write path, recovery, replay and readers (docs/protocol.md).
//!
//! ```no_run
//! # async fn example(stores: chorus::log::LogStores) -> Result<(), chorus::log::LogError> {
//! use chorus::ids::RecordIndex;
//! use chorus::log::{LogConfig, Recovery};
//!
//! let recovery = Recovery::run(stores, LogConfig::default()).await?;
//! let mut replay = recovery.replay(recovery.floor())?;
//! while let Some((index, record)) = replay.next().await? {
//!     // apply `record` to the state machine
//! #   let _ = (index, record);
//! }
//! let writer = recovery.start().await?;
//! let receipt = writer.append(&b"hello"[..])?.await?;
//! # let _ = receipt;
//! # Ok(()) }
//! ```

mod config;
mod error;
pub mod gather;
pub mod layout;
pub mod maintenance;
mod metrics;
pub(crate) mod offload;
pub mod probe;
pub mod quorum;
mod reader;
mod recovery;
mod replay;
mod replica;
mod retry;
mod seal;
pub mod transitions;
mod write;

use std::fmt;
use std::sync::Arc;

pub use config::{ConfigError, HedgeAfter, LogConfig};
pub use error::{ErrorKind, LogError, StopReason};
pub use reader::Reader;
pub use recovery::Recovery;
pub use replay::Replay;
pub use replica::Replica;
pub use write::{Completion, MAX_DIRECTORY_ENTRY_BYTES, Receipt, Writer, WriterStatus};

use crate::blob::DynBlobStore;
use crate::register::ManifestStore;

/// Where a log lives: its replicas, in register order, and its register.
#[derive(Clone)]
pub struct LogStores {
    /// `(identity, store)` per replica; identities are what the register binds.
    pub replicas: Vec<(String, DynBlobStore)>,
    /// The manifest register.
    pub register: Arc<dyn ManifestStore>,
}

impl fmt::Debug for LogStores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStores")
            .field("replicas", &self.identities())
            .field("register", &self.register.name())
            .finish()
    }
}

impl LogStores {
    /// The replica identities, in order.
    pub fn identities(&self) -> Vec<String> {
        self.replicas
            .iter()
            .map(|(identity, _)| identity.clone())
            .collect()
    }

    /// The replicas with their positions.
    pub fn replicas(&self) -> Vec<Replica> {
        self.replicas
            .iter()
            .enumerate()
            .map(|(position, (_, store))| Replica {
                position,
                store: store.clone(),
            })
            .collect()
    }
}
