//! Probing a log's replicas before a writer starts on them.
//!
//! Every replica gets the capability [`probe`]. The protocol runs on a
//! quorum, so a replica that is unreachable (a transient failure, or no
//! answer at all) is tolerated while a quorum probes fine; a replica that
//! answers but does not enforce conditional writes is always refused, since
//! fencing depends on it.

use std::time::Duration;

use crate::blob::{BlobError, DynBlobStore, probe};
use crate::log::gather::gather;
use crate::log::quorum::quorum;

/// How long the last replicas may take to answer the probe once a quorum has.
pub const PROBE_GRACE: Duration = Duration::from_secs(5);

/// Why a log's replicas cannot take a writer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A replica answered, and its answer shows it cannot hold a log.
    #[error("cannot open replica {replica}: {source}")]
    Refused {
        /// The replica's identity.
        replica: String,
        /// What the probe found.
        source: BlobError,
    },
    /// More replicas are unreachable than the quorum tolerates.
    #[error(
        "cannot open replicas: {} of {total} unreachable, at most {} may be: {}",
        unreachable.len(),
        total - quorum(*total),
        unreachable.join("; ")
    )]
    NoQuorum {
        /// The number of replicas.
        total: usize,
        /// Each unreachable replica, with why.
        unreachable: Vec<String>,
    },
}

/// Probes every replica concurrently. Once a quorum has probed fine, the
/// others get `grace` more, so a replica that hangs counts as unreachable
/// instead of holding up the start.
///
/// Returns the unreachable replicas (each with why) that were tolerated;
/// the caller decides how to report them.
pub async fn probe_quorum(
    replicas: &[(String, DynBlobStore)],
    grace: Duration,
) -> Result<Vec<String>, ProbeError> {
    let needed = quorum(replicas.len());
    let probes = replicas
        .iter()
        .map(|(identity, store)| async move { (identity, probe(store.as_ref()).await) });
    let outcomes = gather(probes, grace, |done| {
        done.iter().filter(|(_, outcome)| outcome.is_ok()).count() >= needed
    })
    .await;
    let mut unreachable = Vec::new();
    let mut answered = Vec::with_capacity(outcomes.len());
    for (identity, outcome) in outcomes {
        answered.push(identity);
        match outcome {
            Ok(()) => {}
            Err(error) if error.is_transient() => unreachable.push(format!("{identity}: {error}")),
            Err(source) => {
                return Err(ProbeError::Refused {
                    replica: identity.clone(),
                    source,
                });
            }
        }
    }
    for (identity, _) in replicas {
        if !answered.contains(&identity) {
            unreachable.push(format!("{identity}: no answer within {grace:?}"));
        }
    }
    if replicas.len() - unreachable.len() < needed {
        return Err(ProbeError::NoQuorum {
            total: replicas.len(),
            unreachable,
        });
    }
    Ok(unreachable)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use object_store::memory::InMemory;

    use crate::blob::{Fault, FaultController, FaultRule, FaultyStore, ObjectStoreBlobs};

    fn replicas(count: usize) -> (Vec<(String, DynBlobStore)>, Vec<FaultController>) {
        let mut stores = Vec::new();
        let mut faults = Vec::new();
        for position in 0..count {
            let controller = FaultController::new(position as u64 + 1);
            let identity = format!("memory://replica-{position}");
            let store: DynBlobStore = Arc::new(ObjectStoreBlobs::new(
                Arc::new(InMemory::new()),
                "",
                identity.clone(),
            ));
            stores.push((
                identity,
                Arc::new(FaultyStore::new(store, controller.clone())) as DynBlobStore,
            ));
            faults.push(controller);
        }
        (stores, faults)
    }

    #[tokio::test]
    async fn every_replica_answering_is_fine() {
        let (stores, _faults) = replicas(3);
        assert!(probe_quorum(&stores, PROBE_GRACE).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_minority_unreachable_is_tolerated_and_named() {
        let (stores, faults) = replicas(5);
        faults[1].set_outage(true);
        faults[3].set_outage(true);
        let unreachable = probe_quorum(&stores, PROBE_GRACE).await.unwrap();
        assert_eq!(unreachable.len(), 2, "{unreachable:?}");
        assert!(unreachable[0].starts_with("memory://replica-1: "));
        assert!(unreachable[1].starts_with("memory://replica-3: "));
    }

    #[tokio::test]
    async fn a_majority_unreachable_is_refused() {
        let (stores, faults) = replicas(3);
        faults[0].set_outage(true);
        faults[2].set_outage(true);
        let error = probe_quorum(&stores, PROBE_GRACE).await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("cannot open replicas: 2 of 3 unreachable, at most 1 may be: "),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_never_answers_waits_only_the_grace() {
        let (stores, faults) = replicas(3);
        faults[2].add(FaultRule::new(Fault::Delay(Duration::from_secs(3600))));
        let unreachable = probe_quorum(&stores, Duration::from_secs(1)).await.unwrap();
        assert_eq!(
            unreachable,
            ["memory://replica-2: no answer within 1s".to_owned()]
        );
    }
}
