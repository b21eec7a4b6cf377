//! The key retry counts are sealed with (`[host] retry_key_file`): an
//! HMAC-SHA256 over what a copy must not change. What is sealed, and where
//! the seal travels, is the message's business (`message::seal`).

use sha2::{Digest as _, Sha256};

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

    /// The HMAC of `data` under this key, as hex.
    pub fn mac_hex(&self, data: &[u8]) -> String {
        hmac(&self.0, data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        assert_eq!(
            RetryKey::new(b"Jefe".to_vec()).mac_hex(b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
