//! Text that came from a message or a module: an address, a key, an id, a
//! reason a broker or a decoder gave. Whoever publishes to a mount or writes
//! its handler chooses it, so it may be a megabyte long, hold newlines that
//! forge log lines, or terminal escapes.
//!
//! [`Untrusted`] holds such text. Its only ways out are a bounded, escaped
//! rendering (its `Display` and `Debug`, for logs, error descriptions, span
//! attributes and the console) and its exact text for the wire, after a
//! length check ([`Untrusted::wire`]). Text that is only passing through
//! (an error's words that quote input) is rendered with [`shown`] or cut
//! with [`bounded`].

use std::fmt::{self, Write as _};

/// The most bytes of one untrusted text a rendering shows; the rest is
/// counted, not shown (`…(+N bytes)`).
pub const SHOWN_BYTES: usize = 256;

/// The most bytes of a whole description built around untrusted text: a
/// disposition's error description, a decode failure's reason, an event's
/// reason.
pub const DESCRIPTION_BYTES: usize = 1024;

/// Text from a message or a module.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Untrusted(String);

/// The text is longer than the place it must go allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{len} bytes, over the limit of {max}")]
pub struct TooLong {
    /// Its length in bytes.
    pub len: usize,
    /// The limit.
    pub max: usize,
}

impl Untrusted {
    /// `text`, as it came.
    pub fn new(text: impl Into<String>) -> Untrusted {
        Untrusted(text.into())
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The exact text, for the wire, when it is at most `max` bytes long.
    pub fn wire(&self, max: usize) -> Result<&str, TooLong> {
        if self.0.len() > max {
            return Err(TooLong {
                len: self.0.len(),
                max,
            });
        }
        Ok(&self.0)
    }

    /// The text for wharf's own checks (address readings, pattern
    /// matching), which never show or send it.
    pub(crate) fn as_checked(&self) -> &str {
        &self.0
    }

    /// A rendering showing at most `max` bytes of it.
    pub fn shown_up_to(&self, max: usize) -> Shown<'_> {
        shown_up_to(&self.0, max)
    }
}

impl From<String> for Untrusted {
    fn from(text: String) -> Untrusted {
        Untrusted(text)
    }
}

impl From<&str> for Untrusted {
    fn from(text: &str) -> Untrusted {
        Untrusted(text.to_owned())
    }
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        shown(&self.0).fmt(f)
    }
}

/// As `Display`, quoted: a `{:?}` of it is as safe as a `{}`.
impl fmt::Debug for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", shown(&self.0))
    }
}

/// A bounded, escaped rendering of text that may be anyone's.
#[derive(Clone, Copy)]
pub struct Shown<'a> {
    text: &'a str,
    max: usize,
}

/// `text` rendered for a person: at most [`SHOWN_BYTES`] of it, escaped.
pub fn shown(text: &str) -> Shown<'_> {
    shown_up_to(text, SHOWN_BYTES)
}

/// `text` rendered for a person: at most `max` bytes of it, escaped (for
/// text that is the whole of a line, as a handler's log line is).
pub fn shown_up_to(text: &str, max: usize) -> Shown<'_> {
    Shown { text, max }
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut written = 0;
        for (at, c) in self.text.char_indices() {
            let mut escaped = [0u8; 12];
            let rendering = escape(c, &mut escaped);
            if written + rendering.len() > self.max {
                return write!(f, "…(+{} bytes)", self.text.len() - at);
            }
            f.write_str(rendering)?;
            written += rendering.len();
        }
        Ok(())
    }
}

impl fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// Whether `c` could change how a line reads beyond its own place: line
/// breaks and other controls (terminal escapes among them), and the
/// invisible marks that reorder or hide text.
fn hides_or_breaks(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}'
        )
}

/// `c` as a rendering shows it: itself, or escaped as Rust writes it (a
/// backslash is doubled, so no escape can be forged).
fn escape(c: char, buffer: &mut [u8; 12]) -> &str {
    match c {
        '\\' => "\\\\",
        '\n' => "\\n",
        '\r' => "\\r",
        '\t' => "\\t",
        c if hides_or_breaks(c) => {
            let mut text = String::with_capacity(10);
            let _ = write!(text, "\\u{{{:x}}}", u32::from(c));
            let len = text.len();
            buffer[..len].copy_from_slice(text.as_bytes());
            std::str::from_utf8(&buffer[..len]).expect("ASCII")
        }
        c => c.encode_utf8(buffer),
    }
}

/// `text` cut to at most `max` bytes on a character boundary, saying how
/// much was left out: for descriptions already built from renderings, so
/// their sum is bounded too.
pub fn bounded(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut cut = max.saturating_sub(24);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    let _ = write!(text, "…(+{} bytes)", total - cut);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendering_escapes_what_breaks_or_hides_a_line() {
        let text = Untrusted::new("a\nb\r\tc\\d\u{1b}[31me\u{202e}f\u{7f}");
        assert_eq!(
            text.to_string(),
            "a\\nb\\r\\tc\\\\d\\u{1b}[31me\\u{202e}f\\u{7f}"
        );
        assert_eq!(format!("{text:?}"), format!("\"{text}\""));
        assert_eq!(Untrusted::new("plain ü").to_string(), "plain ü");
    }

    #[test]
    fn a_rendering_is_bounded_and_says_what_it_left_out() {
        let long = "x".repeat(40_000);
        let shown = Untrusted::new(long.clone()).to_string();
        assert_eq!(
            shown,
            format!("{}…(+{} bytes)", "x".repeat(256), 40_000 - 256)
        );
        // Escapes count at their rendered length: the bound holds.
        let newlines = Untrusted::new("\n".repeat(1000)).to_string();
        assert!(newlines.len() <= SHOWN_BYTES + 20, "{}", newlines.len());
        assert!(!newlines.contains('\n'));
        assert_eq!(
            Untrusted::new("abcdef").shown_up_to(3).to_string(),
            "abc…(+3 bytes)"
        );
    }

    #[test]
    fn the_wire_gets_the_exact_text_within_a_limit() {
        let text = Untrusted::new("queue\n1");
        assert_eq!(text.wire(7), Ok("queue\n1"));
        assert_eq!(text.wire(6), Err(TooLong { len: 7, max: 6 }));
    }

    #[test]
    fn bounded_cuts_on_a_character_boundary() {
        let text = "é".repeat(600);
        let cut = bounded(text.clone(), 100);
        assert!(cut.len() <= 100 + 2, "{}", cut.len());
        assert!(cut.ends_with("bytes)"));
        assert_eq!(bounded("short".to_owned(), 100), "short");
    }
}
