//! Turns on an ordered mount's keys: the receive loop asks for a delivery's
//! turn as it arrives, so turns follow the broker's order; the delivery
//! runs once its turn comes and gives it back when it is settled, or
//! whenever it ends.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use crate::sync::Locked;
use wharf_core::message::AmqpMessage;
use wharf_core::ordering::{Key, OrderBy, Sequencer, key_of};

/// The keys of one ordered mount while its links are up.
pub(super) struct Turns {
    order_by: OrderBy,
    sequencer: Mutex<Sequencer<oneshot::Sender<()>>>,
    /// Told when a key is forgotten, for a receive loop waiting for room.
    freed: Notify,
    max_keys: usize,
}

/// What the metrics show of an ordered mount's keys.
pub(crate) struct KeysNow {
    /// Keys with a delivery running or waiting.
    pub(crate) keys: usize,
    /// Deliveries waiting behind their key's running one.
    pub(crate) waiting: usize,
    /// How long the delivery waiting longest has waited.
    pub(crate) oldest: Duration,
}

impl Turns {
    pub(super) fn new(order_by: OrderBy, max_keys: u32) -> Arc<Turns> {
        Arc::new(Turns {
            order_by,
            sequencer: Mutex::new(Sequencer::default()),
            freed: Notify::new(),
            max_keys: max_keys as usize,
        })
    }

    /// `message` arrived: its turn, now or behind its key's earlier ones;
    /// none for a message without a key. Called by the receive loop alone,
    /// in arrival order.
    pub(super) fn arrive(self: &Arc<Self>, message: &AmqpMessage) -> Option<WaitTurn> {
        Some(self.turn(key_of(&self.order_by, message)?))
    }

    fn turn(self: &Arc<Self>, key: Key) -> WaitTurn {
        let (sender, receiver) = oneshot::channel();
        let now = self
            .sequencer
            .locked()
            .arrive(key, sender, Instant::now())
            .is_some();
        WaitTurn {
            turns: self.clone(),
            key,
            state: if now {
                Waiting::Now
            } else {
                Waiting::Behind(receiver)
            },
        }
    }

    /// As many keys as the mount may hold: take no delivery until one is
    /// forgotten.
    pub(super) fn full(&self) -> bool {
        self.sequencer.locked().keys() >= self.max_keys
    }

    /// Until a key is forgotten (at once if one was since the last call).
    pub(super) async fn freed(&self) {
        self.freed.notified().await;
    }

    pub(super) fn now(&self) -> KeysNow {
        let sequencer = self.sequencer.locked();
        KeysNow {
            keys: sequencer.keys(),
            waiting: sequencer.waiting(),
            oldest: sequencer
                .oldest_waiting()
                .map_or(Duration::ZERO, |since| since.elapsed()),
        }
    }

    /// The running delivery of `key` is done: the next one still waiting
    /// runs (one whose task is gone is skipped), or the key is forgotten.
    fn give_back(&self, sequencer: &mut Sequencer<oneshot::Sender<()>>, key: &Key) {
        loop {
            match sequencer.done(key) {
                Some(next) => {
                    if next.send(()).is_ok() {
                        return;
                    }
                }
                None => {
                    self.freed.notify_one();
                    return;
                }
            }
        }
    }
}

/// A delivery's place in its key's line.
pub(super) struct WaitTurn {
    turns: Arc<Turns>,
    key: Key,
    state: Waiting,
}

enum Waiting {
    /// Its key had nothing running: the turn is its already.
    Now,
    /// Woken when the delivery before it is done.
    Behind(oneshot::Receiver<()>),
    /// The turn was taken ([`WaitTurn::wait`]).
    Taken,
}

impl WaitTurn {
    /// Until the delivery's turn comes: held until the [`Turn`] is dropped.
    pub(super) async fn wait(mut self) -> Turn {
        if let Waiting::Behind(receiver) = &mut self.state {
            // The sender is only dropped with the sequencer, which lives
            // as long as `self.turns`.
            let _ = receiver.await;
        }
        self.state = Waiting::Taken;
        Turn {
            turns: self.turns.clone(),
            key: self.key,
        }
    }
}

impl Drop for WaitTurn {
    /// A delivery that ends before its turn is taken (the mount stops)
    /// must not keep its key: a turn already given to it is given on.
    fn drop(&mut self) {
        let mut sequencer = self.turns.sequencer.locked();
        let granted = match &mut self.state {
            Waiting::Now => true,
            // Under the lock: a turn cannot be given between the look and
            // the drop of the receiver.
            Waiting::Behind(receiver) => receiver.try_recv().is_ok(),
            Waiting::Taken => false,
        };
        self.state = Waiting::Taken;
        if granted {
            self.turns.give_back(&mut sequencer, &self.key);
        }
    }
}

/// A key's turn: the delivery holding it runs; the next one of its key
/// runs once it is dropped.
pub(super) struct Turn {
    turns: Arc<Turns>,
    key: Key,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut sequencer = self.turns.sequencer.locked();
        self.turns.give_back(&mut sequencer, &self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_waits_for_the_one_before_it_and_a_dropped_waiter_passes_its_turn_on() {
        let turns = Turns::new(OrderBy::GroupId, 2);
        let first = turns.turn([1; 16]).wait().await;
        let gone = turns.turn([1; 16]);
        let third = turns.turn([1; 16]);
        let other = turns.turn([2; 16]).wait().await;
        assert!(turns.full());
        assert_eq!(turns.now().waiting, 2);
        drop(gone);
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), third.wait())
            .await
            .expect("the turn passed over the dropped waiter");
        drop((third, other));
        turns.freed().await;
        assert_eq!((turns.now().keys, turns.now().waiting), (0, 0));
        assert!(!turns.full());
    }
}
