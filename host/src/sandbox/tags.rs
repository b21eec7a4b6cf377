//! Whose handler is running.

use std::sync::Arc;

/// Whose handler is running; tags its log lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTags {
    /// The tenant's name.
    pub tenant: Arc<str>,
    /// The mount's name.
    pub mount: Arc<str>,
}
