//! Where a WAL lives, in the user's terms: replica URLs and a register URL.

use chorus::blob::{BlobError, StoreUrl, open_store_unprobed};
use chorus::log::LogStores;
use chorus::log::probe::{PROBE_GRACE, ProbeError, probe_quorum};
use chorus::register::{
    DEFAULT_WINDOW, InitError, OpenMode, RegisterError, RegisterUrl, initialize, open_register,
};

/// The WAL's replicas (1, 3 or 5, any mix of `file://`, `s3://`, `gs://`,
/// `az://` locations) and its register (`sqlite://`, `postgres://` or an
/// object location).
#[derive(Debug, Clone)]
pub struct WalLocation {
    /// The replicas, in order; the order is bound into the register.
    pub replicas: Vec<StoreUrl>,
    /// The log's register.
    pub register: RegisterUrl,
    /// Fragments in flight per replica, fixed when the log is created.
    pub window: u32,
}

/// Why a [`WalLocation`] could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The register could not be opened or created.
    #[error("cannot open the WAL register {url}: {source}")]
    Register {
        /// The register's URL (without credentials).
        url: String,
        /// What failed.
        source: RegisterError,
    },
    /// A replica's location could not be opened (a bad URL or directory).
    #[error("cannot open WAL replica {url}: {source}")]
    Replica {
        /// The replica's identity.
        url: String,
        /// What failed.
        source: BlobError,
    },
    /// A replica failed the conditional-write probe, or fewer than a quorum
    /// answered it.
    #[error("the WAL replicas cannot take a writer: {0}")]
    Probe(#[from] ProbeError),
    /// The register holds a log bound to other replicas, or is malformed.
    #[error("the WAL register {url} does not fit these replicas: {source}")]
    Init {
        /// The register's URL (without credentials).
        url: String,
        /// What failed.
        source: InitError,
    },
}

impl WalLocation {
    /// A location with the default window.
    pub fn new(replicas: Vec<StoreUrl>, register: RegisterUrl) -> WalLocation {
        WalLocation {
            replicas,
            register,
            window: DEFAULT_WINDOW,
        }
    }

    /// Opens the register and every replica, creating the log if the
    /// register holds none; an existing log must be bound to exactly these
    /// replicas, in this order.
    ///
    /// Every replica gets the conditional-write probe. A minority that is
    /// unreachable (down, or silent for [`PROBE_GRACE`] after a quorum
    /// answered) is logged and tolerated, as the log itself tolerates it.
    pub async fn open(&self) -> Result<LogStores, OpenError> {
        let register = open_register(&self.register, OpenMode::CreateIfMissing)
            .await
            .map_err(|source| OpenError::Register {
                url: self.register.to_string(),
                source,
            })?;
        let mut replicas = Vec::with_capacity(self.replicas.len());
        for url in &self.replicas {
            let store = open_store_unprobed(url).map_err(|source| OpenError::Replica {
                url: url.identity(),
                source,
            })?;
            replicas.push((url.identity(), store));
        }
        for replica in probe_quorum(&replicas, PROBE_GRACE).await? {
            tracing::warn!(%replica, "WAL replica unreachable; continuing on the others");
        }
        let identities = replicas
            .iter()
            .map(|(identity, _)| identity.clone())
            .collect();
        initialize(register.as_ref(), identities, self.window)
            .await
            .map_err(|source| OpenError::Init {
                url: self.register.to_string(),
                source,
            })?;
        Ok(LogStores { replicas, register })
    }
}
