//! Rebuilding the in-memory stores from containerd at start-up.
//!
//! Each item loads with its own timeout and concurrently with the others, so one broken
//! or hung item cannot block start-up; what cannot be loaded is logged and skipped.

use std::time::Duration;

use futures::StreamExt;

use crate::containerd::{Containerd, ContainerdError};
use crate::image::load::load_image;
use crate::store::ImageStore;

/// Bound on loading one item.
pub const ITEM_TIMEOUT: Duration = Duration::from_secs(10);
/// Items loaded at once.
const CONCURRENCY: usize = 8;

/// Loads every image record of the namespace into `store`; returns how many images
/// (distinct IDs) the store holds afterwards.
pub async fn recover_images(
    containerd: &Containerd,
    store: &ImageStore,
) -> Result<usize, ContainerdError> {
    let records = containerd.list_images().await?;
    let total = records.len();
    let mut loads = futures::stream::iter(records)
        .map(|record| async move {
            let loaded = tokio::time::timeout(ITEM_TIMEOUT, load_image(containerd, &record)).await;
            (record.name, loaded)
        })
        .buffer_unordered(CONCURRENCY);
    while let Some((name, loaded)) = loads.next().await {
        match loaded {
            Ok(Ok(image)) => store.add(image),
            Ok(Err(e)) => {
                tracing::warn!(image = %name, error = %e, "skipping image that cannot be loaded")
            }
            Err(_) => {
                tracing::warn!(image = %name, timeout = ?ITEM_TIMEOUT, "skipping image that did not load in time")
            }
        }
    }
    tracing::info!(records = total, images = store.len(), "images recovered");
    Ok(store.len())
}
