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

/// An I/O error as a person reads it: the system's words without the
/// errno's number, e.g. `No such file or directory`.
pub fn io(error: &std::io::Error) -> String {
    without_errno(&error.to_string())
}

/// `text` without the ` (os error N)` std appends to system errors.
pub fn without_errno(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(" (os error ") {
        let after = &rest[at + " (os error ".len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        out.push_str(&rest[..at]);
        if digits > 0 && after[digits..].starts_with(')') {
            rest = &after[digits + 1..];
        } else {
            out.push_str(" (os error ");
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// An error and its causes in one line, `error: cause: cause`, each cause
/// once: a cause whose text the line already holds (an error that quotes
/// its source, as many do) is not repeated. Errno numbers are left out.
pub fn chain<'a>(
    errors: impl IntoIterator<Item = &'a (dyn std::error::Error + 'static)>,
) -> String {
    let mut line = String::new();
    for error in errors {
        let text = without_errno(&error.to_string());
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
    fn errno_numbers_are_left_out() {
        assert_eq!(
            without_errno("cannot read `x`: No such file or directory (os error 2)"),
            "cannot read `x`: No such file or directory"
        );
        assert_eq!(without_errno("a (os error x)"), "a (os error x)");
        let missing = std::io::Error::from_raw_os_error(2);
        assert_eq!(io(&missing), "No such file or directory");
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
