//! `Status`: an `ncclResult_t` kept as the integer the library returned, with its name.

use std::fmt;

use crate::sys;

/// A result code as the library returned it. Codes this crate does not know keep their number.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub u32);

impl Status {
    /// `ncclSuccess`.
    pub const SUCCESS: Status = Status(sys::ncclSuccess);
    /// `ncclInProgress`.
    pub const IN_PROGRESS: Status = Status(sys::ncclInProgress);

    /// The C name of the code (`ncclInvalidUsage`), or `ncclResult(<n>)` for an unknown one.
    pub fn name(self) -> std::borrow::Cow<'static, str> {
        let known = match self.0 {
            sys::ncclSuccess => "ncclSuccess",
            sys::ncclUnhandledCudaError => "ncclUnhandledCudaError",
            sys::ncclSystemError => "ncclSystemError",
            sys::ncclInternalError => "ncclInternalError",
            sys::ncclInvalidArgument => "ncclInvalidArgument",
            sys::ncclInvalidUsage => "ncclInvalidUsage",
            sys::ncclRemoteError => "ncclRemoteError",
            sys::ncclInProgress => "ncclInProgress",
            sys::ncclTimeout => "ncclTimeout",
            other => return format!("ncclResult({other})").into(),
        };
        known.into()
    }

    /// Whether this is `ncclSuccess`.
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// Whether this is `ncclInProgress` (a non-blocking call not finished yet).
    pub fn is_in_progress(self) -> bool {
        self == Self::IN_PROGRESS
    }

    /// Whether the code names a failure: anything but success and in-progress (unknown codes included).
    pub fn is_error(self) -> bool {
        !self.is_success() && !self.is_in_progress()
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_known_and_unknown_codes() {
        assert_eq!(Status(0).name(), "ncclSuccess");
        assert_eq!(Status(5).name(), "ncclInvalidUsage");
        assert_eq!(Status(7).name(), "ncclInProgress");
        assert_eq!(Status(8).name(), "ncclTimeout");
        assert_eq!(Status(42).name(), "ncclResult(42)");
        assert_eq!(format!("{}", Status(6)), "ncclRemoteError (6)");
    }

    #[test]
    fn classification() {
        assert!(Status(0).is_success() && !Status(0).is_error());
        assert!(Status(7).is_in_progress() && !Status(7).is_error());
        assert!(Status(3).is_error());
        assert!(Status(99).is_error(), "an unknown code is a failure, never a success");
    }
}
