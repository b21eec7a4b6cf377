//! The settlement planner fed any delivery, outcome and publish answer.
//! Invariants: a delivery is never settled as done unless what it owed was
//! accepted; a failed attempt never ends without a publish or a disposition
//! the broker keeps it by, except at the limit without a dead-letter
//! address (then `rejected`, the broker's policy decides); an ordered
//! mount's retry never leaves the host below the limit; a delivery no
//! handler sees never comes back.

#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use wharf_core::config::Settle;
use wharf_core::settlement::{
    AfterPublish, Counters, DelayPath, Disposition, Outcome, Plan, Policy, Publish, Published,
    RetryPath, Unhandled, after_publish, plan, plan_unhandled,
};

fn pick<T: Copy>(u: &mut Unstructured<'_>, of: &[T]) -> arbitrary::Result<T> {
    Ok(*u.choose(of)?)
}

fn input(u: &mut Unstructured<'_>) -> arbitrary::Result<(Policy, Counters, Outcome, Published)> {
    let policy = Policy {
        settle: pick(u, &[Settle::AtLeastOnce, Settle::AtMostOnce])?,
        max_attempts: Option::<u32>::arbitrary(u)?,
        dead_letter: bool::arbitrary(u)?,
        retry: pick(u, &[RetryPath::Modified, RetryPath::Copy])?,
        modified_supported: bool::arbitrary(u)?,
        delay: pick(u, &[DelayPath::Scheduled, DelayPath::Held])?,
        retry_after_original: pick(u, &[Disposition::Rejected, Disposition::Accepted])?,
        rejected_requeues: bool::arbitrary(u)?,
        ordered: bool::arbitrary(u)?,
    };
    let counters = Counters {
        delivery_count: Option::<u32>::arbitrary(u)?,
        retry_count: Option::<u32>::arbitrary(u)?,
        in_place: u32::arbitrary(u)?,
    };
    let outcome = match u.int_in_range(0..=3)? {
        0 => Outcome::Ack,
        1 => Outcome::Retry,
        2 => Outcome::RetryAfter(Duration::from_millis(u64::arbitrary(u)?)),
        _ => Outcome::Drop,
    };
    let reason = String::arbitrary(u)?;
    let published = match u.int_in_range(0..=4)? {
        0 => Published::Accepted,
        1 => Published::Refused { reason },
        2 => Published::NotSent { reason },
        3 => Published::Unbuildable { reason },
        _ => Published::Unknown { reason },
    };
    Ok((policy, counters, outcome, published))
}

fuzz_target!(|data: &[u8]| {
    let Ok((policy, counters, outcome, published)) = input(&mut Unstructured::new(data)) else {
        return;
    };
    let mut planned = plan(&policy, &counters, outcome);
    if outcome == Outcome::Ack && bool::arbitrary(&mut Unstructured::new(data)).unwrap_or(false) {
        planned = planned.with_outputs(&policy);
    }
    if policy.settle == Settle::AtLeastOnce
        && matches!(outcome, Outcome::Retry | Outcome::RetryAfter(_))
    {
        match planned {
            // Only at the limit, with nowhere to dead-letter to: given up
            // to the broker, or where it would put a rejected delivery
            // back, dropped by the host.
            Plan::Settle(Disposition::Rejected) => {
                assert!(!policy.dead_letter && !policy.rejected_requeues)
            }
            Plan::Settle(Disposition::Accepted) => assert!(
                !policy.dead_letter && policy.rejected_requeues,
                "a failed attempt settled as done: {planned:?}"
            ),
            Plan::PublishThenSettle { otherwise, .. } => {
                assert!(matches!(
                    otherwise,
                    Disposition::Modified | Disposition::Released
                ));
            }
            _ => {}
        }
    }
    // Below the limit an ordered mount runs a retry again in place: a copy
    // or a redelivery would let the key's later deliveries pass.
    if policy.ordered && policy.settle == Settle::AtLeastOnce {
        assert!(
            !matches!(planned.publish(), Some(Publish::Copy { .. }))
                && planned != Plan::Settle(Disposition::Modified),
            "an ordered retry left the host: {planned:?}"
        );
    }
    let next = after_publish(&policy, &counters, &planned, &published);
    if let Plan::PublishThenSettle {
        publish,
        then,
        otherwise,
    } = planned
    {
        match (&published, &next) {
            (Published::Accepted, AfterPublish::Settle(d)) => assert_eq!(*d, Some(then)),
            // A failed ack's outputs: a failed attempt, which publishes none.
            (_, AfterPublish::Instead { plan: instead, .. }) if publish == Publish::Outputs => {
                assert_eq!(*instead, plan(&policy, &counters, Outcome::Retry));
                assert_ne!(instead.publish(), Some(Publish::Outputs));
            }
            // A copy that can never be made: at the limit, which copies nothing.
            (Published::Unbuildable { .. }, AfterPublish::Instead { plan: instead, .. }) => {
                assert!(
                    matches!(publish, Publish::Copy { .. }),
                    "replaced {publish:?}"
                );
                assert_eq!(*instead, policy.at_limit());
            }
            (_, AfterPublish::Instead { .. }) => panic!("replaced on {published:?}"),
            (_, AfterPublish::Settle(d)) => assert_eq!(*d, Some(otherwise)),
        }
    }
    // A delivery no handler sees is never retried and never comes back.
    for unhandled in [Unhandled::Unreadable, Unhandled::Oversized] {
        let given_up = plan_unhandled(&policy, unhandled);
        assert!(!matches!(
            given_up.publish(),
            Some(Publish::Copy { .. } | Publish::Outputs)
        ));
        if let Plan::Settle(d) = given_up {
            assert_eq!(d == Disposition::Rejected, !policy.rejected_requeues);
        }
    }
});
