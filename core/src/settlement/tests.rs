//! The test vectors of the settlement contract, one test each, plus
//! properties that must hold for every input.

use proptest::prelude::*;

use super::*;

const ALO: Settle = Settle::AtLeastOnce;
const AMO: Settle = Settle::AtMostOnce;

fn policy(settle: Settle, max_attempts: Option<u32>, dead_letter: bool) -> Policy {
    Policy {
        settle,
        max_attempts,
        dead_letter,
        retry: RetryPath::Modified,
        modified_supported: true,
        delay: DelayPath::Scheduled,
        retry_after_original: Disposition::Rejected,
        rejected_requeues: false,
        ordered: false,
    }
}

fn header(delivery_count: u32) -> Counters {
    Counters {
        delivery_count: Some(delivery_count),
        retry_count: None,
        in_place: 0,
    }
}

fn copy(retry_count: Option<u32>) -> Counters {
    Counters {
        delivery_count: None,
        retry_count,
        in_place: 0,
    }
}

fn settles(d: Disposition) -> Plan {
    Plan::Settle(d)
}

fn publish_then(publish: Publish, then: Disposition, otherwise: Disposition) -> Plan {
    Plan::PublishThenSettle {
        publish,
        then,
        otherwise,
    }
}

fn dead_letter_then_accept() -> Plan {
    publish_then(
        Publish::DeadLetter,
        Disposition::Accepted,
        Disposition::Modified,
    )
}

fn copy_of(retry_count: u32, delay: Duration) -> Publish {
    Publish::Copy {
        retry_count,
        delay,
        path: DelayPath::Scheduled,
    }
}

