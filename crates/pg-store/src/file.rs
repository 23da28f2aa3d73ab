//! `FileStore`: a store in one file that every process of a job opens, in PyTorch's on-disk format.
//!
//! The file is an append-only log of records, each a `u32` little-endian length and a key, then a `u32`
//! length and a value.
//! User keys are written with a `/` prefix; a delete appends the key with a `-` in front and an empty value;
//! `add` writes the new sum as decimal text.
//! Writers hold an exclusive `flock` on the file, readers a shared one.
//! Each handle counts itself in `refcount/`; when the last handle of the last expected worker drops
//! (`cleanup/` reaches the number of workers and `refcount/` reaches 0), it deletes the file.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

use crate::tcp::protocol::parse_stoll;
use crate::{Store, StoreError, DEFAULT_STORE_TIMEOUT};

const REGULAR_PREFIX: &str = "/";
const DELETE_PREFIX: &str = "-";
const CLEANUP_KEY: &str = "cleanup/";
const REFCOUNT_KEY: &str = "refcount/";
/// How often `get` and `wait` look at the file again, as PyTorch does.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// What this handle has read of the file so far.
#[derive(Debug, Default)]
struct Cache {
    values: HashMap<Vec<u8>, Vec<u8>>,
    /// The offset up to which the file has been read.
    pos: u64,
}

/// A store in a shared file, readable and writable by PyTorch's `FileStore` at the same time.
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
    num_workers: i64,
    cache: Mutex<Cache>,
    timeout: Mutex<Duration>,
    /// Whether this handle counted itself in `refcount/`: only such a handle records its end on drop, so a
    /// failed open writes nothing.
    counted: bool,
}

/// A file held under `flock`; the lock is released when the file is closed.
struct Locked {
    file: File,
}

fn io_error(path: &Path, what: &str, error: io::Error) -> StoreError {
    StoreError::Other(format!("file store {}: {what}: {error}", path.display()))
}

impl FileStore {
    /// Opens (creating it when missing) the store at `path` for a job of `num_workers` workers; a negative
    /// number means "unknown" and turns off deleting the file at the end.
    pub fn new(path: impl Into<PathBuf>, num_workers: i64) -> Result<Self, StoreError> {
        let mut store = Self {
            path: path.into(),
            num_workers,
            cache: Mutex::default(),
            timeout: Mutex::new(DEFAULT_STORE_TIMEOUT),
            counted: false,
        };
        store.add_raw(REFCOUNT_KEY.as_bytes(), 1)?;
        store.counted = true;
        Ok(store)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens the file and locks it; a read-only open waits (up to the timeout) for the file to appear.
    fn open(&self, write: bool) -> Result<Locked, StoreError> {
        let timeout = self.timeout();
        let start = Instant::now();
        let file = loop {
            let result = match write {
                true => OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&self.path),
                false => File::open(&self.path),
            };
            match result {
                Ok(file) => break file,
                Err(error) if error.kind() == io::ErrorKind::NotFound && !write => {
                    if !timeout.is_zero() && start.elapsed() > timeout {
                        return Err(io_error(&self.path, "open", error));
                    }
                    std::thread::sleep(POLL_INTERVAL);
                }
                Err(error) => return Err(io_error(&self.path, "open", error)),
            }
        };
        let operation = if write { FlockOperation::LockExclusive } else { FlockOperation::LockShared };
        flock(&file, operation).map_err(|e| io_error(&self.path, "flock", e.into()))?;
        Ok(Locked { file })
    }

