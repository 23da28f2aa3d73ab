//! Rendezvous stores: the key-value stores through which the ranks of a job find each other.
//!
//! A [`Store`] is what PyTorch calls a c10d store.
//! The process group uses it to hand the communicator's unique id from the rank that creates it to the
//! ranks that join it, and the reliability layer uses it for desync reports and error propagation.
//!
//! The stores:
//!
//! | store | what it is |
//! | --- | --- |
//! | [`TcpStore`] | a client of a TCP store server, byte-compatible with PyTorch's `TCPStore` both ways; rank 0 may host the [`TcpStoreServer`] in-process |
//! | [`FileStore`] | one shared file in PyTorch's `FileStore` format, usable by both at once |
//! | [`HashStore`] | in-process, for ranks that are threads |
//! | [`PrefixStore`] | a namespace (`prefix + "/" + key`) inside any other store |
//!
//! [`rendezvous`] turns `env://` (torchrun's variables, agent store included), `tcp://` and `file://` URLs
//! into a store, a rank and a world size. The `pgstore` binary serves a store or talks to a live one.
//!
//! Architecture invariants: this crate knows nothing about devices, tensors or communicators; the TCP
//! server runs a few event-driven threads (one or two by default; no thread per connection); what a client
//! can make the server hold is bounded by [`Limits`] (per request, per connection's pending waits, and for
//! the queued large replies of all connections).
#![forbid(unsafe_code)]

mod error;
mod file;
mod hash;
pub mod liveness;
mod prefix;
pub mod rendezvous;
mod store;
mod tcp;

pub use error::StoreError;
pub use file::FileStore;
pub use hash::HashStore;
pub use prefix::PrefixStore;
pub use store::{Store, DEFAULT_STORE_TIMEOUT};
pub use tcp::{Limits, ServerOptions, ServerStats, TcpStore, TcpStoreOptions, TcpStoreServer, DEFAULT_PORT};

/// The wire protocol's codec, for this crate's tests and fuzzing only: not part of the API, and it may
/// change at any time.
#[doc(hidden)]
pub mod wire {
    pub use crate::tcp::protocol::{decode_request, encode_request, Request, VALIDATION_MAGIC};
}
