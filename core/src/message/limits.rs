//! What an encoded message may hold before any of it is decoded.
//!
//! Decoding an AMQP value, rendering it as JSON and dropping it all recurse
//! once per level of nesting, so a publisher who nests a list 100,000 deep
//! would overflow the stack of whatever task touched it: an abort no task
//! boundary catches. And a 1 MiB message of empty lists decodes to a million
//! of values. So every payload is first walked here, without recursion, and
//! refused when its values nest deeper than [`ValueLimits::max_depth`] or
//! number more than [`ValueLimits::max_items`]. What passes can be decoded,
//! rendered and dropped within a fixed stack and a bounded multiple of its
//! size.

use std::ops::Range;

/// How deep and how many values one message may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueLimits {
    /// Levels of nesting: every list, map, array and described value opens
    /// one. A message's sections are described values, so an `amqp-value`
    /// body that is a list of lists of numbers nests three deep.
    pub max_depth: u32,
    /// Values in the whole message, containers and their elements alike
    /// (a binary or string counts once, whatever its length).
    pub max_items: u64,
}

impl ValueLimits {
    /// The limits of every mount: deep enough for any JSON-like document
    /// (serde_json stops at 128 levels; 64 here leaves room for the
    /// sections' own), many enough for a large array of numbers, and small
    /// enough that a decoded message stays within about 40 bytes per value.
    pub const DEFAULT: ValueLimits = ValueLimits {
        max_depth: 64,
        max_items: 1 << 18,
    };
}

impl Default for ValueLimits {
    fn default() -> ValueLimits {
        ValueLimits::DEFAULT
    }
}

/// Why a payload is not decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    /// Values nest deeper than the limit.
    #[error("its values nest more than {max} levels deep (the limit)")]
    TooDeep {
        /// The limit.
        max: u32,
    },
    /// More values than the limit.
    #[error("it holds more than {max} values (the limit)")]
    TooMany {
        /// The limit.
        max: u64,
    },
    /// Not a sequence of well-formed AMQP values.
    #[error("byte {at}: {what}")]
    Malformed {
        /// Where, from the start of the payload.
        at: usize,
        /// What is wrong there.
        what: &'static str,
    },
}

/// How the values of one encoding are laid out after its constructor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// A described value: a descriptor, then the value.
    Described,
    /// A fixed number of bytes.
    Fixed(usize),
    /// A length of this many bytes, then that many bytes.
    Variable(usize),
    /// A list (`false`) or map (`true`): size and count of this width,
    /// then `count` values each with its constructor.
    Compound(usize, bool),
    /// An array: size and count of this width, one constructor, then
    /// `count` values without one.
    Array(usize),
}

fn layout(code: u8) -> Option<Layout> {
    Some(match code {
        0x00 => Layout::Described,
        0x40..=0x45 => Layout::Fixed(0),
        0x50..=0x56 => Layout::Fixed(1),
        0x60 | 0x61 => Layout::Fixed(2),
        0x70..=0x74 => Layout::Fixed(4),
        0x80..=0x84 => Layout::Fixed(8),
        0x94 | 0x98 => Layout::Fixed(16),
        0xa0 | 0xa1 | 0xa3 => Layout::Variable(1),
        0xb0 | 0xb1 | 0xb3 => Layout::Variable(4),
        0xc0 => Layout::Compound(1, false),
        0xc1 => Layout::Compound(1, true),
        0xd0 => Layout::Compound(4, false),
        0xd1 => Layout::Compound(4, true),
        0xe0 => Layout::Array(1),
        0xf0 => Layout::Array(4),
        _ => return None,
    })
}

