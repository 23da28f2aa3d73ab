//! NCCL versions and their integer code (`NCCL_VERSION(X, Y, Z)`).

use std::fmt;

/// An NCCL version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

/// The oldest NCCL pg supports: it has `ncclCommInitRankConfig` with non-blocking init, `ncclCommFinalize`,
/// `ncclGetLastError` and `ncclCommSplit`.
pub const MIN_VERSION: Version = Version::new(2, 18, 0);

/// The first NCCL with the fp8 data types (`ncclFloat8e4m3`, `ncclFloat8e5m2`); before it fp8 data can only move
/// as bytes, never be reduced.
pub const FP8_VERSION: Version = Version::new(2, 24, 0);

/// The first NCCL with `ncclCommShrink` (and its `NCCL_SHRINK_ABORT` flag).
pub const SHRINK_VERSION: Version = Version::new(2, 27, 0);

/// The first NCCL with `ncclCommRevoke` (quiesce a communicator without freeing it; a finalize after it is invalid).
pub const REVOKE_VERSION: Version = Version::new(2, 28, 7);

/// The first NCCL with `ncclCommGrow` and `ncclCommGetUniqueId`.
pub const GROW_VERSION: Version = Version::new(2, 29, 0);

/// The newest NCCL whose config layout this crate knows; newer libraries get this layout, which they accept.
pub const NEWEST_KNOWN_VERSION: Version = Version::new(2, 28, 0);

impl Version {
    /// A version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch }
    }

    /// Decodes `ncclGetVersion`'s integer: `X*1000 + Y*100 + Z` up to 2.8, `X*10000 + Y*100 + Z` after.
    pub const fn from_code(code: u32) -> Self {
        if code < 10_000 {
            Self::new(code / 1000, (code % 1000) / 100, code % 100)
        } else {
            Self::new(code / 10_000, (code % 10_000) / 100, code % 100)
        }
    }

    /// Encodes as `NCCL_VERSION(X, Y, Z)` does.
    pub const fn code(self) -> u32 {
        if self.major <= 2 && self.minor <= 8 {
            self.major * 1000 + self.minor * 100 + self.patch
        } else {
            self.major * 10_000 + self.minor * 100 + self.patch
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        assert_eq!(Version::from_code(22803), Version::new(2, 28, 3));
        assert_eq!(Version::from_code(22809).to_string(), "2.28.9");
        assert_eq!(Version::from_code(2708), Version::new(2, 7, 8));
        assert_eq!(Version::new(2, 7, 8).code(), 2708);
        assert_eq!(Version::new(2, 28, 3).code(), 22803);
        assert_eq!(Version::new(2, 9, 0).code(), 20900);
        assert!(Version::new(2, 28, 9) > Version::new(2, 28, 3));
        assert!(MIN_VERSION < NEWEST_KNOWN_VERSION);
    }
}
