//! The TCP store: a server and a client that speak PyTorch's TCPStore protocol byte for byte.

mod client;
mod key_hash;
pub(crate) mod protocol;
mod server;
mod state;

pub use client::{TcpStore, TcpStoreOptions};
pub use protocol::Limits;
pub use server::{ServerOptions, ServerStats, TcpStoreServer};

/// PyTorch's default TCPStore port.
pub const DEFAULT_PORT: u16 = 29500;
