//! The TCPStore wire format: command bytes, limits, the server's incremental request decoder and the
//! client's request encoder.
//!
//! Every integer is little-endian; strings and byte strings are a `u64` length followed by the raw bytes.
//! There is no framing and no request id: requests and replies on one connection are strictly ordered.

use std::fmt;
use std::ops::Range;

/// The value of the `VALIDATE` message that must open every connection.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// A reply byte to `CHECK`: every key is set.
pub const CHECK_READY: u8 = 0;
/// A reply byte to `CHECK`: some key is missing.
pub const CHECK_NOT_READY: u8 = 1;
/// A reply byte to `WAIT` and `BARRIER`: the awaited condition holds.
pub const STOP_WAITING: u8 = 0;
/// The reply byte to `CANCEL_WAIT`.
pub const WAIT_CANCELED: u8 = 1;

/// The commands of PyTorch's current protocol; the discriminant is the byte on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Command {
    /// Opens a connection with the validation magic.
    Validate = 0,
    /// Sets a key.
    Set = 1,
    /// Compare-and-set.
    CompareSet = 2,
    /// Reads a key (the client waits for it first).
    Get = 3,
    /// Adds to a decimal counter.
    Add = 4,
    /// Whether keys exist.
    Check = 5,
    /// Waits for keys.
    Wait = 6,
    /// The number of keys.
    GetNumKeys = 7,
    /// Deletes a key.
    DeleteKey = 8,
    /// Appends to a key.
    Append = 9,
    /// Reads several keys.
    MultiGet = 10,
    /// Sets several keys.
    MultiSet = 11,
    /// Cancels the connection's pending waits.
    CancelWait = 12,
    /// Echoes a nonce.
    Ping = 13,
    /// Pushes to a queue.
    QueuePush = 14,
    /// Pops from a queue.
    QueuePop = 15,
    /// The length of a queue.
    QueueLen = 16,
    /// Every key.
    ListKeys = 17,
    /// A counting barrier.
    Barrier = 18,
}

impl Command {
    /// The command that `byte` stands for, if any.
    pub fn from_byte(byte: u8) -> Option<Self> {
        use Command::*;
        const ALL: [Command; 19] = [
            Validate, Set, CompareSet, Get, Add, Check, Wait, GetNumKeys, DeleteKey, Append, MultiGet, MultiSet,
            CancelWait, Ping, QueuePush, QueuePop, QueueLen, ListKeys, Barrier,
        ];
        ALL.get(usize::from(byte)).copied()
    }

    /// PyTorch's name of the command.
    pub fn name(self) -> &'static str {
        use Command::*;
        match self {
            Validate => "VALIDATE",
            Set => "SET",
            CompareSet => "COMPARE_SET",
            Get => "GET",
            Add => "ADD",
            Check => "CHECK",
            Wait => "WAIT",
            GetNumKeys => "GETNUMKEYS",
            DeleteKey => "DELETE_KEY",
            Append => "APPEND",
            MultiGet => "MULTI_GET",
            MultiSet => "MULTI_SET",
            CancelWait => "CANCEL_WAIT",
            Ping => "PING",
            QueuePush => "QUEUE_PUSH",
            QueuePop => "QUEUE_POP",
            QueueLen => "QUEUE_LEN",
            ListKeys => "LIST_KEYS",
            Barrier => "BARRIER",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the server accepts from one request; a client that breaks a limit is disconnected.
///
/// The first three are those of PyTorch's libuv server.
/// `max_message_len` bounds a whole request (a `MULTI_SET` of many large values), so that the bytes a
/// connection can make the server buffer are bounded too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest key, in bytes (PyTorch: 8 KiB).
    pub max_key_len: usize,
    /// The longest value, in bytes (PyTorch: 8 MiB).
    pub max_value_len: usize,
    /// The most keys in one multi-key request (PyTorch: 128 Ki).
    pub max_key_count: usize,
    /// The longest request, in bytes, counting every field.
    pub max_message_len: usize,
    /// The longest reply to one `MULTI_GET`: naming one large value many times must not make the server
    /// build an arbitrarily large reply.
    pub max_reply_len: usize,
    /// The most `WAIT` key registrations one connection may have pending. A client has one `WAIT` in flight
    /// at a time, so only a connection that pipelines waits it never collects comes near the default (twice
    /// `max_key_count`).
    pub max_waits_per_connection: usize,
    /// The most bytes of large replies (64 KiB and more: `GET`, `MULTI_GET`, `LIST_KEYS`) that the whole
    /// server queues for clients that have not read them yet. A large reply that would go past it waits until
    /// others are read, unless none is queued (so one reply up to `max_reply_len` always proceeds).
    pub max_queued_reply_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_len: 8 * 1024,
            max_value_len: 8 * 1024 * 1024,
            max_key_count: 128 * 1024,
            max_message_len: 32 << 20,
            max_reply_len: 256 << 20,
            max_waits_per_connection: 256 * 1024,
            max_queued_reply_bytes: 256 << 20,
        }
    }
}