fn presettled(publish: Option<Publish>, unsupported: bool) -> Plan {
    Plan::Presettled {
        publish,
        unsupported,
    }
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn attempt_numbers() {
    assert_eq!(Counters::default().attempt(), 1);
    assert_eq!(header(0).attempt(), 1);
    assert_eq!(header(7).attempt(), 8);
    assert_eq!(copy(Some(2)).attempt(), 3);
    let redelivered_copy = Counters {
        delivery_count: Some(1),
        retry_count: Some(2),
        in_place: 0,
    };
    assert_eq!(redelivered_copy.attempt(), 4);
    assert!(redelivered_copy.is_copy());
    assert!(!header(0).is_copy());
    assert!(copy(None).is_copy());
}

#[test]
fn vector_01_ack_is_accepted() {
    let p = plan(&policy(ALO, None, false), &header(0), Outcome::Ack);
    assert_eq!(p, settles(Disposition::Accepted));
}

#[test]
fn vector_02_drop_is_rejected() {
    let p = plan(&policy(ALO, None, false), &header(0), Outcome::Drop);
    assert_eq!(p, settles(Disposition::Rejected));
}

#[test]
fn vector_03_retry_without_limit_is_modified() {
    let p = plan(&policy(ALO, None, false), &header(7), Outcome::Retry);
    assert_eq!(p, settles(Disposition::Modified));
}

#[test]
fn vector_04_retry_below_limit_is_modified() {
    let p = plan(&policy(ALO, Some(3), false), &header(1), Outcome::Retry);
    assert_eq!(p, settles(Disposition::Modified));
}

#[test]
fn vector_05_retry_at_limit_without_dla_is_rejected() {
    let p = plan(&policy(ALO, Some(3), false), &header(2), Outcome::Retry);
    assert_eq!(p, settles(Disposition::Rejected));
}

#[test]
fn vector_06_retry_at_limit_with_dla_dead_letters_then_accepts() {
    let p = plan(&policy(ALO, Some(3), true), &header(2), Outcome::Retry);
    assert_eq!(p, dead_letter_then_accept());
}

#[test]
fn vector_07_dla_without_limit_takes_every_retry() {
    let p = plan(&policy(ALO, None, true), &header(0), Outcome::Retry);
    assert_eq!(p, dead_letter_then_accept());
}

#[test]
fn vector_08_retry_after_rejects_then_copies_later() {
    let delay = Duration::from_secs(2);
    let p = plan(
        &policy(ALO, None, false),
        &header(0),
        Outcome::RetryAfter(delay),
    );
    assert_eq!(
        p,
        publish_then(
            copy_of(1, delay),
            Disposition::Rejected,
            Disposition::Modified
        )
    );
}

#[test]
fn vector_08_held_where_the_broker_cannot_schedule() {
    let delay = Duration::from_secs(2);
    let held = Policy {
        delay: DelayPath::Held,
        ..policy(ALO, None, false)
    };
    let p = plan(&held, &header(0), Outcome::RetryAfter(delay));
    let copy = Publish::Copy {
        retry_count: 1,
        delay,
        path: DelayPath::Held,
    };
    assert_eq!(
        p,
        publish_then(copy, Disposition::Rejected, Disposition::Modified)
    );
}

#[test]
fn retry_after_may_accept_the_original_instead() {
    let accepting = Policy {
        retry_after_original: Disposition::Accepted,
        ..policy(ALO, None, false)
    };
    let p = plan(&accepting, &header(0), Outcome::RetryAfter(SECOND));
    assert_eq!(
        p,
        publish_then(
            copy_of(1, SECOND),
            Disposition::Accepted,
            Disposition::Modified
        )
    );
}

#[test]
fn vector_09_retry_of_a_copy_below_limit_copies_now_then_accepts() {
    let p = plan(&policy(ALO, Some(3), false), &copy(Some(1)), Outcome::Retry);
    assert_eq!(
        p,
        publish_then(
            copy_of(2, Duration::ZERO),
            Disposition::Accepted,
            Disposition::Modified
        )
    );
}

#[test]
fn vector_10_retry_after_at_limit_dead_letters_then_accepts() {
    let p = plan(
        &policy(ALO, Some(3), true),
        &copy(Some(2)),
        Outcome::RetryAfter(SECOND),
    );
    assert_eq!(p, dead_letter_then_accept());
}

#[test]
fn vector_12_at_most_once_ack_and_drop_are_unsupported() {
    for outcome in [Outcome::Ack, Outcome::Drop] {
        for counters in [header(0), copy(None), copy(Some(3))] {
            let p = plan(&policy(AMO, None, false), &counters, outcome);
            assert_eq!(p, presettled(None, true));
        }
    }
}

#[test]
fn vector_13_at_most_once_retry_with_broker_counter_is_unsupported() {
    let p = plan(&policy(AMO, Some(3), false), &header(0), Outcome::Retry);
    assert_eq!(p, presettled(None, true));
}

#[test]
fn vector_14_at_most_once_retry_without_counter_copies_at_once() {
    let p = plan(&policy(AMO, Some(3), false), &copy(None), Outcome::Retry);
    assert_eq!(p, presettled(Some(copy_of(1, Duration::ZERO)), true));
}

#[test]
fn vector_15_at_most_once_retry_after_copies_later() {
    let p = plan(
        &policy(AMO, None, false),
        &copy(None),
        Outcome::RetryAfter(SECOND),
    );
    assert_eq!(p, presettled(Some(copy_of(1, SECOND)), false));
}

#[test]
fn vector_16_at_most_once_retry_at_limit_dead_letters() {
    let p = plan(&policy(AMO, Some(2), true), &copy(Some(1)), Outcome::Retry);
    assert_eq!(p, presettled(Some(Publish::DeadLetter), true));
}

#[test]
fn vector_17_a_failed_handler_is_planned_as_retry() {
    // The sandbox turns a trap into `Outcome::Retry`; below the limit that is
    // `modified`, as vector 4.
    let p = plan(&policy(ALO, Some(3), false), &header(0), Outcome::Retry);
    assert_eq!(p, settles(Disposition::Modified));
}

#[test]
fn without_modified_retry_takes_the_copy_path() {
    let no_modified = Policy {
        retry: RetryPath::Copy,
        modified_supported: false,
        ..policy(ALO, Some(3), false)
    };
    let p = plan(&no_modified, &header(0), Outcome::Retry);
    assert_eq!(
        p,
        publish_then(
            copy_of(1, Duration::ZERO),
            Disposition::Accepted,
            Disposition::Released
        )
    );
    // At the limit it still stops, and never falls back to `modified`.
    let at_limit = plan(&no_modified, &copy(Some(2)), Outcome::Retry);
    assert_eq!(at_limit, settles(Disposition::Rejected));
}

#[test]
fn at_most_once_at_limit_without_dla_publishes_nothing() {
    let p = plan(
        &policy(AMO, Some(2), false),
        &copy(Some(1)),
        Outcome::RetryAfter(SECOND),
    );
    assert_eq!(p, presettled(None, false));
}

#[test]
fn a_broker_that_counts_nothing_gets_copies_even_with_modified() {
    let uncounted = Policy {
        retry: RetryPath::Copy,
        ..policy(ALO, Some(3), true)
    };
    // A classic queue: a header whose count never moves.
    let p = plan(&uncounted, &header(0), Outcome::Retry);
    assert_eq!(
        p,
        publish_then(
            copy_of(1, Duration::ZERO),
            Disposition::Accepted,
            Disposition::Modified
        )
    );
    // The copies carry the count to the limit.
    let last = Counters {
        delivery_count: Some(0),
        retry_count: Some(2),
        in_place: 0,
    };
    assert_eq!(
        plan(&uncounted, &last, Outcome::Retry),
        dead_letter_then_accept()
    );
}

fn any_settle() -> impl Strategy<Value = Settle> {
    prop_oneof![Just(ALO), Just(AMO)]
}

fn any_policy() -> impl Strategy<Value = Policy> {
    (
        any_settle(),
        proptest::option::of(1u32..6),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                settle,
                max_attempts,
                dead_letter,
                counted,
                modified,
                held,
                accept,
                requeues,
                ordered,
            )| {
                Policy {
                    settle,
                    max_attempts,
                    dead_letter,
                    // Without `modified` there is only the copy path.
                    retry: if counted && modified {
                        RetryPath::Modified
                    } else {
                        RetryPath::Copy
                    },
                    modified_supported: modified,
                    delay: if held {
                        DelayPath::Held
                    } else {
                        DelayPath::Scheduled
                    },
                    retry_after_original: if accept {
                        Disposition::Accepted
                    } else {
                        Disposition::Rejected
                    },
                    rejected_requeues: requeues,
                    ordered,
                }
            },
        )
}

