//! A transfer's payload, as any publisher may write it, through everything
//! the host does with a message: the limits check, decoding, the handler's
//! view (JSON rendering included), counters, copies (from the decoded
//! message and from the bytes), re-encoding, the annotation a dead letter
//! gets, and the trace context. Nothing may panic or recurse past the
//! limits; what decodes must encode and decode to the same message; a copy
//! can be made of anything that decodes, and decodes; a decode failure's
//! words stay bounded.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wharf_core::message::{self, AmqpMessage, DeliveryContext, limits};
use wharf_core::trace::TraceContext;

fuzz_target!(|payload: &[u8]| {
    let checked = limits::check(payload, limits::ValueLimits::DEFAULT);
    let sections = limits::sections(payload);
    if let Ok(ranges) = &checked {
        // Every range a full check finds, the shallow walk finds too.
        let shallow = sections.as_ref().map(|s| s.len());
        assert!(shallow.is_none() || shallow == Some(ranges.len()));
    }
    let _ = message::annotate(payload, "x-opt-wharf-dead-letter-reason", "fuzz");
    let decoded = match AmqpMessage::decode(payload) {
        Ok(decoded) => decoded,
        Err(failure) => {
            assert!(failure.as_str().len() <= wharf_core::text::DESCRIPTION_BYTES);
            return;
        }
    };
    assert!(checked.is_ok(), "decoded what the limits refuse");
    let context = DeliveryContext {
        address: "q",
        tenant: "t",
        mount: "m",
        attempt: decoded.counters().attempt(),
        presettled: false,
    };
    let _ = message::to_delivery(&decoded, context);
    let _ = decoded.identity();
    let copy = decoded.copy(
        decoded
            .counters()
            .retry_count
            .unwrap_or(0)
            .saturating_add(1),
        None,
    );
    if let Ok(encoded) = decoded.encode() {
        let again = AmqpMessage::decode(&encoded).expect("what the host encodes, it decodes");
        assert_eq!(again.counters(), decoded.counters());
    }
    if let Ok(encoded) = copy.encode() {
        AmqpMessage::decode(&encoded).expect("a copy decodes");
    }
    let of = message::CopyOf {
        retry_count: 1,
        ..message::CopyOf::default()
    };
    if limits::sections(payload).is_some() {
        let from_bytes = message::copy_payload(payload, &decoded, of)
            .expect("whatever decodes can be copied from its bytes");
        let read = AmqpMessage::decode(&from_bytes).expect("a copy from the bytes decodes");
        assert_eq!(read.counters().retry_count, Some(1));
    }
    // A trace context found is carried on a copy and on the payload as it
    // arrived, and read back first from the copy.
    if let Ok(Some(context)) = TraceContext::of(&decoded) {
        let child = context.child();
        if let Some(carried) = wharf_core::trace::carried_on_payload(payload, &child) {
            let _ = AmqpMessage::decode(&carried);
        }
        let mut carrying = copy;
        carrying.set_trace(&child);
        assert_eq!(TraceContext::of(&carrying), Ok(Some(child)));
    }
});
