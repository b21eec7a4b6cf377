//! A channel whose items travel boxed.
//!
//! Every session and link has an incoming channel, and every session one
//! its links write to, and a tokio channel allocates room for 32 items as
//! it is created: 8.5 KiB for frames of ~270 bytes, for a link that may
//! never see one. Boxed, the items take a pointer each in that block (one
//! allocation per frame instead).

use tokio::sync::mpsc::{
    self,
    error::{SendError, TryRecvError, TrySendError},
};

/// Creates a bounded channel of boxed `T`s.
pub(crate) fn channel<T>(buffer: usize) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = mpsc::channel(buffer);
    (Sender(tx), Receiver(rx))
}

/// The sending half of [`channel`].
#[derive(Debug)]
pub(crate) struct Sender<T>(mpsc::Sender<Box<T>>);

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Sender<T> {
    pub(crate) async fn send(&self, item: T) -> Result<(), SendError<T>> {
        self.0
            .send(Box::new(item))
            .await
            .map_err(|SendError(item)| SendError(*item))
    }

    pub(crate) fn blocking_send(&self, item: T) -> Result<(), SendError<T>> {
        self.0
            .blocking_send(Box::new(item))
            .map_err(|SendError(item)| SendError(*item))
    }

    pub(crate) fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        self.0.try_send(Box::new(item)).map_err(|e| match e {
            TrySendError::Full(item) => TrySendError::Full(*item),
            TrySendError::Closed(item) => TrySendError::Closed(*item),
        })
    }
}

/// The receiving half of [`channel`].
#[derive(Debug)]
pub(crate) struct Receiver<T>(mpsc::Receiver<Box<T>>);

impl<T> Receiver<T> {
    pub(crate) async fn recv(&mut self) -> Option<T> {
        self.0.recv().await.map(|item| *item)
    }

    pub(crate) fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.0.try_recv().map(|item| *item)
    }

    pub(crate) fn close(&mut self) {
        self.0.close();
    }
}