/// Every disposition a plan may send.
fn dispositions(p: &Plan) -> Vec<Disposition> {
    match *p {
        Plan::Settle(d) => vec![d],
        Plan::PublishThenSettle {
            then, otherwise, ..
        } => vec![then, otherwise],
        Plan::Presettled { .. } | Plan::RunAgain { .. } => vec![],
    }
}

fn any_counters() -> impl Strategy<Value = Counters> {
    (
        proptest::option::of(0u32..10),
        proptest::option::of(0u32..10),
        0u32..4,
    )
        .prop_map(|(delivery_count, retry_count, in_place)| Counters {
            delivery_count,
            retry_count,
            in_place,
        })
}

fn any_outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Ack),
        Just(Outcome::Retry),
        (0u64..10_000).prop_map(|ms| Outcome::RetryAfter(Duration::from_millis(ms))),
        Just(Outcome::Drop),
    ]
}

proptest! {
    #[test]
    fn at_least_once_settles_exactly_once(
        policy in any_policy(), counters in any_counters(), outcome in any_outcome()
    ) {
        let p = plan(&Policy { settle: ALO, ..policy }, &counters, outcome);
        prop_assert!(!matches!(p, Plan::Presettled { .. }), "at least once is never presettled");
        prop_assert!(!p.unsupported());
        // The fallback of a failed publish keeps the message on the broker.
        if let Plan::PublishThenSettle { otherwise, .. } = p {
            prop_assert!(matches!(otherwise, Disposition::Modified | Disposition::Released));
        }
    }

    #[test]
    fn at_most_once_never_settles(
        policy in any_policy(), counters in any_counters(), outcome in any_outcome()
    ) {
        let p = plan(&Policy { settle: AMO, ..policy }, &counters, outcome);
        prop_assert!(matches!(p, Plan::Presettled { .. }), "at most once is always presettled");
    }

    #[test]
    fn copies_only_count_up(
        policy in any_policy(), counters in any_counters(), outcome in any_outcome()
    ) {
        if let Some(Publish::Copy { retry_count, .. }) = plan(&policy, &counters, outcome).publish() {
            prop_assert_eq!(retry_count, counters.retry_count.unwrap_or(0) + 1);
            let next = Counters { delivery_count: None, retry_count: Some(retry_count), in_place: 0 };
            prop_assert!(next.attempt() > counters.retry_count.unwrap_or(0) + 1);
        }
    }

    #[test]
    fn nothing_is_copied_at_the_limit(
        policy in any_policy(), counters in any_counters(), outcome in any_outcome()
    ) {
        let p = plan(&policy, &counters, outcome);
        if let (Some(limit), Some(Publish::Copy { .. })) = (policy.max_attempts, p.publish()) {
            prop_assert!(counters.attempt() < limit);
        }
    }

    #[test]
    fn released_and_modified_follow_broker_support(
        policy in any_policy(), counters in any_counters(), outcome in any_outcome()
    ) {
        let sent = dispositions(&plan(&policy, &counters, outcome));
        if !policy.modified_supported {
            prop_assert!(!sent.contains(&Disposition::Modified));
        } else {
            prop_assert!(!sent.contains(&Disposition::Released));
        }
    }

    #[test]
    fn ack_never_publishes_and_drop_only_a_dead_letter_the_broker_would_put_back(
        policy in any_policy(), counters in any_counters()
    ) {
        prop_assert_eq!(plan(&policy, &counters, Outcome::Ack).publish(), None);
        let host_dead_letters =
            policy.settle == ALO && policy.rejected_requeues && policy.dead_letter;
        prop_assert_eq!(
            plan(&policy, &counters, Outcome::Drop).publish(),
            host_dead_letters.then_some(Publish::DeadLetter)
        );
    }

    #[test]
    fn a_broker_that_puts_rejected_back_is_never_sent_it(
        policy in any_policy(), counters in any_counters(), outcome in any_outcome()
    ) {
        let policy = Policy {
            rejected_requeues: true,
            retry_after_original: Disposition::Accepted,
            ..policy
        };
        let sent = dispositions(&plan(&policy, &counters, outcome));
        prop_assert!(!sent.contains(&Disposition::Rejected), "{:?}", sent);
    }
}

