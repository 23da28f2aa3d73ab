//! NCCL bindings for pg, loaded at run time.
//!
//! Nothing here needs NCCL (or CUDA) at build time: [`Library::load`] opens `libnccl` with `dlopen` when a
//! program first asks for it, trying, in order,
//! 1. the path in the environment variable [`LIBRARY_ENV`] (`PG_NCCL_LIBRARY`), if set, and only that;
//! 2. `libnccl.so.2` (NCCL's soname, what a runtime-only install has);
//! 3. `libnccl.so` (the development symlink).
//!
//! A missing library, a missing symbol or a library older than [`MIN_VERSION`] is a typed [`Error`], never a
//! panic.
//!
//! The crate has the three levels of cudarc's bindings:
//! - [`sys`]: the C types and constants, and the raw function-pointer table ([`sys::Functions`]);
//! - the result level: the methods of [`Library`], one per C call, each returning `Result` with the result
//!   code kept as an integer ([`Status`]) together with its name and `ncclGetLastError`'s text;
//! - the safe level lives in the `pg-nccl` crate (communicator ownership, threading rules).
//!
//! The communicator configuration ([`Config`]) is laid out for the loaded library's version: NCCL reads a
//! config struct by its `size` and `version` fields, so we pass the largest layout we know that the library
//! knows too.

mod config;
mod error;
mod library;
mod status;
pub mod sys;
mod version;

pub use config::{Config, ConfigLayout};
pub use error::{Error, Result};
pub use library::{library, Library, LIBRARY_CANDIDATES, LIBRARY_ENV};
pub use status::Status;
pub use sys::{Comm, DataType, RedOp, UniqueId, UNIQUE_ID_BYTES};
pub use version::{
    Version, FP8_VERSION, GROW_VERSION, MIN_VERSION, NEWEST_KNOWN_VERSION, REVOKE_VERSION, SHRINK_VERSION,
};
