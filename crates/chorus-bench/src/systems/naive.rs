//! The naive log: each record is its own object, created (create-if-absent)
//! on every store at once and acknowledged when a majority have it. No
//! batching, no register: the simplest correct-looking design, and the one
//! whose cost per record a batching log is meant to beat. On one store it
//! is the measured physical floor: exactly one store request per record.

use std::sync::Arc;

use bytes::Bytes;
use chorus::blob::DynBlobStore;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use super::{Ack, Error, Refused, System};
use crate::floor::majority;

/// An open naive log.
pub struct NaiveLog {
    stores: Vec<DynBlobStore>,
}

/// A naive log over `stores`.
pub fn open(stores: Vec<DynBlobStore>) -> NaiveLog {
    NaiveLog { stores }
}

impl System for NaiveLog {
    fn submit(&self, seq: u64, record: Bytes) -> Result<Ack, Refused> {
        let key = format!("log/{seq:020}");
        // Spawned, so the minority's creates still complete after the ack,
        // as a real client's requests already on the wire would.
        let mut creates: futures::stream::FuturesUnordered<_> = self
            .stores
            .iter()
            .map(|store| {
                let (store, key, record) = (Arc::clone(store), key.clone(), record.clone());
                tokio::spawn(async move { store.create(&key, record).await })
            })
            .collect();
        let needed = majority(self.stores.len());
        Ok(async move {
            let (mut created, mut failures) = (0, Vec::new());
            while let Some(outcome) = creates.next().await {
                match outcome {
                    Ok(Ok(_)) => created += 1,
                    Ok(Err(error)) => failures.push(error.to_string()),
                    Err(panicked) => failures.push(panicked.to_string()),
                }
                if created == needed {
                    return Ok(());
                }
            }
            Err(format!("no majority for {key}: {}", failures.join("; ")).into())
        }
        .boxed())
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        futures::future::ready(Ok(())).boxed()
    }
}
