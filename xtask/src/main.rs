//! `cargo xtask`: the project's tasks in one binary.
#![forbid(unsafe_code)]

fn main() {
    println!("cargo xtask: no tasks yet");
}