/// A container being read.
struct Open {
    /// Values still to read in it.
    remaining: u64,
    /// Where it must end (lists, maps, arrays), from their size.
    end: Option<usize>,
    /// The layout of an array's elements, which carry no constructor.
    elements: Option<Layout>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn malformed(&self, what: &'static str) -> Unreadable {
        Unreadable::Malformed { at: self.at, what }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], Unreadable> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.malformed("the payload ends inside a value"))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn number(&mut self, width: usize) -> Result<u64, Unreadable> {
        Ok(self
            .take(width)?
            .iter()
            .fold(0u64, |n, byte| (n << 8) | u64::from(*byte)))
    }

    fn constructor(&mut self) -> Result<Layout, Unreadable> {
        let code = self.take(1)?[0];
        layout(code).ok_or_else(|| Unreadable::Malformed {
            at: self.at - 1,
            what: "an unknown type code",
        })
    }

    /// An array's element constructor: a primitive one, or a described one
    /// whose descriptor is a primitive value.
    fn element_constructor(&mut self) -> Result<Layout, Unreadable> {
        match self.constructor()? {
            Layout::Described => {
                match self.constructor()? {
                    Layout::Fixed(width) => {
                        self.take(width)?;
                    }
                    Layout::Variable(width) => {
                        let len = self.length(width)?;
                        self.take(len)?;
                    }
                    _ => return Err(self.malformed("an array's descriptor is not a primitive")),
                }
                match self.constructor()? {
                    Layout::Described => Err(self.malformed("an array of described descriptors")),
                    layout => Ok(layout),
                }
            }
            layout => Ok(layout),
        }
    }

    /// Skips a value of `layout` whose constructor was read, by the sizes
    /// its encoding gives, reading nothing inside it.
    fn skip(&mut self, layout: Layout) -> Option<()> {
        match layout {
            Layout::Fixed(width) => {
                self.take(width).ok()?;
            }
            Layout::Variable(width) | Layout::Compound(width, _) | Layout::Array(width) => {
                let len = self.length(width).ok()?;
                self.take(len).ok()?;
            }
            Layout::Described => return None,
        }
        Some(())
    }

    /// Skips a descriptor: a primitive value (a descriptor is never itself
    /// described).
    fn skip_descriptor(&mut self) -> Option<()> {
        let layout = self.constructor().ok()?;
        self.skip(layout)
    }

    fn length(&mut self, width: usize) -> Result<usize, Unreadable> {
        let n = self.number(width)?;
        usize::try_from(n).map_err(|_| self.malformed("a length beyond this machine"))
    }
}

/// Checks `payload` against `limits` without decoding it, and returns where
/// each top-level value (each message section) lies.
pub fn check(payload: &[u8], limits: ValueLimits) -> Result<Vec<Range<usize>>, Unreadable> {
    measure(payload, limits).map(|measured| measured.sections)
}

/// What walking a payload found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measured {
    /// Where each top-level value (each message section) lies.
    pub sections: Vec<Range<usize>>,
    /// About how many bytes of memory the payload takes once decoded: each
    /// value at the size of a decoded AMQP value with its place in a
    /// container, plus the bytes of its text or binary. A payload of small
    /// values takes many times its own size.
    pub decoded_bytes: u64,
}

/// What one decoded value takes beside its text or bytes: the value
/// itself and its place in a list or map.
pub const DECODED_VALUE_BYTES: u64 =
    std::mem::size_of::<fe2o3_amqp_types::primitives::Value>() as u64 + 16;

/// Checks `payload` against `limits` as [`check`] does, and says about how
/// much memory it takes decoded.
pub fn measure(payload: &[u8], limits: ValueLimits) -> Result<Measured, Unreadable> {
    let mut variable_bytes: u64 = 0;
    let mut reader = Reader {
        bytes: payload,
        at: 0,
    };
    let mut open: Vec<Open> = Vec::new();
    let mut items: u64 = 0;
    let mut sections = Vec::new();
    let mut section_start = 0;
    let count = |items: &mut u64, n: u64| {
        *items = items.saturating_add(n);
        if *items > limits.max_items {
            Err(Unreadable::TooMany {
                max: limits.max_items,
            })
        } else {
            Ok(())
        }
    };
    loop {
        let layout = match open.last_mut() {
            Some(container) if container.remaining == 0 => {
                if container.end.is_some_and(|end| end != reader.at) {
                    return Err(reader.malformed("a container's size does not match its values"));
                }
                open.pop();
                if open.is_empty() {
                    sections.push(section_start..reader.at);
                }
                continue;
            }
            Some(container) => {
                container.remaining -= 1;
                match container.elements {
                    Some(layout) => layout,
                    None => reader.constructor()?,
                }
            }
            None if reader.at == payload.len() => {
                return Ok(Measured {
                    sections,
                    decoded_bytes: items
                        .saturating_mul(DECODED_VALUE_BYTES)
                        .saturating_add(variable_bytes),
                });
            }
            None => {
                section_start = reader.at;
                count(&mut items, 1)?;
                reader.constructor()?
            }
        };
        let opened = match layout {
            Layout::Fixed(width) => {
                reader.take(width)?;
                None
            }
            Layout::Variable(width) => {
                let len = reader.length(width)?;
                reader.take(len)?;
                variable_bytes += len as u64;
                None
            }
            Layout::Described => {
                count(&mut items, 2)?;
                Some(Open {
                    remaining: 2,
                    end: None,
                    elements: None,
                })
            }
            Layout::Compound(width, map) => {
                let size = reader.length(width)?;
                let end = reader.at.saturating_add(size);
                let values = reader.number(width)?;
                if end > payload.len() || values > size as u64 {
                    return Err(reader.malformed("a list or map larger than the payload"));
                }
                // Decoders take a map's entries two values at a time.
                if map && values % 2 == 1 {
                    return Err(reader.malformed("a map with an odd count of values"));
                }
                count(&mut items, values)?;
                Some(Open {
                    remaining: values,
                    end: Some(end),
                    elements: None,
                })
            }
            Layout::Array(width) => {
                let size = reader.length(width)?;
                let end = reader.at.saturating_add(size);
                let values = reader.number(width)?;
                if end > payload.len() {
                    return Err(reader.malformed("an array larger than the payload"));
                }
                count(&mut items, values)?;
                // An empty array may leave out its element constructor
                // (serde_amqp writes it so).
                let elements = if values == 0 && reader.at == end {
                    None
                } else {
                    Some(reader.element_constructor()?)
                };
                Some(Open {
                    remaining: values,
                    end: Some(end),
                    elements,
                })
            }
        };
        match opened {
            Some(container) => {
                open.push(container);
                if open.len() > limits.max_depth as usize {
                    return Err(Unreadable::TooDeep {
                        max: limits.max_depth,
                    });
                }
            }
            None if open.is_empty() => sections.push(section_start..reader.at),
            None => {}
        }
    }
}

