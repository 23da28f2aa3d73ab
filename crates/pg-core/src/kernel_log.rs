//! What a backend's kernel log says of one launch: the stream, the kind of kernel, its name and, where the backend
//! knows, when it ran. The simulated backend records every kernel; pg-nccl logs its own launches with `testing`.

use std::time::Duration;

/// What kind of kernel a launch was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// A communication kernel (a collective or point-to-point op).
    Comm,
    /// A sleep/spin kernel.
    Sleep,
    /// A fill kernel.
    Fill,
    /// A copy between host and device.
    Copy,
}

/// One kernel launch of a kernel log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLaunch {
    /// The stream it was launched on ([`crate::Stream::id`]).
    pub stream_id: u64,
    /// What it was.
    pub kind: KernelKind,
    /// Its name (`all_reduce`, `sleep`, ...).
    pub name: String,
    /// When it ran on the device (start, end), where the backend knows.
    pub span: Option<(Duration, Duration)>,
}