/// One decoded client request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs, reason = "each variant carries the fields of the command of the same name")]
pub enum Request {
    Validate { magic: u32 },
    Set { key: Vec<u8>, value: Vec<u8> },
    CompareSet { key: Vec<u8>, expected: Vec<u8>, desired: Vec<u8> },
    Get { key: Vec<u8> },
    Add { key: Vec<u8>, delta: i64 },
    Check { keys: Vec<Vec<u8>> },
    Wait { keys: Vec<Vec<u8>> },
    GetNumKeys,
    DeleteKey { key: Vec<u8> },
    Append { key: Vec<u8>, value: Vec<u8> },
    MultiGet { keys: Vec<Vec<u8>> },
    MultiSet { pairs: Vec<(Vec<u8>, Vec<u8>)> },
    CancelWait,
    Ping { nonce: u32 },
    QueuePush { key: Vec<u8>, value: Vec<u8> },
    QueuePop { key: Vec<u8> },
    QueueLen { key: Vec<u8> },
    ListKeys,
    Barrier { key: Vec<u8>, world_size: i64 },
}

impl Request {
    /// Whether the server answers this request. SET, APPEND, MULTI_SET, QUEUE_PUSH and VALIDATE get no reply
    /// (fire-and-forget); WAIT and BARRIER get theirs when they are released.
    pub fn has_reply(&self) -> bool {
        !matches!(
            self,
            Request::Validate { .. }
                | Request::Set { .. }
                | Request::Append { .. }
                | Request::MultiSet { .. }
                | Request::QueuePush { .. }
        )
    }
}

