//! A fault-injecting wrapper around any [`ManifestStore`], driven by the same
//! [`FaultController`] as the blob wrapper: `read` counts as [`Op::Get`],
//! `create` as [`Op::Create`] and `update` as [`Op::Update`], all on the key
//! [`REGISTER_FAULT_KEY`]. Corruption rules do not apply to registers.

use std::sync::Arc;

use async_trait::async_trait;

use super::{Fields, ManifestStore, RegisterError, RegisterVersion, VersionedManifest};
use crate::blob::{FaultController, Op};

/// The key register operations are matched against in fault rules.
pub const REGISTER_FAULT_KEY: &str = "register";

/// A [`ManifestStore`] that fails, loses responses or delays as planned by its
/// [`FaultController`].
#[derive(Debug, Clone)]
pub struct FaultyRegister {
    inner: Arc<dyn ManifestStore>,
    controller: FaultController,
}

impl FaultyRegister {
    /// Wraps `inner`; faults are controlled through `controller`.
    pub fn new(inner: Arc<dyn ManifestStore>, controller: FaultController) -> FaultyRegister {
        FaultyRegister { inner, controller }
    }

    /// The controller of this register's faults.
    pub fn controller(&self) -> &FaultController {
        &self.controller
    }

    async fn run<T>(
        &self,
        op: Op,
        call: impl Future<Output = Result<T, RegisterError>>,
    ) -> Result<T, RegisterError> {
        let plan = self.controller.plan(op, REGISTER_FAULT_KEY);
        plan.run(call, |cause| RegisterError::unavailable(self.name(), cause))
            .await
    }
}

#[async_trait]
impl ManifestStore for FaultyRegister {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError> {
        self.run(Op::Get, self.inner.read()).await
    }

    async fn create(&self, fields: &Fields) -> Result<RegisterVersion, RegisterError> {
        self.run(Op::Create, self.inner.create(fields)).await
    }

    async fn update(
        &self,
        version: &RegisterVersion,
        fields: &Fields,
    ) -> Result<RegisterVersion, RegisterError> {
        self.run(Op::Update, self.inner.update(version, fields))
            .await
    }

    fn max_directory_bytes(&self) -> usize {
        self.inner.max_directory_bytes()
    }
}