#[test]
fn where_the_broker_puts_rejected_back_the_host_gives_up_a_delivery_itself() {
    let requeues = |max_attempts, dead_letter| Policy {
        rejected_requeues: true,
        ordered: false,
        ..policy(ALO, max_attempts, dead_letter)
    };
    assert_eq!(
        plan(&requeues(None, true), &header(0), Outcome::Drop),
        dead_letter_then_accept()
    );
    assert_eq!(
        plan(&requeues(None, false), &header(0), Outcome::Drop),
        settles(Disposition::Accepted)
    );
    assert_eq!(
        plan(&requeues(Some(2), false), &header(1), Outcome::Retry),
        settles(Disposition::Accepted)
    );
}

#[test]
fn an_ack_with_outputs_publishes_them_before_it_accepts() {
    let plan = plan(&policy(ALO, Some(3), true), &header(0), Outcome::Ack);
    assert_eq!(
        plan.with_outputs(&policy(ALO, Some(3), true)),
        publish_then(
            Publish::Outputs,
            Disposition::Accepted,
            Disposition::Modified
        )
    );
    // Where the broker cannot take `modified`, a failed publish releases.
    let mut released = policy(ALO, None, false);
    released.modified_supported = false;
    assert_eq!(
        settles(Disposition::Accepted).with_outputs(&released),
        publish_then(
            Publish::Outputs,
            Disposition::Accepted,
            Disposition::Released
        )
    );
}

