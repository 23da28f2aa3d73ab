//! The TCP store: a server and a client that speak PyTorch's TCPStore protocol byte for byte.

mod client;
mod key_hash;
pub mod protocol;
mod server;
mod state;

pub use client::{TcpStore, TcpStoreOptions, INIT_KEY};
pub use server::{
    default_busy_poll, default_coalesce, default_threads, host_congestion_control, threads_for, ServerOptions,
    ServerStats, TcpStoreServer, DEFAULT_BUSY_POLL, DEFAULT_COALESCE, MAX_DEFAULT_THREADS,
};

/// PyTorch's default TCPStore port.
pub const DEFAULT_PORT: u16 = 29500;
