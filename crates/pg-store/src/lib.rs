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
//! server is one event-driven thread (no thread per connection); nothing a client sends makes the server
//! buffer more than [`tcp::protocol::Limits`] allows for one request.
#![forbid(unsafe_code)]

mod error;
mod file;
mod hash;
mod prefix;
pub mod rendezvous;
mod store;
pub mod tcp;

pub use error::StoreError;
pub use file::FileStore;
pub use hash::HashStore;
pub use prefix::PrefixStore;
pub use store::{Store, DEFAULT_STORE_TIMEOUT};
pub use tcp::{TcpStore, TcpStoreOptions, TcpStoreServer};
