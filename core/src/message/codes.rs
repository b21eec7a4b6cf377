//! The codes of a message's sections, and the symbolic names a sender
//! may give them instead.

pub(crate) const HEADER: u64 = 0x70;
pub(crate) const DELIVERY_ANNOTATIONS: u64 = 0x71;
pub(crate) const MESSAGE_ANNOTATIONS: u64 = 0x72;
pub(crate) const PROPERTIES: u64 = 0x73;
pub(crate) const APPLICATION_PROPERTIES: u64 = 0x74;
pub(crate) const DATA: u64 = 0x75;
pub(crate) const SEQUENCE: u64 = 0x76;
pub(crate) const VALUE: u64 = 0x77;
pub(crate) const FOOTER: u64 = 0x78;

/// Whether a section of `code` is part of the body (`data`,
/// `amqp-sequence`, `amqp-value`).
pub(crate) fn is_body(code: u64) -> bool {
    matches!(code, DATA | SEQUENCE | VALUE)
}

/// The section codes by their symbolic names, which a sender may use instead.
const NAMES: [(&str, u64); 9] = [
    ("amqp:header:list", HEADER),
    ("amqp:delivery-annotations:map", DELIVERY_ANNOTATIONS),
    ("amqp:message-annotations:map", MESSAGE_ANNOTATIONS),
    ("amqp:properties:list", PROPERTIES),
    ("amqp:application-properties:map", APPLICATION_PROPERTIES),
    ("amqp:data:binary", DATA),
    ("amqp:amqp-sequence:list", SEQUENCE),
    ("amqp:amqp-value:*", VALUE),
    ("amqp:footer:map", FOOTER),
];

/// The code of a section by its symbolic name.
pub(crate) fn code_of_name(name: &[u8]) -> Option<u64> {
    NAMES
        .iter()
        .find(|(known, _)| known.as_bytes() == name)
        .map(|(_, code)| *code)
}