/// The top-level values of `payload`, each a message section, with their
/// descriptor codes (a section named by its symbol, by the code of that
/// name), found from the sizes their encodings give: nothing inside a
/// section is read, so this works on a payload of any depth. `None` when
/// the payload is not a sequence of described sections.
pub fn sections(payload: &[u8]) -> Option<Vec<(u64, Range<usize>)>> {
    let mut reader = Reader {
        bytes: payload,
        at: 0,
    };
    let mut found = Vec::new();
    while reader.at < payload.len() {
        let start = reader.at;
        if reader.constructor().ok()? != Layout::Described {
            return None;
        }
        let code = match reader.take(1).ok()?[0] {
            0x53 => u64::from(reader.take(1).ok()?[0]),
            0x80 => reader.number(8).ok()?,
            // A section named by its symbol.
            0xa3 => {
                let len = reader.length(1).ok()?;
                super::codes::code_of_name(reader.take(len).ok()?)?
            }
            0xb3 => {
                let len = reader.length(4).ok()?;
                super::codes::code_of_name(reader.take(len).ok()?)?
            }
            _ => return None,
        };
        // The section's value, itself perhaps described (an `amqp-value`
        // holding a described value): each descriptor is skipped in turn.
        loop {
            match reader.constructor().ok()? {
                Layout::Described => reader.skip_descriptor()?,
                layout => {
                    reader.skip(layout)?;
                    break;
                }
            }
        }
        found.push((code, start..reader.at));
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list nested `depth` deep, as an amqp-value section.
    fn nested_value(depth: usize) -> Vec<u8> {
        let mut value = vec![0x45]; // list0
        for _ in 1..depth {
            let size = u32::try_from(value.len() + 4).expect("small");
            let mut outer = vec![0xd0];
            outer.extend_from_slice(&size.to_be_bytes());
            outer.extend_from_slice(&1u32.to_be_bytes());
            outer.extend_from_slice(&value);
            value = outer;
        }
        let mut section = vec![0x00, 0x53, 0x77];
        section.extend_from_slice(&value);
        section
    }

    #[test]
    fn nesting_past_the_limit_is_refused_before_decoding() {
        let limits = ValueLimits::DEFAULT;
        // The section (1) holds lists nested 63 deep around an empty one
        // (which opens nothing): 64 levels.
        assert!(check(&nested_value(64), limits).is_ok());
        assert_eq!(
            check(&nested_value(65), limits),
            Err(Unreadable::TooDeep { max: 64 })
        );
        assert_eq!(
            check(&nested_value(100_000), limits),
            Err(Unreadable::TooDeep { max: 64 })
        );
    }

    #[test]
    fn a_huge_count_of_empty_values_is_refused_without_walking_it() {
        // array32 of 2^32-1 `true`s, each taking no bytes.
        let mut payload = vec![0x00, 0x53, 0x77, 0xf0];
        payload.extend_from_slice(&5u32.to_be_bytes());
        payload.extend_from_slice(&u32::MAX.to_be_bytes());
        payload.push(0x41);
        assert_eq!(
            check(&payload, ValueLimits::DEFAULT),
            Err(Unreadable::TooMany { max: 1 << 18 })
        );
    }

    #[test]
    fn sections_are_found_and_garbage_is_named() {
        let mut payload = vec![0x00, 0x53, 0x75, 0xa0, 0x02, b'h', b'i'];
        let first = payload.len();
        payload.extend_from_slice(&[0x00, 0x53, 0x77, 0xa1, 0x01, b'x']);
        assert_eq!(
            check(&payload, ValueLimits::DEFAULT),
            Ok(vec![0..first, first..payload.len()])
        );
        assert!(matches!(
            check(&[0x00, 0x53, 0x75, 0xa0, 0x10, 0x01], ValueLimits::DEFAULT),
            Err(Unreadable::Malformed { .. })
        ));
        assert!(matches!(
            check(&[0x00, 0x53, 0x77, 0x22], ValueLimits::DEFAULT),
            Err(Unreadable::Malformed { at: 3, .. })
        ));
    }

    /// Found by fuzzing: an empty array re-encoded by serde_amqp has no
    /// element constructor, and must still pass.
    #[test]
    fn an_empty_array_without_its_element_constructor_passes() {
        let written = [0x00, 0x53, 0x77, 0xe0, 0x01, 0x00];
        assert_eq!(
            check(&written, ValueLimits::DEFAULT).map(|s| s.len()),
            Ok(1)
        );
        let with_constructor = [0x00, 0x53, 0x77, 0xf0, 0, 0, 0, 5, 0, 0, 0, 0, 0x41];
        let sections = check(&with_constructor, ValueLimits::DEFAULT);
        assert_eq!(sections.map(|s| s.last().map(|r| r.end)), Ok(Some(13)));
    }

    /// Found by fuzzing: serde_amqp counts a map's entries down two at a
    /// time, and underflows on an odd count.
    #[test]
    fn a_map_with_an_odd_count_is_malformed() {
        let payload = [0x00, 0x53, 0x77, 0xc1, 0x02, 0x01, 0x40];
        assert!(matches!(
            check(&payload, ValueLimits::DEFAULT),
            Err(Unreadable::Malformed { .. })
        ));
    }

    /// Found by the hostile publisher: an `amqp-value` holding a
    /// described value, whose message-id must still be found.
    #[test]
    fn a_section_holding_a_described_value_is_found() {
        let mut payload = vec![0x00, 0x53, 0x73, 0x45];
        let start = payload.len();
        payload.extend_from_slice(&[0x00, 0x53, 0x77, 0x00, 0xa3, 0x01, b'x', 0x40]);
        assert_eq!(
            sections(&payload),
            Some(vec![(0x73, 0..start), (0x77, start..payload.len())])
        );
        // And one named by its symbol.
        let mut named = vec![0x00, 0xa3, 17];
        named.extend_from_slice(b"amqp:amqp-value:*");
        named.extend_from_slice(&[0xa1, 0x01, b'x']);
        assert_eq!(sections(&named), Some(vec![(0x77, 0..named.len())]));
    }

    #[test]
    fn sections_are_found_at_any_depth() {
        let mut payload = vec![0x00, 0x53, 0x70, 0x45];
        payload.extend_from_slice(&nested_value(100_000));
        assert_eq!(
            sections(&payload),
            Some(vec![(0x70, 0..4), (0x77, 4..payload.len())])
        );
        assert_eq!(sections(&[0x00, 0x53, 0x75, 0xa0, 0x10, 0x01]), None);
    }

    #[test]
    fn small_values_are_measured_at_their_decoded_size() {
        // An amqp-value list of 1,000 `true`s: 1,005 bytes on the wire.
        let mut payload = vec![0x00, 0x53, 0x77, 0xd0];
        payload.extend_from_slice(&(4 + 1000u32).to_be_bytes());
        payload.extend_from_slice(&1000u32.to_be_bytes());
        payload.extend(std::iter::repeat_n(0x41, 1000));
        let measured = measure(&payload, ValueLimits::DEFAULT).expect("within limits");
        assert_eq!(measured.decoded_bytes, 1003 * DECODED_VALUE_BYTES);
        assert!(measured.decoded_bytes > 40 * payload.len() as u64);
        // A binary counts its bytes once.
        let mut binary = vec![0x00, 0x53, 0x75, 0xb0];
        binary.extend_from_slice(&5000u32.to_be_bytes());
        binary.extend(std::iter::repeat_n(7, 5000));
        let measured = measure(&binary, ValueLimits::DEFAULT).expect("within limits");
        assert_eq!(measured.decoded_bytes, 3 * DECODED_VALUE_BYTES + 5000);
    }

    #[test]
    fn a_list_whose_size_lies_is_malformed() {
        // list8 of size 2 claiming one value, holding a two-byte one.
        let payload = [0x00, 0x53, 0x77, 0xc0, 0x02, 0x01, 0x50, 0x07, 0x40];
        assert!(matches!(
            check(&payload, ValueLimits::DEFAULT),
            Err(Unreadable::Malformed { .. })
        ));
    }
}
