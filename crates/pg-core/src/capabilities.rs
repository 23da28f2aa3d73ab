//! What a backend can do, declared up front: `Capabilities`, which [`crate::Device::capabilities`] returns, and
//! `Capability`, one of them by name. The process group asks it before it runs a call that needs one, so that a
//! missing capability is refused by name before any store traffic or device work, never discovered by an error.

use std::fmt;

/// One optional feature of a backend ([`Capabilities`] says which a backend has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Capability {
    /// Splitting a communicator ([`crate::Communicator::split`], NCCL's `ncclCommSplit`).
    Split,
    /// Shrinking a communicator ([`crate::Communicator::shrink`], NCCL's `ncclCommShrink`, 2.27).
    Shrink,
    /// Growing a communicator and joining a grown one ([`crate::Communicator::grow`],
    /// [`crate::Device::join_grown`], NCCL's `ncclCommGrow`, 2.29).
    Grow,
    /// Revoking a communicator ([`crate::Communicator::revoke`], NCCL's `ncclCommRevoke`, 2.28.7).
    Revoke,
    /// Stream capture into a graph ([`crate::Stream::begin_capture`] and the calls of a capture).
    Capture,
    /// A `PREMUL_SUM` whose factor lives in device memory ([`crate::Communicator::all_reduce_pre_mul_sum`],
    /// [`crate::Communicator::reduce_scatter_pre_mul_sum`]).
    DevicePreMulSum,
    /// Timing events ([`crate::Device::create_timing_event`], [`crate::Event::nanos_since`]).
    TimingEvents,
    /// Host callbacks on a stream ([`crate::Stream::launch_host_fn`]), which awaiting a Work rests on.
    HostCallbacks,
}

impl Capability {
    /// Every capability, in declaration order.
    pub const ALL: [Capability; 8] = [
        Capability::Split,
        Capability::Shrink,
        Capability::Grow,
        Capability::Revoke,
        Capability::Capture,
        Capability::DevicePreMulSum,
        Capability::TimingEvents,
        Capability::HostCallbacks,
    ];

    /// Its name in messages (`shrink`, `device PREMUL_SUM`).
    pub fn name(self) -> &'static str {
        match self {
            Capability::Split => "split",
            Capability::Shrink => "shrink",
            Capability::Grow => "grow",
            Capability::Revoke => "revoke",
            Capability::Capture => "stream capture",
            Capability::DevicePreMulSum => "device PREMUL_SUM",
            Capability::TimingEvents => "timing events",
            Capability::HostCallbacks => "host callbacks",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The optional features a backend's device has, declared up front ([`crate::Device::capabilities`]); on NCCL
/// they depend on the loaded library's version.
///
/// Make one with [`Capabilities::all`] or [`Capabilities::none`] and [`Capabilities::with`]/
/// [`Capabilities::without`]; read it with [`Capabilities::has`] or the fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`Capability::Split`].
    pub split: bool,
    /// [`Capability::Shrink`].
    pub shrink: bool,
    /// [`Capability::Grow`].
    pub grow: bool,
    /// [`Capability::Revoke`].
    pub revoke: bool,
    /// [`Capability::Capture`].
    pub capture: bool,
    /// [`Capability::DevicePreMulSum`].
    pub device_pre_mul_sum: bool,
    /// [`Capability::TimingEvents`].
    pub timing_events: bool,
    /// [`Capability::HostCallbacks`].
    pub host_callbacks: bool,
}

impl Capabilities {
    /// Every capability.
    pub const fn all() -> Self {
        Self {
            split: true,
            shrink: true,
            grow: true,
            revoke: true,
            capture: true,
            device_pre_mul_sum: true,
            timing_events: true,
            host_callbacks: true,
        }
    }

    /// No capability: the collectives and point-to-point ops only.
    pub const fn none() -> Self {
        Self {
            split: false,
            shrink: false,
            grow: false,
            revoke: false,
            capture: false,
            device_pre_mul_sum: false,
            timing_events: false,
            host_callbacks: false,
        }
    }

    /// These capabilities with `capability` present or absent as `present` says.
    #[must_use]
    pub fn set(mut self, capability: Capability, present: bool) -> Self {
        *self.slot(capability) = present;
        self
    }

    /// These capabilities and `capability`.
    #[must_use]
    pub fn with(self, capability: Capability) -> Self {
        self.set(capability, true)
    }

    /// These capabilities without `capability`.
    #[must_use]
    pub fn without(self, capability: Capability) -> Self {
        self.set(capability, false)
    }

    /// Whether `capability` is present.
    pub fn has(self, capability: Capability) -> bool {
        let mut copy = self;
        *copy.slot(capability)
    }

    /// The capabilities present, in [`Capability::ALL`]'s order.
    pub fn present(self) -> impl Iterator<Item = Capability> {
        Capability::ALL.into_iter().filter(move |&capability| self.has(capability))
    }

    /// `Ok` when `capability` is present, else the one refusal of a call that needs it: an
    /// [`crate::Error::Unsupported`] naming the call, the capability and the backend (its `Backend::NAME`).
    pub fn require(self, backend: &str, capability: Capability, call: &str) -> crate::Result<()> {
        match self.has(capability) {
            true => Ok(()),
            false => Err(Self::refusal(backend, capability, call)),
        }
    }

    /// The error [`Capabilities::require`] gives for `call` needing `capability` on the `backend` backend.
    pub fn refusal(backend: &str, capability: Capability, call: &str) -> crate::Error {
        Self::refusal_with(backend, capability, call, &[])
    }

    /// [`Capabilities::refusal`] that also lists `versions` (a device's `Device::versions`: on NCCL, the loaded
    /// library's), which say why the capability is absent.
    pub fn refusal_with(
        backend: &str,
        capability: Capability,
        call: &str,
        versions: &[(String, String)],
    ) -> crate::Error {
        let mut message =
            format!("{call}: the {backend} backend does not have the capability '{capability}' (Device::capabilities)");
        if !versions.is_empty() {
            let list: Vec<String> = versions.iter().map(|(name, value)| format!("{name} {value}")).collect();
            message = format!("{message}; versions: {}", list.join(", "));
        }
        crate::Error::unsupported(message)
    }

    fn slot(&mut self, capability: Capability) -> &mut bool {
        match capability {
            Capability::Split => &mut self.split,
            Capability::Shrink => &mut self.shrink,
            Capability::Grow => &mut self.grow,
            Capability::Revoke => &mut self.revoke,
            Capability::Capture => &mut self.capture,
            Capability::DevicePreMulSum => &mut self.device_pre_mul_sum,
            Capability::TimingEvents => &mut self.timing_events,
            Capability::HostCallbacks => &mut self.host_callbacks,
        }
    }
}

impl Default for Capabilities {
    /// [`Capabilities::all`].
    fn default() -> Self {
        Self::all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_capability_is_its_own_field() {
        for capability in Capability::ALL {
            let one = Capabilities::none().with(capability);
            assert_eq!(one.present().collect::<Vec<_>>(), vec![capability]);
            let rest = Capabilities::all().without(capability);
            assert!(!rest.has(capability));
            assert_eq!(rest.present().count(), Capability::ALL.len() - 1);
        }
    }

    #[test]
    fn a_refusal_names_the_call_the_capability_and_the_backend() {
        let error = Capabilities::refusal("mock", Capability::Shrink, "shrink of group 'g'");
        assert!(matches!(error, crate::Error::Unsupported(_)));
        let text = error.to_string();
        for part in ["shrink of group 'g'", "mock backend", "'shrink'"] {
            assert!(text.contains(part), "{text}");
        }
    }
}
