//! The pg-mock test suite: one binary, one module per concept, data-driven cases.

mod basics;
mod clock;
mod collectives;
mod common;
mod hazards;
mod streams;