    /// Reads the records appended since the last refresh into the cache.
    fn refresh(&self, locked: &mut Locked, cache: &mut Cache) -> Result<(), StoreError> {
        let size = locked.file.metadata().map_err(|e| io_error(&self.path, "stat", e))?.len();
        if size == cache.pos {
            return Ok(());
        }
        if size < cache.pos {
            return Err(StoreError::Other(format!(
                "file store {}: the file shrank from {} to {size} bytes; it was replaced or truncated",
                self.path.display(),
                cache.pos
            )));
        }
        locked.file.seek(SeekFrom::Start(cache.pos)).map_err(|e| io_error(&self.path, "seek", e))?;
        let mut tail = Vec::new();
        (&locked.file).take(size - cache.pos).read_to_end(&mut tail).map_err(|e| io_error(&self.path, "read", e))?;
        let mut at = 0;
        while at < tail.len() {
            let (key, next) = record_field(&tail, at).ok_or_else(|| self.corrupt(cache.pos + at as u64))?;
            let (value, next) = record_field(&tail, next).ok_or_else(|| self.corrupt(cache.pos + at as u64))?;
            match key.strip_prefix(DELETE_PREFIX.as_bytes()) {
                Some(deleted) => {
                    cache.values.remove(deleted);
                }
                None => {
                    cache.values.insert(key.to_vec(), value.to_vec());
                }
            }
            at = next;
        }
        cache.pos = size;
        Ok(())
    }

    fn corrupt(&self, offset: u64) -> StoreError {
        StoreError::Other(format!("file store {}: truncated record at offset {offset}", self.path.display()))
    }

    /// Appends one record; every caller has read the file up to its end under the same lock first, so a file
    /// that cannot be parsed is refused before anything is written to it.
    fn append_record(&self, locked: &mut Locked, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let too_long = |what: &str, len: usize| {
            StoreError::InvalidArgument(format!("file store {what} of {len} bytes does not fit a u32 length"))
        };
        let key_len = u32::try_from(key.len()).map_err(|_| too_long("key", key.len()))?;
        let value_len = u32::try_from(value.len()).map_err(|_| too_long("value", value.len()))?;
        let mut record = Vec::with_capacity(8 + key.len() + value.len());
        record.extend_from_slice(&key_len.to_le_bytes());
        record.extend_from_slice(key);
        record.extend_from_slice(&value_len.to_le_bytes());
        record.extend_from_slice(value);
        locked.file.seek(SeekFrom::End(0)).map_err(|e| io_error(&self.path, "seek", e))?;
        locked.file.write_all(&record).map_err(|e| io_error(&self.path, "write", e))
    }

    /// PyTorch's `addHelper`: adds to a raw (unprefixed) key under the exclusive lock.
    fn add_raw(&self, key: &[u8], delta: i64) -> Result<i64, StoreError> {
        let mut cache = self.cache();
        let mut locked = self.open(true)?;
        self.refresh(&mut locked, &mut cache)?;
        let current = match cache.values.get(key) {
            None => 0,
            Some(value) if value.is_empty() => 0,
            Some(value) => parse_stoll(value).ok_or_else(|| {
                StoreError::InvalidArgument(format!(
                    "add on key '{}' whose value is not a decimal integer",
                    String::from_utf8_lossy(key)
                ))
            })?,
        };
        let sum = current.checked_add(delta).ok_or_else(|| {
            StoreError::InvalidArgument(format!(
                "add of {delta} to {current} on key '{}' overflows",
                String::from_utf8_lossy(key)
            ))
        })?;
        self.append_record(&mut locked, key, sum.to_string().as_bytes())?;
        Ok(sum)
    }

    /// Whether every key is present, after reading new records.
    fn check_regular(&self, keys: &[Vec<u8>]) -> Result<bool, StoreError> {
        let mut cache = self.cache();
        let mut locked = self.open(false)?;
        self.refresh(&mut locked, &mut cache)?;
        Ok(keys.iter().all(|key| cache.values.contains_key(key)))
    }

