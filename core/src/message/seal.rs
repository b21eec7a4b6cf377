//! Sealed retry counts. Anyone who can publish to a mount can write
//! `x-ruststream-retry-count`, and a message claiming retries it never had
//! reaches its limit early. With a key (`[host] retry_key_file`), every
//! copy the host publishes carries a seal over its message-id, body and
//! count, and a count without a valid seal is not believed. The key must be
//! the same on every host serving the same queues.

use sha2::{Digest as _, Sha256};

use super::AmqpMessage;
use crate::retry_key::RetryKey;
use crate::settlement::RETRY_COUNT_PROPERTY;

/// The application property a copy's seal travels in.
pub const RETRY_SEAL_PROPERTY: &str = "x-wharf-retry-seal";

impl AmqpMessage {
    /// The seal of this message carrying `retry_count`: over its
    /// message-id, its body's digest and the count.
    pub(super) fn retry_seal(&self, key: &RetryKey, retry_count: u32) -> String {
        let mut data = Vec::new();
        data.extend_from_slice(self.message_id().unwrap_or_default().as_bytes());
        data.push(b'\n');
        let body = serde_amqp::to_vec(&self.body).unwrap_or_default();
        data.extend_from_slice(&Sha256::digest(&body));
        data.push(b'\n');
        data.extend_from_slice(retry_count.to_string().as_bytes());
        key.mac_hex(&data)
    }

    /// Whether the retry count carries a valid seal under `key` (a message
    /// without a count needs none).
    pub fn retry_count_verifies(&self, key: &RetryKey) -> bool {
        let Some(count) = self.counters().retry_count else {
            return true;
        };
        let seal = match self.property(RETRY_SEAL_PROPERTY) {
            Some(fe2o3_amqp_types::primitives::Value::String(seal)) => seal,
            _ => return false,
        };
        // Compared whole: the seal is not secret, only unforgeable.
        *seal == self.retry_seal(key, count)
    }

    /// Seals the copy's retry count with `key`.
    pub fn seal_retry_count(&mut self, key: &RetryKey) {
        let Some(count) = self.counters().retry_count else {
            return;
        };
        let seal = self.retry_seal(key, count);
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
        if self.retry_count_verifies(key) {
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
    fn a_sealed_copy_verifies_and_a_forged_count_does_not() {
        let key = RetryKey::new(b"secret".to_vec());
        let original = AmqpMessage {
            properties: Some(
                fe2o3_amqp_types::messaging::Properties::builder()
                    .message_id("m-1".to_owned())
                    .build(),
            ),
            ..AmqpMessage::empty()
        };
        let mut copy = original.copy(2, None);
        assert!(
            !copy.retry_count_verifies(&key),
            "an unsealed count verified"
        );
        copy.seal_retry_count(&key);
        assert!(copy.retry_count_verifies(&key));
        assert!(!copy.retry_count_verifies(&RetryKey::new(b"other".to_vec())));
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
        assert!(!forged.retry_count_verifies(&key));
        assert!(forged.unsealed_count_dropped(&key));
        assert_eq!(forged.counters().retry_count, None);
        // A message without a count needs no seal.
        assert!(original.retry_count_verifies(&key));
    }
}
