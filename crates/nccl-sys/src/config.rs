//! `ncclConfig_t`, laid out for the loaded library's version.
//!
//! NCCL's config struct only grows at its end. The library copies `size` bytes of what the caller passes
//! into a struct it first fills with its own defaults, then resets the fields newer than the caller's
//! `version` to those defaults. So a caller may pass any older layout, provided `size` and `version` say
//! which. We keep one Rust struct with every field up to [`crate::NEWEST_KNOWN_VERSION`] and set `size` and
//! `version` to the newest layout the loaded library also knows.

use std::ffi::{c_char, c_int};
use std::mem::offset_of;

use crate::Version;

/// `NCCL_CONFIG_UNDEF_INT`: "let NCCL choose".
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_API_MAGIC`, the config struct's magic.
pub const NCCL_API_MAGIC: u32 = 0xcafe_beef;

/// The config layouts this crate knows, named by the NCCL version that introduced their last field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConfigLayout {
    /// Up to `splitShare` (NCCL 2.18 to 2.24).
    V2_18,
    /// Up to `trafficClass` (NCCL 2.25, 2.26).
    V2_25,
    /// Up to `nvlsCTAs` (NCCL 2.27).
    V2_27,
    /// Up to `nvlinkCentricSched` (NCCL 2.28 and, through the append-only rule, later).
    V2_28,
}

impl ConfigLayout {
    /// The newest layout both this crate and NCCL `version` know; `None` before [`crate::MIN_VERSION`].
    pub fn for_version(version: Version) -> Option<Self> {
        let layout = match (version.major, version.minor) {
            (2, 0..=17) | (0..=1, _) => return None,
            (2, 18..=24) => Self::V2_18,
            (2, 25..=26) => Self::V2_25,
            (2, 27) => Self::V2_27,
            _ => Self::V2_28,
        };
        Some(layout)
    }

    /// The version the layout is declared as (the struct's `version` field).
    pub const fn version(self) -> Version {
        match self {
            Self::V2_18 => Version::new(2, 18, 0),
            Self::V2_25 => Version::new(2, 25, 0),
            Self::V2_27 => Version::new(2, 27, 0),
            Self::V2_28 => Version::new(2, 28, 0),
        }
    }

    /// `sizeof(ncclConfig_t)` in that version's header: the end of its last field, rounded up to the
    /// struct's alignment (that of `size_t` and the pointers, 8 bytes).
    pub const fn size(self) -> usize {
        let end = match self {
            Self::V2_18 => offset_of!(Config, split_share) + 4,
            Self::V2_25 => offset_of!(Config, traffic_class) + 4,
            Self::V2_27 => offset_of!(Config, nvls_ctas) + 4,
            Self::V2_28 => offset_of!(Config, nvlink_centric_sched) + 4,
        };
        end.div_ceil(8) * 8
    }
}

/// `ncclConfig_t` with every field up to NCCL 2.28; `size` and `version` name the layout in use.
///
/// Build it with [`Config::new`] (`NCCL_CONFIG_INITIALIZER`: every attribute "undefined", NCCL chooses).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Bytes NCCL may read (the layout's size).
    pub size: usize,
    /// `NCCL_API_MAGIC`.
    pub magic: u32,
    /// The layout's version code.
    pub version: u32,
    /// 1 blocking init and calls, 0 non-blocking (calls may return `ncclInProgress`).
    pub blocking: c_int,
    /// `cgaClusterSize`.
    pub cga_cluster_size: c_int,
    /// `minCTAs`.
    pub min_ctas: c_int,
    /// `maxCTAs`.
    pub max_ctas: c_int,
    /// `netName`.
    pub net_name: *const c_char,
    /// `splitShare`.
    pub split_share: c_int,
    /// `trafficClass` (2.25).
    pub traffic_class: c_int,
    /// `commName` (2.27).
    pub comm_name: *const c_char,
    /// `collnetEnable` (2.27).
    pub collnet_enable: c_int,
    /// `CTAPolicy` (2.27).
    pub cta_policy: c_int,
    /// `shrinkShare` (2.27).
    pub shrink_share: c_int,
    /// `nvlsCTAs` (2.27).
    pub nvls_ctas: c_int,
    /// `nChannelsPerNetPeer` (2.28).
    pub n_channels_per_net_peer: c_int,
    /// `nvlinkCentricSched` (2.28).
    pub nvlink_centric_sched: c_int,
}

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` in `layout`.
    pub const fn new(layout: ConfigLayout) -> Self {
        const U: c_int = NCCL_CONFIG_UNDEF_INT;
        Self {
            size: layout.size(),
            magic: NCCL_API_MAGIC,
            version: layout.version().code(),
            blocking: U,
            cga_cluster_size: U,
            min_ctas: U,
            max_ctas: U,
            net_name: std::ptr::null(),
            split_share: U,
            traffic_class: U,
            comm_name: std::ptr::null(),
            collnet_enable: U,
            cta_policy: U,
            shrink_share: U,
            nvls_ctas: U,
            n_channels_per_net_peer: U,
            nvlink_centric_sched: U,
        }
    }

    /// Sets blocking (`true`) or non-blocking (`false`) init and calls.
    pub const fn with_blocking(mut self, blocking: bool) -> Self {
        self.blocking = if blocking { 1 } else { 0 };
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets of nccl.h's `ncclConfig_v22800` on LP64 (x86-64, aarch64).
    #[test]
    fn layout_matches_the_c_header() {
        assert_eq!(offset_of!(Config, size), 0);
        assert_eq!(offset_of!(Config, magic), 8);
        assert_eq!(offset_of!(Config, version), 12);
        assert_eq!(offset_of!(Config, blocking), 16);
        assert_eq!(offset_of!(Config, cga_cluster_size), 20);
        assert_eq!(offset_of!(Config, min_ctas), 24);
        assert_eq!(offset_of!(Config, max_ctas), 28);
        assert_eq!(offset_of!(Config, net_name), 32);
        assert_eq!(offset_of!(Config, split_share), 40);
        assert_eq!(offset_of!(Config, traffic_class), 44);
        assert_eq!(offset_of!(Config, comm_name), 48);
        assert_eq!(offset_of!(Config, collnet_enable), 56);
        assert_eq!(offset_of!(Config, cta_policy), 60);
        assert_eq!(offset_of!(Config, shrink_share), 64);
        assert_eq!(offset_of!(Config, nvls_ctas), 68);
        assert_eq!(offset_of!(Config, n_channels_per_net_peer), 72);
        assert_eq!(offset_of!(Config, nvlink_centric_sched), 76);
        assert_eq!(std::mem::size_of::<Config>(), 80);
    }

    #[test]
    fn sizes_per_version() {
        assert_eq!(ConfigLayout::V2_18.size(), 48);
        assert_eq!(ConfigLayout::V2_25.size(), 48);
        assert_eq!(ConfigLayout::V2_27.size(), 72);
        assert_eq!(ConfigLayout::V2_28.size(), 80);
    }

    #[test]
    fn layout_follows_the_loaded_version() {
        assert_eq!(ConfigLayout::for_version(Version::new(2, 17, 1)), None);
        assert_eq!(ConfigLayout::for_version(Version::new(2, 18, 3)), Some(ConfigLayout::V2_18));
        assert_eq!(ConfigLayout::for_version(Version::new(2, 26, 2)), Some(ConfigLayout::V2_25));
        assert_eq!(ConfigLayout::for_version(Version::new(2, 27, 7)), Some(ConfigLayout::V2_27));
        // The machines' system NCCL and PyTorch's.
        assert_eq!(ConfigLayout::for_version(Version::new(2, 28, 3)), Some(ConfigLayout::V2_28));
        assert_eq!(ConfigLayout::for_version(Version::new(2, 28, 9)), Some(ConfigLayout::V2_28));
        assert_eq!(ConfigLayout::for_version(Version::new(2, 30, 1)), Some(ConfigLayout::V2_28));
        assert_eq!(ConfigLayout::for_version(Version::new(3, 0, 0)), Some(ConfigLayout::V2_28));
    }

    #[test]
    fn initializer_leaves_everything_to_nccl() {
        let config = Config::new(ConfigLayout::V2_28).with_blocking(false);
        assert_eq!(config.magic, 0xcafe_beef);
        assert_eq!(config.version, 22800);
        assert_eq!(config.size, 80);
        assert_eq!(config.blocking, 0);
        assert_eq!(config.max_ctas, NCCL_CONFIG_UNDEF_INT);
        assert!(config.net_name.is_null());
        assert_eq!(Config::new(ConfigLayout::V2_18).version, 21800);
    }
}
