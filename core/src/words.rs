//! AMQP conditions and outcomes in words, for messages a person reads:
//! the condition's symbol and the description the peer sent, never Rust
//! `Debug` text.

use fe2o3_amqp_types::definitions::{Error, ErrorCondition};
use fe2o3_amqp_types::messaging::Outcome;
use fe2o3_amqp_types::primitives::Value;

/// An error condition as its AMQP symbol, e.g. `amqp:not-found`.
pub fn condition(condition: &ErrorCondition) -> String {
    match serde_amqp::to_value(condition) {
        Ok(Value::Symbol(symbol)) => symbol.0,
        _ => "an unknown condition".to_owned(),
    }
}

/// An AMQP error as `condition: description`, or the condition alone.
pub fn error(error: &Error) -> String {
    let condition = condition(&error.condition);
    match error.description.as_deref().map(str::trim) {
        Some(description) if !description.is_empty() => format!("{condition}: {description}"),
        _ => condition,
    }
}

/// What a broker's outcome for a message says, e.g. `rejected it
/// (amqp:not-found: no such queue)`.
pub fn outcome(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Accepted(_) => "accepted it".to_owned(),
        Outcome::Rejected(rejected) => match &rejected.error {
            Some(e) => format!("rejected it ({})", error(e)),
            None => "rejected it".to_owned(),
        },
        Outcome::Released(_) => "released it (did not take it)".to_owned(),
        Outcome::Modified(_) => "handed it back (modified)".to_owned(),
        #[allow(unreachable_patterns, reason = "declared only with transactions")]
        _ => "answered with a transaction state".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::definitions::AmqpError;
    use fe2o3_amqp_types::messaging::{Rejected, Released};

    use super::*;

    #[test]
    fn outcomes_read_as_words() {
        let refused = Outcome::Rejected(Rejected {
            error: Some(Error::new(
                AmqpError::NotFound,
                Some("no queue 'x'".to_owned()),
                None,
            )),
        });
        assert_eq!(
            outcome(&refused),
            "rejected it (amqp:not-found: no queue 'x')"
        );
        assert_eq!(
            outcome(&Outcome::Released(Released {})),
            "released it (did not take it)"
        );
    }
}
