//! The settlement contract ([`wharf_core::settlement`]), and the rules for
//! turning what a handler call produced (or why it produced nothing) into
//! the [`Outcome`] a plan is made from.

use std::time::Duration;

pub use wharf_core::settlement::*;

use crate::sandbox::{self, Failure};

/// What one handler call produced: the outcome it returned, or why it
/// returned none.
pub type HandlerResult = Result<sandbox::Outcome, Failure>;

/// The outcome a plan is made from. A handler that failed (trapped, ran out
/// of time or memory, returned garbage) is retried, so the attempt counter
/// moves and a poison message reaches its limit. A `retry-after` delay is cut
/// to the mount's `max_retry_delay`.
pub fn outcome_of(result: &HandlerResult, max_retry_delay: Duration) -> Outcome {
    match result {
        Ok(sandbox::Outcome::Ack) => Outcome::Ack,
        Ok(sandbox::Outcome::Retry) | Err(_) => Outcome::Retry,
        Ok(sandbox::Outcome::Drop) => Outcome::Drop,
        Ok(sandbox::Outcome::RetryAfter(ms)) => {
            Outcome::RetryAfter(Duration::from_millis(*ms).min(max_retry_delay))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_failed_handler_is_a_retry() {
        let failed = Err(Failure::Trap("unreachable".into()));
        assert_eq!(outcome_of(&failed, HOUR), Outcome::Retry);
    }

    #[test]
    fn delays_are_cut_to_the_ceiling() {
        let asked = Ok(sandbox::Outcome::RetryAfter(2 * 3600 * 1000));
        assert_eq!(outcome_of(&asked, HOUR), Outcome::RetryAfter(HOUR));
        let short = Ok(sandbox::Outcome::RetryAfter(250));
        assert_eq!(
            outcome_of(&short, HOUR),
            Outcome::RetryAfter(Duration::from_millis(250))
        );
    }
}