#[test]
fn at_most_once_outputs_are_published_after_the_fact() {
    let amo = policy(AMO, None, false);
    // The ack itself still cannot act on a settled delivery.
    let plan = plan(&amo, &header(0), Outcome::Ack);
    assert_eq!(plan, presettled(None, true));
    assert_eq!(
        plan.with_outputs(&amo),
        presettled(Some(Publish::Outputs), true)
    );
}

/// What follows a plan's publish: every plan kind against every answer.
mod after_publish_vectors {
    use super::*;

    /// A mount with three attempts and no dead-letter address, and a
    /// delivery on its first.
    const MOUNT: Policy = Policy {
        settle: ALO,
        max_attempts: Some(3),
        dead_letter: false,
        retry: RetryPath::Modified,
        modified_supported: true,
        delay: DelayPath::Scheduled,
        retry_after_original: Disposition::Rejected,
        rejected_requeues: false,
        ordered: false,
    };
    const FIRST: Counters = Counters {
        delivery_count: Some(0),
        retry_count: None,
        in_place: 0,
    };

    fn after(plan: &Plan, published: &Published) -> AfterPublish {
        after_publish(&MOUNT, &FIRST, plan, published)
    }

    fn refused() -> Published {
        Published::Refused {
            reason: "amqp:not-found".to_owned(),
        }
    }

    fn not_sent() -> Published {
        Published::NotSent {
            reason: "no credit".to_owned(),
        }
    }

    fn unknown() -> Published {
        Published::Unknown {
            reason: "no answer".to_owned(),
        }
    }

    fn unbuildable() -> Published {
        Published::Unbuildable {
            reason: "cannot encode it".to_owned(),
        }
    }

    fn outputs_then_accept(keep: Disposition) -> Plan {
        publish_then(Publish::Outputs, Disposition::Accepted, keep)
    }

    /// The delivery planned again as a failed attempt.
    fn retry(reason: &str) -> AfterPublish {
        AfterPublish::Instead {
            plan: plan(&MOUNT, &FIRST, Outcome::Retry),
            reason: reason.to_owned(),
        }
    }

    fn settle(d: Disposition) -> AfterPublish {
        AfterPublish::Settle(Some(d))
    }

    #[test]
    fn accepted_outputs_accept_the_delivery() {
        let plan = outputs_then_accept(Disposition::Modified);
        assert_eq!(
            after(&plan, &Published::Accepted),
            settle(Disposition::Accepted)
        );
    }

    #[test]
    fn refused_or_unsent_outputs_are_a_failed_attempt() {
        let plan = outputs_then_accept(Disposition::Modified);
        assert_eq!(after(&plan, &refused()), retry("amqp:not-found"));
        assert_eq!(after(&plan, &not_sent()), retry("no credit"));
        assert_eq!(
            retry("x"),
            AfterPublish::Instead {
                plan: settles(Disposition::Modified),
                reason: "x".to_owned()
            }
        );
    }

    #[test]
    fn outputs_of_unknown_fate_are_handed_back_to_the_broker() {
        for keep in [Disposition::Modified, Disposition::Released] {
            let plan = outputs_then_accept(keep);
            assert_eq!(after(&plan, &unknown()), settle(keep));
        }
    }

    #[test]
    fn a_copy_or_dead_letter_not_accepted_keeps_the_delivery() {
        for publish in [Publish::DeadLetter, copy_of(1, Duration::ZERO)] {
            let plan = publish_then(publish, Disposition::Accepted, Disposition::Modified);
            assert_eq!(
                after(&plan, &Published::Accepted),
                settle(Disposition::Accepted)
            );
            for failed in [refused(), not_sent(), unknown()] {
                assert_eq!(
                    after(&plan, &failed),
                    settle(Disposition::Modified),
                    "{publish:?} {failed:?}"
                );
            }
        }
    }

