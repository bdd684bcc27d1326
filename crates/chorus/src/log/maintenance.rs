//! Background clean-up of objects the register no longer names.

use super::layout::segment_prefix;
use super::replica::Replica;
use crate::ids::SegmentId;

/// Deletes every fragment of `segments` on every replica, in a background task.
/// Best effort: failures are logged, and the orphan sweep collects leftovers.
pub fn delete_segments_in_background(replicas: Vec<Replica>, segments: Vec<SegmentId>) {
    tokio::spawn(async move {
        for replica in &replicas {
            for segment in &segments {
                if let Err(error) = delete_segment(replica, *segment).await {
                    tracing::warn!(?replica, %segment, %error, "could not delete old fragments");
                }
            }
        }
    });
}

async fn delete_segment(
    replica: &Replica,
    segment: SegmentId,
) -> Result<(), crate::blob::BlobError> {
    for meta in replica.store.list(&segment_prefix(segment)).await? {
        replica.store.delete(&meta.key).await?;
    }
    Ok(())
}
