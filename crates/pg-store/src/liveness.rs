//! Liveness through the store: the reserved keys by which a process says "I am alive" on a connection of its own,
//! and by which pg's TCP store server says that such a connection closed.
//!
//! The protocol is made of ordinary SETs, CHECKs and DELETEs, so PyTorch's clients and servers keep working:
//!
//! - A holder SETs `{P}pg.live/{name}` (any value) on a dedicated connection. pg's server marks that connection as
//!   the holder of `{P}pg.live/{name}` and at once SETs `{P}pg.watched/{name}` to `1`: the holder CHECKs it on
//!   the same connection (answered after the SET), and a server that does not know the protocol (PyTorch's) leaves
//!   it unset, so the holder knows no death will be published and says so.
//! - When the holding connection closes (the process ended or was killed: the kernel closes a SIGKILLed process's
//!   sockets at once) without having DELETEd its live key, the server SETs `{P}pg.dead/{name}` to
//!   [`DEAD_VALUE`] and ADDs 1 to `{P}pg.deaths` (so one CHECK of one key tells a watcher whether anyone died).
//! - A DELETE of `{P}pg.live/{name}` (by anyone) ends the hold without a death: a process that leaves on purpose.
//!
//! `P` is any prefix (a [`crate::PrefixStore`]'s `prefix/`, or nothing). A closed connection is unambiguous: a
//! live process whose threads are paused or busy keeps its sockets open, so it is never declared dead. What the
//! protocol cannot tell is a store that dies itself: a store hosted by a process that dies takes every
//! connection with it (run a standalone `pgstore` to avoid it).

/// The path segment of a live key: `{P}pg.live/{name}`.
pub const LIVE_SEGMENT: &str = "pg.live";

/// The value the server writes at a dead key.
pub const DEAD_VALUE: &[u8] = b"liveness connection closed";

/// The key (under the holder's prefix) whose SET registers the connection as `name`'s liveness holder.
pub fn live_key(name: &str) -> String {
    format!("{LIVE_SEGMENT}/{name}")
}

/// The key a liveness-aware server sets when it registered a holder of `name`.
pub fn watched_key(name: &str) -> String {
    format!("pg.watched/{name}")
}

/// The key the server sets when `name`'s holding connection closed.
pub fn dead_key(name: &str) -> String {
    format!("pg.dead/{name}")
}

/// The counter the server adds 1 to at every death under a prefix.
pub const DEATHS_KEY: &str = "pg.deaths";

/// Splits a live key `{P}pg.live/{name}` into `(P, name)`, or `None` when `key` is not one: `P` is empty or ends
/// with `/`, and `name` is non-empty and has no `/`. Looks only at the key's last two segments, so a SET of any
/// other key costs a scan of its last segment.
pub fn split_live_key(key: &[u8]) -> Option<(&[u8], &[u8])> {
    let slash = key.iter().rposition(|&b| b == b'/')?;
    let (head, name) = (&key[..slash], &key[slash + 1..]);
    if name.is_empty() {
        return None;
    }
    let prefix = head.strip_suffix(LIVE_SEGMENT.as_bytes())?;
    (prefix.is_empty() || prefix.ends_with(b"/")).then_some((prefix, name))
}

/// The keys a death of `name` under `prefix` sets: its dead key, its watched key (to find the holder's name
/// back) and the prefix's death counter.
pub fn death_keys(prefix: &[u8], name: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let with = |tail: &[u8]| [prefix, tail].concat();
    (with(&[b"pg.dead/", name].concat()), with(DEATHS_KEY.as_bytes()))
}

/// The watched key of `name` under `prefix`.
pub fn watched_key_under(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    [prefix, b"pg.watched/", name].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_keys_are_told_from_others_by_their_last_two_segments() {
        assert_eq!(split_live_key(b"pg.live/3"), Some((&b""[..], &b"3"[..])));
        assert_eq!(split_live_key(b"g/x/pg.live/12"), Some((&b"g/x/"[..], &b"12"[..])));
        for other in [&b"pg.live/"[..], b"apg.live/3", b"pg.live", b"recovery.0/alive/3", b"pg.live/3/x", b"3"] {
            assert_eq!(split_live_key(other), None, "{}", String::from_utf8_lossy(other));
        }
        let (dead, deaths) = death_keys(b"g/", b"3");
        assert_eq!((dead.as_slice(), deaths.as_slice()), (&b"g/pg.dead/3"[..], &b"g/pg.deaths"[..]));
        assert_eq!(watched_key_under(b"g/", b"3"), b"g/pg.watched/3");
        assert_eq!(format!("g/{}", dead_key("3")).as_bytes(), dead.as_slice());
    }
}