    /// Polls until every key exists or `timeout` passes.
    fn wait_regular(&self, keys: &[Vec<u8>], timeout: Duration) -> Result<(), StoreError> {
        let start = Instant::now();
        while !self.check_regular(keys)? {
            if !timeout.is_zero() && start.elapsed() > timeout {
                return Err(timed_out(keys, timeout));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        Ok(())
    }
}

/// The timeout error of a wait for `keys`.
fn timed_out(keys: &[Vec<u8>], timeout: Duration) -> StoreError {
    let keys = keys.iter().map(|key| String::from_utf8_lossy(key).into_owned()).collect();
    StoreError::Timeout { keys, timeout }
}

/// One length-prefixed field of a record at `at`: the bytes and the offset after them.
fn record_field(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let len_bytes: [u8; 4] = buf.get(at..at + 4)?.try_into().ok()?;
    let start = at + 4;
    let end = start.checked_add(u32::from_le_bytes(len_bytes) as usize)?;
    Some((buf.get(start..end)?, end))
}

fn regular(key: &str) -> Vec<u8> {
    format!("{REGULAR_PREFIX}{key}").into_bytes()
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let mut cache = self.cache();
        let mut locked = self.open(true)?;
        self.refresh(&mut locked, &mut cache)?;
        self.append_record(&mut locked, &regular(key), value)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let key = regular(key);
        self.wait_regular(std::slice::from_ref(&key), self.timeout())?;
        let mut cache = self.cache();
        let mut locked = self.open(false)?;
        self.refresh(&mut locked, &mut cache)?;
        cache.values.get(&key).cloned().ok_or_else(|| {
            StoreError::Other(format!("key '{}' was deleted while being read", String::from_utf8_lossy(&key)))
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.add_raw(&regular(key), delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        let key = regular(key);
        let mut cache = self.cache();
        let mut locked = self.open(true)?;
        self.refresh(&mut locked, &mut cache)?;
        match cache.values.get(&key) {
            None if expected.is_empty() => {
                self.append_record(&mut locked, &key, desired)?;
                Ok(desired.to_vec())
            }
            None => Ok(expected.to_vec()),
            Some(current) if current == expected => {
                self.append_record(&mut locked, &key, desired)?;
                Ok(desired.to_vec())
            }
            Some(current) => Ok(current.clone()),
        }
    }

    fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        self.check_regular(&keys.iter().map(|key| regular(key)).collect::<Vec<_>>())
    }

    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<(), StoreError> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|key| regular(key)).collect();
        match timeout {
            // A zero timeout for this call means "now", as in `HashStore`: the keys are checked once. (The store's
            // own timeout of zero means no timeout.)
            Some(now) if now.is_zero() => match self.check_regular(&keys)? {
                true => Ok(()),
                false => Err(timed_out(&keys, now)),
            },
            timeout => self.wait_regular(&keys, timeout.unwrap_or_else(|| self.timeout())),
        }
    }

    fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        let key = regular(key);
        let mut cache = self.cache();
        let mut locked = self.open(true)?;
        self.refresh(&mut locked, &mut cache)?;
        let existed = cache.values.contains_key(&key);
        let mut record_key = DELETE_PREFIX.as_bytes().to_vec();
        record_key.extend_from_slice(&key);
        self.append_record(&mut locked, &record_key, &[])?;
        Ok(existed)
    }

    /// Counts every key in the file, `refcount/` (and `cleanup/` once a handle has dropped) included, as
    /// PyTorch's does.
    fn num_keys(&self) -> Result<i64, StoreError> {
        let mut cache = self.cache();
        let mut locked = self.open(false)?;
        self.refresh(&mut locked, &mut cache)?;
        Ok(i64::try_from(cache.values.len()).unwrap_or(i64::MAX))
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let key = regular(key);
        let mut cache = self.cache();
        let mut locked = self.open(true)?;
        self.refresh(&mut locked, &mut cache)?;
        let mut joined = cache.values.get(&key).cloned().unwrap_or_default();
        joined.extend_from_slice(value);
        self.append_record(&mut locked, &key, &joined)
    }

