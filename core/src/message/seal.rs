//! Sealed retry counts. Anyone who can publish to a mount can write
//! `x-ruststream-retry-count`, and a message claiming retries it never had
//! reaches its limit early. With a key (`[host] retry_key_file`), every
//! copy the host publishes carries a seal over its message-id, body and
//! count, and a count without a valid seal is not believed. The key must be
//! the same on every host serving the same queues.

use sha2::{Digest as _, Sha256};

use super::AmqpMessage;
use crate::settlement::RETRY_COUNT_PROPERTY;

/// The application property a copy's seal travels in.
pub const RETRY_SEAL_PROPERTY: &str = "x-wharf-retry-seal";

/// The key retry counts are sealed with.
#[derive(Clone, PartialEq, Eq)]
pub struct RetryKey(Vec<u8>);

impl std::fmt::Debug for RetryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetryKey(***)")
    }
}

impl RetryKey {
    /// A key of these bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> RetryKey {
        RetryKey(bytes.into())
    }

    /// The seal of `message` carrying `retry_count`, as hex.
    pub fn seal(&self, message: &AmqpMessage, retry_count: u32) -> String {
        let mut data = Vec::new();
        data.extend_from_slice(message.message_id().unwrap_or_default().as_bytes());
        data.push(b'\n');
        let body = serde_amqp::to_vec(&message.body).unwrap_or_default();
        data.extend_from_slice(&Sha256::digest(&body));
        data.push(b'\n');
        data.extend_from_slice(retry_count.to_string().as_bytes());
        hmac(&self.0, &data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether `message`'s retry count carries a valid seal (a message
    /// without a count needs none).
    pub fn verifies(&self, message: &AmqpMessage) -> bool {
        let Some(count) = message.counters().retry_count else {
            return true;
        };
        let seal = match message.property(RETRY_SEAL_PROPERTY) {
            Some(fe2o3_amqp_types::primitives::Value::String(seal)) => seal,
            _ => return false,
        };
        // Compared whole: the seal is not secret, only unforgeable.
        *seal == self.seal(message, count)
    }
}

/// HMAC-SHA256 (RFC 2104).
fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(data)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

impl AmqpMessage {
    /// Seals the copy's retry count with `key`.
    pub fn seal_retry_count(&mut self, key: &RetryKey) {
        let Some(count) = self.counters().retry_count else {
            return;
        };
        let seal = key.seal(self, count);
        let properties = self.application_properties.get_or_insert_with(Vec::new);
        properties.retain(|(k, _)| k != RETRY_SEAL_PROPERTY);
        properties.push((
            RETRY_SEAL_PROPERTY.to_owned(),
            fe2o3_amqp_types::primitives::Value::String(seal),
        ));
    }

    /// The message with its retry count set aside, where `key` does not
    /// verify it: it counts as a first delivery by the host.
    pub fn unsealed_count_dropped(&mut self, key: &RetryKey) -> bool {
        if key.verifies(self) {
            return false;
        }
        if let Some(properties) = &mut self.application_properties {
            properties.retain(|(k, _)| k != RETRY_COUNT_PROPERTY && k != RETRY_SEAL_PROPERTY);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_sealed_copy_verifies_and_a_forged_count_does_not() {
        let key = RetryKey::new(b"secret".to_vec());
        let original = AmqpMessage {
            header: None,
            delivery_annotations: None,
            message_annotations: None,
            properties: Some(
                fe2o3_amqp_types::messaging::Properties::builder()
                    .message_id("m-1".to_owned())
                    .build(),
            ),
            application_properties: None,
            body: fe2o3_amqp_types::messaging::Body::Empty,
            footer: None,
            unread: Vec::new(),
        };
        let mut copy = original.copy(2, None);
        assert!(!key.verifies(&copy), "an unsealed count verified");
        copy.seal_retry_count(&key);
        assert!(key.verifies(&copy));
        assert!(!RetryKey::new(b"other".to_vec()).verifies(&copy));
        // Raising the count breaks the seal.
        let mut forged = copy.clone();
        forged.seal_retry_count(&key);
        let count = forged
            .application_properties
            .iter_mut()
            .flatten()
            .find(|(k, _)| k == RETRY_COUNT_PROPERTY)
            .expect("count");
        count.1 = fe2o3_amqp_types::primitives::Value::Uint(9);
        assert!(!key.verifies(&forged));
        assert!(forged.unsealed_count_dropped(&key));
        assert_eq!(forged.counters().retry_count, None);
        // A message without a count needs no seal.
        assert!(key.verifies(&original));
    }
}
