//! Rendezvous stores: the key-value stores through which the ranks of a job find each other.
//!
//! A [`Store`] is what PyTorch calls a c10d store.
//! The process group uses it to hand the communicator's unique id from the rank that creates it to the
//! ranks that join it, and the reliability layer uses it for desync reports and error propagation.
//!
//! This crate knows nothing about devices, tensors or communicators.
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
