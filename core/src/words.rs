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

/// An error and its causes in one line, `error: cause: cause`, each cause
/// once: a cause whose text the line already holds (an error that quotes
/// its source, as many do) is not repeated.
pub fn chain<'a>(
    errors: impl IntoIterator<Item = &'a (dyn std::error::Error + 'static)>,
) -> String {
    let mut line = String::new();
    for error in errors {
        let text = error.to_string();
        let text = text.trim();
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line
}

/// An error and its sources in one line, each once (see [`chain`]).
pub fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    chain(std::iter::successors(Some(error), |e| e.source()))
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::definitions::AmqpError;
    use fe2o3_amqp_types::messaging::{Rejected, Released};

    use super::*;

    #[derive(Debug)]
    struct Failed(&'static str, Option<Box<Failed>>);

    impl std::fmt::Display for Failed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Failed {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn a_chain_names_each_cause_once() {
        let refused = Failed(
            "cannot connect to broker amqp://h:5672: login refused",
            Some(Box::new(Failed(
                "login refused",
                Some(Box::new(Failed("login refused", None))),
            ))),
        );
        let chain_of = |e: &Failed| with_causes(e);
        assert_eq!(
            chain_of(&refused),
            "cannot connect to broker amqp://h:5672: login refused"
        );
        let layered = Failed("send failed", Some(Box::new(Failed("no route", None))));
        assert_eq!(chain_of(&layered), "send failed: no route");
    }

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
