//! The AMQP connection a host (or tenant) shares between its mounts.

use fe2o3_amqp::Connection;
use fe2o3_amqp::connection::ConnectionHandle;

use super::BrokerError;

/// Sessions one connection may carry: each mount uses two (its receiver's
/// and its publisher's), and hundreds of tenants may share a connection.
const CHANNEL_MAX: u16 = 4096;

/// An open AMQP 1.0 connection.
pub struct BrokerConnection {
    handle: ConnectionHandle<()>,
    url: String,
}

impl BrokerConnection {
    /// Opens a connection; SASL PLAIN is used when the URL carries a user and
    /// password.
    pub async fn open(url: &str, container_id: &str) -> Result<BrokerConnection, BrokerError> {
        let handle = Connection::builder()
            .container_id(container_id)
            .channel_max(CHANNEL_MAX)
            .open(url)
            .await
            .map_err(|e| BrokerError::Connect {
                url: redact(url),
                reason: e.to_string(),
            })?;
        Ok(BrokerConnection {
            handle,
            url: redact(url),
        })
    }

    /// The broker's URL with any password hidden.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub(super) fn handle(&mut self) -> &mut ConnectionHandle<()> {
        &mut self.handle
    }

    /// Closes the connection.
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, self.handle.close()).await;
    }
}

/// The URL with its password replaced, for logs and errors.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            super::redact("amqp://admin:secret@127.0.0.1:5672"),
            "amqp://admin:***@127.0.0.1:5672"
        );
        assert_eq!(super::redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
    }
}