    #[test]
    fn a_copy_that_cannot_be_made_gives_the_delivery_up() {
        let plan = publish_then(
            copy_of(1, Duration::ZERO),
            Disposition::Accepted,
            Disposition::Modified,
        );
        assert_eq!(
            after(&plan, &unbuildable()),
            AfterPublish::Instead {
                plan: settles(Disposition::Rejected),
                reason: "cannot encode it".to_owned()
            }
        );
        // Outputs that cannot be made are a failed attempt; a dead letter
        // (the delivery as it arrived) that cannot be made is kept.
        let outputs = outputs_then_accept(Disposition::Modified);
        assert_eq!(after(&outputs, &unbuildable()), retry("cannot encode it"));
        let dead = publish_then(
            Publish::DeadLetter,
            Disposition::Accepted,
            Disposition::Modified,
        );
        assert_eq!(after(&dead, &unbuildable()), settle(Disposition::Modified));
    }

    #[test]
    fn a_delivery_given_up_goes_to_its_dead_letter_address_or_the_brokers_policy() {
        assert_eq!(
            policy(ALO, None, true).at_limit(),
            publish_then(
                Publish::DeadLetter,
                Disposition::Accepted,
                Disposition::Modified
            )
        );
        assert_eq!(
            policy(ALO, None, false).at_limit(),
            Plan::Settle(Disposition::Rejected)
        );
    }

    #[test]
    fn a_retry_after_original_is_settled_as_the_mount_says_once_its_copy_is_in() {
        let plan = publish_then(
            copy_of(1, Duration::from_secs(2)),
            Disposition::Rejected,
            Disposition::Released,
        );
        assert_eq!(
            after(&plan, &Published::Accepted),
            settle(Disposition::Rejected)
        );
        assert_eq!(after(&plan, &unknown()), settle(Disposition::Released));
    }

    #[test]
    fn at_most_once_nothing_is_left_to_settle() {
        let plan = Plan::Presettled {
            publish: Some(Publish::Outputs),
            unsupported: false,
        };
        for answer in [Published::Accepted, refused(), not_sent(), unknown()] {
            assert_eq!(after(&plan, &answer), AfterPublish::Settle(None));
        }
    }

    proptest! {
        /// Whatever is answered, a delivery that must not be lost is never
        /// settled as done unless its publish was accepted; a plan is
        /// replaced only for an ack's outputs (by a failed attempt, which
        /// publishes none) or a copy that cannot be made (by the plan at the
        /// limit, which publishes no copy), so replacements end.
        #[test]
        fn nothing_owed_is_lost(
            policy in any_policy(),
            counters in any_counters(),
            then in prop_oneof![Just(Disposition::Accepted), Just(Disposition::Rejected)],
            keep in prop_oneof![Just(Disposition::Modified), Just(Disposition::Released)],
            publish in prop_oneof![
                Just(Publish::DeadLetter),
                Just(Publish::Outputs),
                (1u32..5, 0u64..5000).prop_map(|(n, ms)| Publish::Copy {
                    retry_count: n,
                    delay: Duration::from_millis(ms),
                    path: DelayPath::Scheduled,
                }),
            ],
            answer in 0usize..5,
        ) {
            let policy = Policy { settle: ALO, ..policy };
            let plan = publish_then(publish, then, keep);
            let answer = [Published::Accepted, refused(), not_sent(), unknown(), unbuildable()][answer].clone();
            match (&answer, after_publish(&policy, &counters, &plan, &answer)) {
                (Published::Accepted, AfterPublish::Settle(d)) => prop_assert_eq!(d, Some(then)),
                (_, AfterPublish::Instead { plan: instead, .. }) if publish == Publish::Outputs => {
                    prop_assert_eq!(instead, super::plan(&policy, &counters, Outcome::Retry));
                    prop_assert_ne!(instead.publish(), Some(Publish::Outputs));
                }
                (Published::Unbuildable { .. }, AfterPublish::Instead { plan: instead, .. }) => {
                    prop_assert!(matches!(publish, Publish::Copy { .. }), "replaced {:?}", publish);
                    prop_assert_eq!(instead, policy.at_limit());
                    let copies = matches!(instead.publish(), Some(Publish::Copy { .. }));
                    prop_assert!(!copies, "{:?}", instead);
                }
                (_, AfterPublish::Instead { .. }) => prop_assert!(false, "replaced on {:?}", answer),
                (_, AfterPublish::Settle(d)) => prop_assert_eq!(d, Some(keep)),
            }
        }
    }
}

