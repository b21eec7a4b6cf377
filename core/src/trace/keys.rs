//! Where trace context travels on a message: the keys, apart from the
//! code that reads them, so every part of a message's handling can name
//! them.

/// The `traceparent` key, in annotations and application properties.
pub const TRACEPARENT: &str = "traceparent";
/// The `tracestate` key.
pub const TRACESTATE: &str = "tracestate";
/// The message-annotation map Qpid's clients keep the context in.
pub const QPID_TRACESTATE: &str = "x-opt-qpid-tracestate";
/// The application property Azure's SDKs write.
pub const DIAGNOSTIC_ID: &str = "Diagnostic-Id";
