//! The TCP store under hostile clients as types (`store-hostile.json`, written by `cargo xtask bench
//! store-hostile`). Field names are the JSON's; fields are declared in the JSON's (alphabetical) key order.

use serde::{Deserialize, Serialize};

/// The server's memory while readers ask for many large values in one request each.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MultiGet {
    /// Keys per request.
    pub keys_per_request: u64,
    /// Reader connections.
    pub readers: u64,
    /// The server's resident memory before, bytes.
    pub rss_before_bytes: u64,
    /// Its peak while the readers read, bytes.
    pub rss_peak_bytes: u64,
    /// The value's size, bytes.
    pub value_bytes: u64,
}

/// The server's responsiveness while many waiting clients drop their connections.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitCleanup {
    /// The longest ping meanwhile, ms.
    pub longest_ping_ms: f64,
    /// The waits dropped.
    pub waits: u64,
}

/// The hostile-clients result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreHostileResult {
    /// The command that produced it.
    pub command: String,
    /// The commit it was of.
    pub commit: String,
    /// When it ran (UTC).
    pub date: String,
    /// The machine.
    pub machine: String,
    /// The large multi-get.
    pub multi_get: MultiGet,
    /// The dropped waits.
    pub wait_cleanup: WaitCleanup,
}