/// Deliveries no handler sees, on every kind of mount.
mod unhandled_vectors {
    use super::*;

    #[test]
    fn an_unreadable_delivery_is_at_its_limit_at_once() {
        assert_eq!(
            plan_unhandled(&policy(ALO, Some(5), true), Unhandled::Unreadable),
            dead_letter_then_accept()
        );
        assert_eq!(
            plan_unhandled(&policy(ALO, None, false), Unhandled::Unreadable),
            settles(Disposition::Rejected)
        );
        let requeues = Policy {
            rejected_requeues: true,
            ordered: false,
            ..policy(ALO, None, false)
        };
        assert_eq!(
            plan_unhandled(&requeues, Unhandled::Unreadable),
            settles(Disposition::Accepted)
        );
    }

    #[test]
    fn an_oversized_delivery_is_given_up_to_the_broker_never_dead_lettered() {
        for dead_letter in [false, true] {
            let mount = policy(ALO, Some(3), dead_letter);
            assert_eq!(
                plan_unhandled(&mount, Unhandled::Oversized),
                settles(Disposition::Rejected)
            );
            let requeues = Policy {
                rejected_requeues: true,
                ordered: false,
                ..mount
            };
            assert_eq!(
                plan_unhandled(&requeues, Unhandled::Oversized),
                settles(Disposition::Accepted)
            );
        }
    }

    #[test]
    fn at_most_once_only_the_dead_letter_of_an_unreadable_one_acts() {
        assert_eq!(
            plan_unhandled(&policy(AMO, None, true), Unhandled::Unreadable),
            presettled(Some(Publish::DeadLetter), false)
        );
        for (dead_letter, unhandled) in [
            (false, Unhandled::Unreadable),
            (true, Unhandled::Oversized),
            (false, Unhandled::Oversized),
        ] {
            assert_eq!(
                plan_unhandled(&policy(AMO, None, dead_letter), unhandled),
                presettled(None, false)
            );
        }
    }

    proptest! {
        /// A delivery no handler sees is never retried, never copied, never
        /// handed back to come again, and is sent `rejected` only where
        /// the broker does not put it back.
        #[test]
        fn unhandled_deliveries_end(
            policy in any_policy(),
            oversized in any::<bool>(),
        ) {
            let unhandled = if oversized { Unhandled::Oversized } else { Unhandled::Unreadable };
            let p = plan_unhandled(&policy, unhandled);
            let again = matches!(p.publish(), Some(Publish::Copy { .. } | Publish::Outputs));
            prop_assert!(!again, "{:?}", p);
            if oversized {
                prop_assert_eq!(p.publish(), None);
            }
            match p {
                Plan::Settle(d) => {
                    prop_assert!(matches!(d, Disposition::Accepted | Disposition::Rejected));
                    prop_assert_eq!(d == Disposition::Rejected, !policy.rejected_requeues);
                }
                Plan::PublishThenSettle { then, .. } => prop_assert_eq!(then, Disposition::Accepted),
                Plan::Presettled { unsupported, .. } => prop_assert!(!unsupported),
                Plan::RunAgain { .. } => prop_assert!(false, "an unread delivery is never run"),
            }
        }
    }
}

