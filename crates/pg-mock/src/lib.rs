//! The simulated backend of pg.
#![forbid(unsafe_code)]