/// Why a request could not be decoded; the server closes the connection with this as the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The command byte is not one of the protocol's.
    #[error("unknown command byte {0}")]
    UnknownCommand(u8),
    /// The first message on a connection was not `VALIDATE`.
    #[error("first message is command byte {0}, not VALIDATE")]
    NotValidated(u8),
    /// `VALIDATE` carried the wrong magic number.
    #[error("validation magic is {0:#010x}, expected {VALIDATION_MAGIC:#010x}")]
    BadMagic(u32),
    /// A key is longer than the limit.
    #[error("{command} key of {len} bytes exceeds the key limit of {max} bytes")]
    KeyTooLong {
        /// The command.
        command: Command,
        /// The declared length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A value is longer than the limit.
    #[error("{command} value of {len} bytes exceeds the value limit of {max} bytes")]
    ValueTooLong {
        /// The command.
        command: Command,
        /// The declared length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A multi-key request names too many keys (or a negative number).
    #[error("{command} with {count} keys exceeds the limit of {max} keys per request")]
    TooManyKeys {
        /// The command.
        command: Command,
        /// The declared count, as the signed value the client sent.
        count: i64,
        /// The limit.
        max: usize,
    },
    /// The whole request is longer than the limit.
    #[error("{command} request of at least {len} bytes exceeds the request limit of {max} bytes")]
    MessageTooLong {
        /// The command.
        command: Command,
        /// The length declared so far.
        len: u64,
        /// The limit.
        max: usize,
    },
}

/// Decoding stops either because more bytes are needed or because the request is bad.
enum Stop {
    Incomplete,
    Bad(DecodeError),
}

impl From<DecodeError> for Stop {
    fn from(error: DecodeError) -> Self {
        Stop::Bad(error)
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    limits: &'a Limits,
    command: Command,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], Stop> {
        let end = self.pos.checked_add(len).ok_or(Stop::Incomplete)?;
        let bytes = self.buf.get(self.pos..end).ok_or(Stop::Incomplete)?;
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, Stop> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// Checks that a field of `len` bytes starting here keeps the request within `max_message_len`.
    fn check_total(&self, len: u64) -> Result<(), Stop> {
        let total = (self.pos as u64).saturating_add(len);
        if total > self.limits.max_message_len as u64 {
            return Err(DecodeError::MessageTooLong {
                command: self.command,
                len: total,
                max: self.limits.max_message_len,
            }
            .into());
        }
        Ok(())
    }

    /// Where the next bytes field lies in the buffer, once its length passed `max` and the message limit.
    fn field(
        &mut self,
        max: usize,
        too_long: impl FnOnce(Command, u64, usize) -> DecodeError,
    ) -> Result<Range<usize>, Stop> {
        let len = self.u64()?;
        if len > max as u64 {
            return Err(too_long(self.command, len, max).into());
        }
        self.check_total(len)?;
        // The length is checked against what is buffered before anything is copied.
        let start = self.pos;
        self.take(usize::try_from(len).map_err(|_| Stop::Incomplete)?)?;
        Ok(start..self.pos)
    }

    fn key_range(&mut self) -> Result<Range<usize>, Stop> {
        self.field(self.limits.max_key_len, |command, len, max| DecodeError::KeyTooLong { command, len, max })
    }

    fn value_range(&mut self) -> Result<Range<usize>, Stop> {
        self.field(self.limits.max_value_len, |command, len, max| DecodeError::ValueTooLong { command, len, max })
    }

    fn key(&mut self) -> Result<Vec<u8>, Stop> {
        let range = self.key_range()?;
        Ok(self.buf[range].to_vec())
    }

    fn value(&mut self) -> Result<Vec<u8>, Stop> {
        let range = self.value_range()?;
        Ok(self.buf[range].to_vec())
    }

    fn count(&mut self) -> Result<usize, Stop> {
        let raw = self.i64()?;
        match usize::try_from(raw) {
            Ok(count) if count <= self.limits.max_key_count => Ok(count),
            _ => {
                Err(DecodeError::TooManyKeys { command: self.command, count: raw, max: self.limits.max_key_count }
                    .into())
            }
        }
    }

    fn keys(&mut self) -> Result<Vec<Vec<u8>>, Stop> {
        let count = self.count()?;
        // The capacity grows with what actually arrives, not with what the count claims.
        let mut keys = Vec::with_capacity(count.min(64));
        for _ in 0..count {
            keys.push(self.key()?);
        }
        Ok(keys)
    }
}

/// Decodes the request at the start of `buf`.
///
/// Returns `Ok(None)` when `buf` holds only part of a request, and `Ok(Some((request, consumed)))` when it
/// holds a whole one.
/// `validated` says whether this connection has already sent `VALIDATE`; before that, any other command
/// is an error.
/// A declared length above a limit is an error as soon as its length field arrives, so a caller that
/// buffers only until this returns never holds more than `limits.max_message_len` bytes of one request.
pub fn decode_request(buf: &[u8], validated: bool, limits: &Limits) -> Result<Option<(Request, usize)>, DecodeError> {
    Ok(decode_framed(buf, validated, limits)?.map(|(framed, used)| (framed.into_request(buf), used)))
}

/// A decoded request whose hot commands name their key and value by where they lie in the decoded buffer
/// instead of copying them out: a server that replaces a value in place then allocates nothing for a SET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framed {
    /// `SET`: the key's and the value's bytes in the buffer.
    Set {
        /// Where the key lies.
        key: Range<usize>,
        /// Where the value lies.
        value: Range<usize>,
    },
    /// `GET`: the key's bytes in the buffer.
    Get {
        /// Where the key lies.
        key: Range<usize>,
    },
    /// Any other request, decoded whole.
    Owned(Request),
}

impl Framed {
    /// Whether the server answers this request (see [`Request::has_reply`]).
    pub fn has_reply(&self) -> bool {
        match self {
            Framed::Set { .. } => false,
            Framed::Get { .. } => true,
            Framed::Owned(request) => request.has_reply(),
        }
    }

    /// The request with its bytes copied out of `buf`, the buffer it was decoded from.
    pub fn into_request(self, buf: &[u8]) -> Request {
        match self {
            Framed::Set { key, value } => Request::Set { key: buf[key].to_vec(), value: buf[value].to_vec() },
            Framed::Get { key } => Request::Get { key: buf[key].to_vec() },
            Framed::Owned(request) => request,
        }
    }

    /// The same request with its positions moved `by` bytes further into the buffer.
    pub fn shifted(self, by: usize) -> Framed {
        let shift = |range: Range<usize>| range.start + by..range.end + by;
        match self {
            Framed::Set { key, value } => Framed::Set { key: shift(key), value: shift(value) },
            Framed::Get { key } => Framed::Get { key: shift(key) },
            owned @ Framed::Owned(_) => owned,
        }
    }
}

/// Decodes the request at the start of `buf` as [`decode_request`] does, leaving a `SET`'s or a `GET`'s bytes
/// where they are; the positions in [`Framed`] are relative to `buf`.
pub fn decode_framed(buf: &[u8], validated: bool, limits: &Limits) -> Result<Option<(Framed, usize)>, DecodeError> {
    let Some(&byte) = buf.first() else { return Ok(None) };
    let Some(command) = Command::from_byte(byte) else {
        return Err(if validated { DecodeError::UnknownCommand(byte) } else { DecodeError::NotValidated(byte) });
    };
    if !validated && command != Command::Validate {
        return Err(DecodeError::NotValidated(byte));
    }
    let mut cursor = Cursor { buf, pos: 1, limits, command };
    match decode_body(&mut cursor, command) {
        Ok(framed) => Ok(Some((framed, cursor.pos))),
        Err(Stop::Incomplete) => Ok(None),
        Err(Stop::Bad(error)) => Err(error),
    }
}

fn decode_body(c: &mut Cursor<'_>, command: Command) -> Result<Framed, Stop> {
    let request = match command {
        // The hot commands leave their bytes in the buffer.
        Command::Set => return Ok(Framed::Set { key: c.key_range()?, value: c.value_range()? }),
        Command::Get => return Ok(Framed::Get { key: c.key_range()? }),
        Command::Validate => {
            let magic = c.u32()?;
            if magic != VALIDATION_MAGIC {
                return Err(DecodeError::BadMagic(magic).into());
            }
            Request::Validate { magic }
        }
        Command::CompareSet => Request::CompareSet { key: c.key()?, expected: c.value()?, desired: c.value()? },
        Command::Add => Request::Add { key: c.key()?, delta: c.i64()? },
        Command::Check => Request::Check { keys: c.keys()? },
        Command::Wait => Request::Wait { keys: c.keys()? },
        Command::GetNumKeys => Request::GetNumKeys,
        Command::DeleteKey => Request::DeleteKey { key: c.key()? },
        Command::Append => Request::Append { key: c.key()?, value: c.value()? },
        Command::MultiGet => Request::MultiGet { keys: c.keys()? },
        Command::MultiSet => {
            let count = c.count()?;
            let mut pairs = Vec::with_capacity(count.min(64));
            for _ in 0..count {
                pairs.push((c.key()?, c.value()?));
            }
            Request::MultiSet { pairs }
        }
        Command::CancelWait => Request::CancelWait,
        Command::Ping => Request::Ping { nonce: c.u32()? },
        Command::QueuePush => Request::QueuePush { key: c.key()?, value: c.value()? },
        Command::QueuePop => Request::QueuePop { key: c.key()? },
        Command::QueueLen => Request::QueueLen { key: c.key()? },
        Command::ListKeys => Request::ListKeys,
        Command::Barrier => Request::Barrier { key: c.key()?, world_size: c.i64()? },
    };
    Ok(Framed::Owned(request))
}

/// Builds one or more requests into a byte buffer, exactly as PyTorch's client lays them out.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a command byte.
    pub fn command(&mut self, command: Command) -> &mut Self {
        self.buf.push(command as u8);
        self
    }

    /// Appends a little-endian `u32`.
    pub fn u32(&mut self, value: u32) -> &mut Self {
        self.buf.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Appends a little-endian `u64`.
    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.buf.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Appends a little-endian `i64`.
    pub fn i64(&mut self, value: i64) -> &mut Self {
        self.buf.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// Appends a length-prefixed string or byte string.
    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.u64(value.len() as u64);
        self.buf.extend_from_slice(value);
        self
    }

    /// Appends a count and that many length-prefixed keys.
    pub fn keys<K: AsRef<[u8]>>(&mut self, keys: &[K]) -> &mut Self {
        self.u64(keys.len() as u64);
        for key in keys {
            self.bytes(key.as_ref());
        }
        self
    }

    /// The bytes built so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Empties the buffer, keeping its allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// The bytes built so far, by value.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Encodes one request (the inverse of [`decode_request`]); tests and tools use it.
pub fn encode_request(request: &Request) -> Vec<u8> {
    let mut e = Encoder::new();
    match request {
        Request::Validate { magic } => e.command(Command::Validate).u32(*magic),
        Request::Set { key, value } => e.command(Command::Set).bytes(key).bytes(value),
        Request::CompareSet { key, expected, desired } => {
            e.command(Command::CompareSet).bytes(key).bytes(expected).bytes(desired)
        }
        Request::Get { key } => e.command(Command::Get).bytes(key),
        Request::Add { key, delta } => e.command(Command::Add).bytes(key).i64(*delta),
        Request::Check { keys } => e.command(Command::Check).keys(keys),
        Request::Wait { keys } => e.command(Command::Wait).keys(keys),
        Request::GetNumKeys => e.command(Command::GetNumKeys),
        Request::DeleteKey { key } => e.command(Command::DeleteKey).bytes(key),
        Request::Append { key, value } => e.command(Command::Append).bytes(key).bytes(value),
        Request::MultiGet { keys } => e.command(Command::MultiGet).keys(keys),
        Request::MultiSet { pairs } => {
            e.command(Command::MultiSet).i64(pairs.len() as i64);
            for (key, value) in pairs {
                e.bytes(key).bytes(value);
            }
            &mut e
        }
        Request::CancelWait => e.command(Command::CancelWait),
        Request::Ping { nonce } => e.command(Command::Ping).u32(*nonce),
        Request::QueuePush { key, value } => e.command(Command::QueuePush).bytes(key).bytes(value),
        Request::QueuePop { key } => e.command(Command::QueuePop).bytes(key),
        Request::QueueLen { key } => e.command(Command::QueueLen).bytes(key),
        Request::ListKeys => e.command(Command::ListKeys),
        Request::Barrier { key, world_size } => e.command(Command::Barrier).bytes(key).i64(*world_size),
    };
    e.into_bytes()
}

/// Parses the leading decimal integer of `text` the way C++'s `std::stoll` does: leading whitespace, an
/// optional sign, then at least one digit; anything after the digits is ignored.
pub fn parse_stoll(text: &[u8]) -> Option<i64> {
    let start = text.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &text[start..];
    let sign_len = usize::from(matches!(rest.first(), Some(b'+' | b'-')));
    let digits = rest[sign_len..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    std::str::from_utf8(&rest[..sign_len + digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    #[test]
    fn validate_is_the_command_byte_then_the_magic() {
        let bytes = encode_request(&Request::Validate { magic: VALIDATION_MAGIC });
        assert_eq!(bytes, [0x00, 0xCE, 0xF7, 0x85, 0x3C]);
        assert_eq!(
            decode_request(&bytes, false, &limits()),
            Ok(Some((Request::Validate { magic: VALIDATION_MAGIC }, 5)))
        );
    }

    #[test]
    fn set_uses_little_endian_u64_lengths() {
        let bytes = encode_request(&Request::Set { key: b"/k".to_vec(), value: b"v1".to_vec() });
        let mut expected = vec![1];
        expected.extend_from_slice(&2u64.to_le_bytes());
        expected.extend_from_slice(b"/k");
        expected.extend_from_slice(&2u64.to_le_bytes());
        expected.extend_from_slice(b"v1");
        assert_eq!(bytes, expected);
    }

    #[test]
    fn every_prefix_of_a_request_is_incomplete() {
        let request = Request::MultiSet { pairs: vec![(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), vec![])] };
        let bytes = encode_request(&request);
        for end in 0..bytes.len() {
            assert_eq!(decode_request(&bytes[..end], true, &limits()), Ok(None), "prefix of {end} bytes");
        }
        assert_eq!(decode_request(&bytes, true, &limits()), Ok(Some((request, bytes.len()))));
    }

    #[test]
    fn oversized_lengths_are_rejected_before_their_bytes_arrive() {
        let mut bytes = vec![Command::Set as u8];
        bytes.extend_from_slice(&(8 * 1024 + 1u64).to_le_bytes());
        assert!(matches!(decode_request(&bytes, true, &limits()), Err(DecodeError::KeyTooLong { len: 8193, .. })));
        let mut bytes = encode_request(&Request::Set { key: b"k".to_vec(), value: vec![] });
        bytes.truncate(bytes.len() - 8);
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode_request(&bytes, true, &limits()), Err(DecodeError::ValueTooLong { .. })));
        let mut bytes = vec![Command::MultiGet as u8];
        bytes.extend_from_slice(&(-1i64).to_le_bytes());
        assert!(matches!(decode_request(&bytes, true, &limits()), Err(DecodeError::TooManyKeys { count: -1, .. })));
    }

    #[test]
    fn the_first_message_must_be_validate() {
        let bytes = encode_request(&Request::GetNumKeys);
        assert_eq!(decode_request(&bytes, false, &limits()), Err(DecodeError::NotValidated(7)));
        let bad = encode_request(&Request::Validate { magic: 1 });
        assert_eq!(decode_request(&bad, false, &limits()), Err(DecodeError::BadMagic(1)));
        assert_eq!(decode_request(&[19], true, &limits()), Err(DecodeError::UnknownCommand(19)));
    }

    /// Decodes `request` framed behind `offset` bytes of other data and checks the positions it names.
    fn check_framed(request: Request, offset: usize, expected: impl Fn(&[u8]) -> Framed) {
        let mut buf = vec![0xAA; offset];
        buf.extend(encode_request(&request));
        let (framed, used) = decode_framed(&buf[offset..], true, &limits()).unwrap().unwrap();
        assert_eq!(used, buf.len() - offset);
        let framed = framed.shifted(offset);
        assert_eq!(framed, expected(&buf));
        assert_eq!(framed.into_request(&buf), request);
    }

    #[test]
    fn framed_requests_name_their_bytes_in_the_buffer() {
        // A SET's key starts after the command byte and its length: 1 + 8.
        check_framed(Request::Set { key: b"/k".to_vec(), value: b"v1".to_vec() }, 0, |_| Framed::Set {
            key: 9..11,
            value: 19..21,
        });
        check_framed(Request::Set { key: b"/key".to_vec(), value: vec![] }, 5, |_| Framed::Set {
            key: 14..18,
            value: 26..26,
        });
        check_framed(Request::Get { key: b"/g".to_vec() }, 3, |_| Framed::Get { key: 12..14 });
        check_framed(Request::Add { key: b"/a".to_vec(), delta: 2 }, 1, |buf| {
            Framed::Owned(decode_request(&buf[1..], true, &limits()).unwrap().unwrap().0)
        });
    }

    #[test]
    fn stoll_parses_like_cpp() {
        assert_eq!(parse_stoll(b" 42abc"), Some(42));
        assert_eq!(parse_stoll(b"-7"), Some(-7));
        assert_eq!(parse_stoll(b"x"), None);
        assert_eq!(parse_stoll(b""), None);
        assert_eq!(parse_stoll(b"99999999999999999999"), None);
    }
}