// The ordering vectors (README, "Ordered mounts"): what each outcome does
// to a delivery whose key is held. O8 and O9 are the sequencer's
// (`crate::ordering`), O10–O12 are end to end only.

fn ordered(max_attempts: Option<u32>, dead_letter: bool) -> Policy {
    Policy {
        ordered: true,
        ..policy(ALO, max_attempts, dead_letter)
    }
}

#[test]
fn vector_o1_ordered_retry_below_limit_runs_again_in_place() {
    let p = plan(&ordered(Some(3), true), &header(0), Outcome::Retry);
    assert_eq!(
        p,
        Plan::RunAgain {
            delay: Duration::ZERO
        }
    );
    assert_eq!(p.publish(), None, "no copy to let later ones pass");
}

#[test]
fn vector_o2_ordered_retry_after_holds_the_key_for_the_delay() {
    for (attempts, delivery) in [(Some(3), header(0)), (None, copy(Some(4)))] {
        let p = plan(
            &ordered(attempts, false),
            &delivery,
            Outcome::RetryAfter(SECOND),
        );
        assert_eq!(p, Plan::RunAgain { delay: SECOND });
    }
}

#[test]
fn vector_o3_in_place_attempts_count_toward_the_limit() {
    let third = Counters {
        in_place: 2,
        ..header(0)
    };
    assert_eq!(third.attempt(), 3);
    let p = plan(&ordered(Some(3), true), &third, Outcome::Retry);
    assert_eq!(
        p,
        dead_letter_then_accept(),
        "at the limit: dead letter, key released"
    );
    let p = plan(
        &ordered(Some(3), false),
        &third,
        Outcome::RetryAfter(SECOND),
    );
    assert_eq!(p, settles(Disposition::Rejected));
}

#[test]
fn vector_o4_ordered_dead_letter_address_without_limit_takes_the_first_retry() {
    let p = plan(&ordered(None, true), &header(0), Outcome::Retry);
    assert_eq!(p, dead_letter_then_accept());
}

#[test]
fn vector_o5_ordered_ack_and_drop_settle_as_unordered() {
    for outcome in [Outcome::Ack, Outcome::Drop] {
        assert_eq!(
            plan(&ordered(Some(3), true), &header(0), outcome),
            plan(&policy(ALO, Some(3), true), &header(0), outcome)
        );
    }
}

#[test]
fn vector_o6_ordered_outputs_not_delivered_run_again_in_place() {
    let policy = ordered(Some(3), false);
    let acked = plan(&policy, &header(0), Outcome::Ack).with_outputs(&policy);
    let refused = Published::Refused {
        reason: "no".into(),
    };
    let after = after_publish(&policy, &header(0), &acked, &refused);
    assert_eq!(
        after,
        AfterPublish::Instead {
            plan: Plan::RunAgain {
                delay: Duration::ZERO
            },
            reason: "no".into()
        }
    );
}

#[test]
fn vector_o7_a_failed_handler_on_an_ordered_mount_runs_again_in_place() {
    // A trap, a time-out or garbage is planned as `retry` (vector 17).
    let p = plan(&ordered(Some(2), false), &header(0), Outcome::Retry);
    assert_eq!(
        p,
        Plan::RunAgain {
            delay: Duration::ZERO
        }
    );
}

proptest! {
    /// Below the limit an ordered mount neither copies nor hands back: both
    /// would let the key's later deliveries pass.
    #[test]
    fn ordered_retries_never_leave_the_host(
        policy in any_policy(), counters in any_counters(), outcome in any_outcome()
    ) {
        let policy = Policy { settle: ALO, ordered: true, ..policy };
        let p = plan(&policy, &counters, outcome);
        prop_assert!(!matches!(p.publish(), Some(Publish::Copy { .. })), "{:?}", p);
        prop_assert!(!dispositions(&p).contains(&Disposition::Modified) || matches!(p, Plan::PublishThenSettle { .. }), "{:?}", p);
    }
}
