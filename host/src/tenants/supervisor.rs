//! Keeping something attached: attach, run until it ends, back off, attach
//! again, until asked to stop. The AMQP calls are the caller's; this module
//! only decides when to make them, so it is tested with a paused clock.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use crate::events::LinkState as State;
use wharf_core::backoff::{Backoff, BackoffPolicy};

/// How long something must stay up before its earlier failures are
/// forgotten, so one that fails at once after every attach still backs off.
pub const STABLE_AFTER: Duration = Duration::from_secs(10);

/// Something kept attached: how to attach it, how to run it once
/// attached, and who hears about its state.
pub trait Supervised: Send {
    /// What an attach gives.
    type Up: Send;
    /// Why an attach failed or a run ended.
    type Error: std::fmt::Display + Send;

    /// One attempt to attach.
    fn attach(&mut self) -> impl Future<Output = Result<Self::Up, Self::Error>> + Send;

    /// Runs until it ends: `Some(error)` when it ended on its own, `None`
    /// when it stopped because it was asked to.
    fn run(&mut self, up: Self::Up) -> impl Future<Output = Option<Self::Error>> + Send;

    /// Hears every change of state and, with a back-off, the failure it
    /// follows.
    fn report(&mut self, state: State, failure: Option<&Self::Error>);
}

/// Attaches `thing` and runs it, again and again, backing off between
/// failures, until `stop` is cancelled. Every wait, the backoff included,
/// ends at once when `stop` is cancelled.
pub async fn supervise<S: Supervised>(
    thing: &mut S,
    policy: BackoffPolicy,
    stop: &CancellationToken,
) {
    let mut backoff = Backoff::new(policy);
    while !stop.is_cancelled() {
        thing.report(State::Attaching, None);
        let attached = tokio::select! {
            attached = thing.attach() => attached,
            () = stop.cancelled() => break,
        };
        let error = match attached {
            Ok(up) => {
                thing.report(State::Up, None);
                let since = Instant::now();
                let ended = thing.run(up).await;
                if since.elapsed() >= STABLE_AFTER {
                    backoff.reset();
                }
                match ended {
                    Some(error) => error,
                    None => break,
                }
            }
            Err(error) => error,
        };
        if stop.is_cancelled() {
            break;
        }
        let wait = backoff.next_wait();
        let state = State::BackingOff {
            error: error.to_string(),
            wait,
        };
        thing.report(state, Some(&error));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => break,
        }
    }
    thing.report(State::Stopped, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: BackoffPolicy = BackoffPolicy {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(2),
    };

    /// How the fake thing's `n`th run goes.
    enum Run {
        /// It asks the supervisor to stop.
        Stop,
        /// It fails after this long.
        FailAfter(Duration),
    }

    struct Fake {
        attach_failures: u32,
        attaches: u32,
        runs: u32,
        plan: fn(u32) -> Run,
        stop: CancellationToken,
        states: Vec<State>,
    }

    impl Fake {
        fn new(attach_failures: u32, plan: fn(u32) -> Run, stop: &CancellationToken) -> Fake {
            Fake {
                attach_failures,
                attaches: 0,
                runs: 0,
                plan,
                stop: stop.clone(),
                states: Vec::new(),
            }
        }

        fn labels(&self) -> Vec<String> {
            self.states
                .iter()
                .map(|state| match state {
                    State::Attaching => "attaching".into(),
                    State::Up => "up".into(),
                    State::BackingOff { error, .. } => format!("backing off: {error}"),
                    State::Stopped => "stopped".into(),
                })
                .collect()
        }

        fn waits(&self) -> Vec<Duration> {
            self.states
                .iter()
                .filter_map(|state| match state {
                    State::BackingOff { wait, .. } => Some(*wait),
                    _ => None,
                })
                .collect()
        }
    }

    impl Supervised for Fake {
        type Up = ();
        type Error = String;

        async fn attach(&mut self) -> Result<(), String> {
            self.attaches += 1;
            if self.attach_failures > 0 {
                self.attach_failures -= 1;
                return Err("refused".into());
            }
            Ok(())
        }

        async fn run(&mut self, (): ()) -> Option<String> {
            self.runs += 1;
            match (self.plan)(self.runs) {
                Run::Stop => {
                    self.stop.cancel();
                    None
                }
                Run::FailAfter(after) => {
                    tokio::time::sleep(after).await;
                    Some("link lost".into())
                }
            }
        }

        fn report(&mut self, state: State, failure: Option<&String>) {
            if let State::BackingOff { error, .. } = &state {
                assert_eq!(Some(error), failure);
            }
            self.states.push(state);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_attaches_back_off_then_it_comes_up_and_stops_when_asked() {
        let stop = CancellationToken::new();
        let mut fake = Fake::new(3, |_| Run::Stop, &stop);
        let started = Instant::now();
        supervise(&mut fake, POLICY, &stop).await;
        assert_eq!(
            fake.labels(),
            [
                "attaching",
                "backing off: refused",
                "attaching",
                "backing off: refused",
                "attaching",
                "backing off: refused",
                "attaching",
                "up",
                "stopped"
            ]
        );
        // Three waits of at most 100, 200 and 400 ms, at least half of each.
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(350) && elapsed <= Duration::from_millis(700),
            "{elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_during_the_backoff_ends_it_at_once() {
        let stop = CancellationToken::new();
        let hour = BackoffPolicy {
            initial: Duration::from_secs(3600),
            max: Duration::from_secs(3600),
        };
        let stopper = stop.clone();
        let waiting = tokio::spawn(async move {
            let mut fake = Fake::new(u32::MAX, |_| Run::Stop, &stop);
            supervise(&mut fake, hour, &stop).await;
            fake.labels()
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = Instant::now();
        stopper.cancel();
        let labels = waiting.await.expect("supervisor task");
        assert_eq!(before.elapsed(), Duration::ZERO);
        assert_eq!(labels, ["attaching", "backing off: refused", "stopped"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_thing_that_fails_at_once_after_every_attach_still_backs_off() {
        let stop = CancellationToken::new();
        let mut fake = Fake::new(0, |_| Run::FailAfter(Duration::ZERO), &stop);
        let minute =
            tokio::time::timeout(Duration::from_secs(60), supervise(&mut fake, POLICY, &stop));
        assert!(minute.await.is_err(), "it never stops on its own");
        // About one attach per second once the waits reach the ceiling:
        // never a hot loop.
        assert!(fake.attaches < 70, "{} attaches in a minute", fake.attaches);
    }

    #[tokio::test(start_paused = true)]
    async fn staying_up_forgets_earlier_failures() {
        let stop = CancellationToken::new();
        let mut fake = Fake::new(
            0,
            |run| match run {
                1..=4 => Run::FailAfter(Duration::ZERO),
                5 => Run::FailAfter(STABLE_AFTER),
                _ => Run::Stop,
            },
            &stop,
        );
        supervise(&mut fake, POLICY, &stop).await;
        let waits = fake.waits();
        // Four quick failures grow the wait; the long run resets it.
        assert!(waits[3] > POLICY.initial * 4, "{waits:?}");
        assert!(waits[4] <= POLICY.initial, "{waits:?}");
    }
}
