//! An in-memory register, for tests and the simulator.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{
    DEFAULT_MAX_DIRECTORY_BYTES, Fields, ManifestStore, RegisterError, RegisterVersion,
    VersionToken, VersionedManifest,
};

/// A register held in process memory; clones share the same document.
#[derive(Debug, Clone)]
pub struct MemoryRegister {
    document: Arc<Mutex<Option<(u64, Fields)>>>,
    max_directory_bytes: usize,
    name: String,
}

impl MemoryRegister {
    /// An empty register with the default directory capacity.
    pub fn new() -> MemoryRegister {
        MemoryRegister::with_capacity(DEFAULT_MAX_DIRECTORY_BYTES)
    }

    /// An empty register whose directory holds at most `max_directory_bytes`
    /// (small values let tests reach `SegmentDirectoryFull`).
    pub fn with_capacity(max_directory_bytes: usize) -> MemoryRegister {
        MemoryRegister {
            document: Arc::new(Mutex::new(None)),
            max_directory_bytes,
            name: "memory-register".to_owned(),
        }
    }
}

impl Default for MemoryRegister {
    fn default() -> Self {
        MemoryRegister::new()
    }
}

fn counter(version: &RegisterVersion) -> Option<u64> {
    match version.0 {
        VersionToken::Counter(counter) => Some(counter),
        VersionToken::Blob(_) => None,
    }
}

#[async_trait]
impl ManifestStore for MemoryRegister {
    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError> {
        let document = self.document.lock().expect("register poisoned");
        Ok(document
            .as_ref()
            .map(|(version, fields)| VersionedManifest {
                version: RegisterVersion(VersionToken::Counter(*version)),
                fields: fields.clone(),
            }))
    }

    async fn create(&self, fields: &Fields) -> Result<RegisterVersion, RegisterError> {
        let mut document = self.document.lock().expect("register poisoned");
        if document.is_some() {
            return Err(RegisterError::already_exists(&self.name));
        }
        *document = Some((1, fields.clone()));
        Ok(RegisterVersion(VersionToken::Counter(1)))
    }

    async fn update(
        &self,
        version: &RegisterVersion,
        fields: &Fields,
    ) -> Result<RegisterVersion, RegisterError> {
        let mut document = self.document.lock().expect("register poisoned");
        match document.as_mut() {
            Some((current, stored)) if Some(*current) == counter(version) => {
                *current += 1;
                *stored = fields.clone();
                Ok(RegisterVersion(VersionToken::Counter(*current)))
            }
            _ => Err(RegisterError::conflict(&self.name)),
        }
    }

    fn max_directory_bytes(&self) -> usize {
        self.max_directory_bytes
    }
}