    fn list_keys(&self) -> Result<Vec<String>, StoreError> {
        let mut cache = self.cache();
        let mut locked = self.open(false)?;
        self.refresh(&mut locked, &mut cache)?;
        let mut keys: Vec<String> = cache
            .values
            .keys()
            .filter_map(|key| key.strip_prefix(REGULAR_PREFIX.as_bytes()))
            .filter_map(|key| String::from_utf8(key.to_vec()).ok())
            .collect();
        keys.sort();
        Ok(keys)
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>, StoreError> {
        let clone = Self::new(self.path.clone(), self.num_workers)?;
        clone.set_timeout(self.timeout());
        Ok(Arc::new(clone))
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(PoisonError::into_inner) = timeout;
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        if !self.counted || !self.path.exists() {
            return;
        }
        let cleanup = || -> Result<(), StoreError> {
            let finished = self.add_raw(CLEANUP_KEY.as_bytes(), 1)?;
            let references = self.add_raw(REFCOUNT_KEY.as_bytes(), -1)?;
            if references == 0 && self.num_workers >= 0 && finished >= self.num_workers {
                // Best effort, as PyTorch: another process may have removed it already.
                let _ = std::fs::remove_file(&self.path);
            }
            Ok(())
        };
        if let Err(error) = cleanup() {
            tracing::warn!(path = %self.path.display(), %error, "file store cleanup failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pg-store-file-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    #[test]
    fn records_are_pytorchs_layout() {
        let path = temp_path("layout");
        let store = FileStore::new(&path, -1).unwrap();
        store.set("k", b"v").unwrap();
        store.delete_key("k").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let mut expected = Vec::new();
        for field in [&b"refcount/"[..], b"1", b"/k", b"v", b"-/k", b""] {
            expected.extend_from_slice(&(field.len() as u32).to_le_bytes());
            expected.extend_from_slice(field);
        }
        assert_eq!(bytes, expected);
        drop(store);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_truncated_record_is_a_typed_error() {
        let path = temp_path("truncated");
        std::fs::write(&path, [5, 0, 0, 0, b'a']).unwrap();
        let error = FileStore::new(&path, -1).unwrap_err();
        assert!(error.to_string().contains("truncated record at offset 0"), "{error}");
        let _ = std::fs::remove_file(&path);
    }

    /// A record of `key` and `value` in the file's layout.
    fn record(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for field in [key, value] {
            bytes.extend_from_slice(&(field.len() as u32).to_le_bytes());
            bytes.extend_from_slice(field);
        }
        bytes
    }

    #[test]
    fn a_failed_open_writes_nothing() {
        let path = temp_path("failed-open");
        let contents = record(b"refcount/", b"not a number");
        std::fs::write(&path, &contents).unwrap();
        let error = FileStore::new(&path, 1).unwrap_err();
        assert!(error.to_string().contains("not a decimal integer"), "{error}");
        assert_eq!(std::fs::read(&path).unwrap(), contents, "the failed open appended a record");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn every_write_refuses_a_file_it_cannot_parse() {
        let path = temp_path("garbage");
        let store = FileStore::new(&path, -1).unwrap();
        store.set("k", b"1").unwrap();
        // A truncated record appended behind the handle's back.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&[5, 0, 0, 0, b'a']).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        type Attempt<'a> = Box<dyn Fn() -> Result<(), StoreError> + 'a>;
        let writes: [(&str, Attempt<'_>); 6] = [
            ("set", Box::new(|| store.set("k", b"2"))),
            ("add", Box::new(|| store.add("n", 1).map(drop))),
            ("compare_set", Box::new(|| store.compare_set("k", b"1", b"3").map(drop))),
            ("delete_key", Box::new(|| store.delete_key("k").map(drop))),
            ("append", Box::new(|| store.append("k", b"4"))),
            ("multi_set", Box::new(|| store.multi_set(&["a", "b"], &[b"1", b"2"]))),
        ];
        for (name, write) in writes {
            let error = write().expect_err(name);
            assert!(error.to_string().contains("truncated record"), "{name}: {error}");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "{name} wrote to a file it cannot parse");
        }
        drop(store);
        let _ = std::fs::remove_file(&path);
    }
}
