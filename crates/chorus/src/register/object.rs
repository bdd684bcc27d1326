//! The register as a JSON object in any CAS-capable blob store, written with
//! create-if-absent and updated with if-match on its version token.

use async_trait::async_trait;
use bytes::Bytes;

use super::{
    DEFAULT_MAX_DIRECTORY_BYTES, Fields, ManifestStore, RegisterError, RegisterVersion,
    VersionToken, VersionedManifest,
};
use crate::blob::{BlobError, DynBlobStore};

/// The register document's key in its store.
pub const REGISTER_KEY: &str = "manifest.json";

/// A register stored as the object `manifest.json` in a blob store.
#[derive(Debug, Clone)]
pub struct ObjectRegister {
    store: DynBlobStore,
    name: String,
}

impl ObjectRegister {
    /// A register in `store` (which must enforce conditional writes; open it
    /// with [`open_store`](crate::blob::open_store) so it has been probed).
    pub fn new(store: DynBlobStore) -> ObjectRegister {
        let name = format!("{} key={REGISTER_KEY}", store.name());
        ObjectRegister { store, name }
    }

    fn error(&self, error: BlobError) -> RegisterError {
        match error {
            // A CAS on a vanished document is a conflict: it is not at `version`.
            BlobError::Conflict { .. } | BlobError::NotFound { .. } => {
                RegisterError::conflict(&self.name)
            }
            BlobError::AlreadyExists { .. } => RegisterError::already_exists(&self.name),
            error @ BlobError::Unavailable { .. } => RegisterError::unavailable(&self.name, error),
            error => RegisterError::backend(&self.name, error),
        }
    }
}

fn encode(fields: &Fields) -> Bytes {
    Bytes::from(serde_json::to_vec_pretty(fields).expect("string maps encode"))
}

#[async_trait]
impl ManifestStore for ObjectRegister {
    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError> {
        let blob = match self.store.get(REGISTER_KEY).await {
            Ok(blob) => blob,
            Err(BlobError::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(self.error(error)),
        };
        let fields: Fields = serde_json::from_slice(&blob.bytes).map_err(|e| {
            RegisterError::backend(
                &self.name,
                format!("register document is not a JSON object of strings: {e}"),
            )
        })?;
        Ok(Some(VersionedManifest {
            version: RegisterVersion(VersionToken::Blob(blob.version)),
            fields,
        }))
    }

    async fn create(&self, fields: &Fields) -> Result<RegisterVersion, RegisterError> {
        let version = self
            .store
            .create(REGISTER_KEY, encode(fields))
            .await
            .map_err(|e| self.error(e))?;
        Ok(RegisterVersion(VersionToken::Blob(version)))
    }

    async fn update(
        &self,
        version: &RegisterVersion,
        fields: &Fields,
    ) -> Result<RegisterVersion, RegisterError> {
        let VersionToken::Blob(expected) = &version.0 else {
            return Err(RegisterError::conflict(&self.name));
        };
        let version = self
            .store
            .update(REGISTER_KEY, expected, encode(fields))
            .await
            .map_err(|e| self.error(e))?;
        Ok(RegisterVersion(VersionToken::Blob(version)))
    }

    fn max_directory_bytes(&self) -> usize {
        DEFAULT_MAX_DIRECTORY_BYTES
    }
}
