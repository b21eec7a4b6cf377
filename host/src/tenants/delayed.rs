//! Copies waiting for their `retry-after` delay. They live only in the
//! process: a graceful stop publishes them early; only a crash loses them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::MountMetrics;
use crate::broker::Publisher;
use crate::broker::message::{self, AmqpMessage};
use crate::events::Event;
use crate::sandbox::LogTags;

/// The pending delayed copies of one mount.
pub(crate) struct DelayedCopies {
    publisher: Publisher,
    address: String,
    tags: Arc<LogTags>,
    events: broadcast::Sender<Event>,
    metrics: MountMetrics,
    tracker: TaskTracker,
    flush: CancellationToken,
}

impl DelayedCopies {
    pub(crate) fn new(
        publisher: Publisher,
        address: String,
        tags: Arc<LogTags>,
        events: broadcast::Sender<Event>,
        metrics: MountMetrics,
    ) -> DelayedCopies {
        DelayedCopies {
            publisher,
            address,
            tags,
            events,
            metrics,
            tracker: TaskTracker::new(),
            flush: CancellationToken::new(),
        }
    }

    /// Publishes `copy` to the subscription address once `delay` has passed
    /// (or at once when the mount is stopping). `slot`, the tenant's room for
    /// one more pending copy, is held until then.
    pub(crate) fn schedule(
        &self,
        copy: AmqpMessage,
        retry_count: u32,
        delay: Duration,
        slot: Option<OwnedSemaphorePermit>,
    ) {
        let publisher = self.publisher.clone();
        let address = self.address.clone();
        let tags = self.tags.clone();
        let events = self.events.clone();
        let metrics = self.metrics.clone();
        let flush = self.flush.clone();
        metrics.copies_pending(1);
        self.tracker.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = flush.cancelled() => {}
            }
            let message_id = message::message_id(&copy);
            let error = publisher
                .publish(&address, copy)
                .await
                .err()
                .map(|e| e.to_string());
            metrics.copies_pending(-1);
            metrics.copy_published(error.is_none());
            drop(slot);
            if let Some(error) = &error {
                tracing::error!(
                    tenant = &*tags.tenant,
                    mount = &*tags.mount,
                    message_id,
                    retry_count,
                    error,
                    "delayed copy could not be published; the message is lost"
                );
            }
            let _ = events.send(Event::CopyPublished {
                tenant: tags.tenant.clone(),
                mount: tags.mount.clone(),
                message_id,
                retry_count,
                error,
            });
        });
    }

    /// How many copies are waiting.
    pub(crate) fn pending(&self) -> usize {
        self.tracker.len()
    }

    /// Publishes every waiting copy now and waits until the broker has
    /// answered for each.
    pub(crate) async fn flush(&self) {
        self.flush.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}
