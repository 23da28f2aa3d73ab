//! The pg-mock test suite: one binary, one module per concept, data-driven cases.

mod basics;
mod capture;
mod clock;
mod collectives;
mod common;
mod comms;
mod faults;
mod guard;
mod hazards;
mod memory;
mod store;
mod streams;
mod trace;
