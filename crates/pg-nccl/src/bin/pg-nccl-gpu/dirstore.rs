//! TEMPORARY: a directory-backed store for the GPU tests, until pg-store's TCP store (env://) is on main.
//!
//! Every key is a file named by the key's hex in one shared directory; `set` writes a temporary file and
//! renames it into place (atomic), `get`/`wait` poll, and `add` and `compare_set` serialise through a lock
//! file made with `create_new`. Good enough for a handful of local ranks; nothing else should use it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_core::store::{Store, StoreError};

#[derive(Debug)]
pub struct DirStore {
    dir: PathBuf,
    timeout: Mutex<Duration>,
}

impl DirStore {
    pub fn new(dir: &Path, timeout: Duration) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(|e| StoreError::Other(format!("{}: {e}", dir.display())))?;
        Ok(Self { dir: dir.to_path_buf(), timeout: Mutex::new(timeout) })
    }

    fn path(&self, key: &str) -> PathBuf {
        let name: String = key.bytes().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("k{name}"))
    }

    fn read(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match fs::read(self.path(key)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::Other(e.to_string())),
        }
    }

    fn write(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key);
        let tmp = path.with_extension(format!("tmp{}-{:?}", std::process::id(), std::thread::current().id()));
        fs::write(&tmp, value).map_err(|e| StoreError::Other(e.to_string()))?;
        fs::rename(&tmp, &path).map_err(|e| StoreError::Other(e.to_string()))
    }

    fn locked<T>(&self, body: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let lock = self.dir.join("lock");
        let deadline = Instant::now() + self.timeout();
        loop {
            match fs::OpenOptions::new().write(true).create_new(true).open(&lock) {
                Ok(_) => break,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(200)),
                Err(e) => return Err(StoreError::Other(format!("store lock: {e}"))),
            }
        }
        let result = body();
        let _ = fs::remove_file(&lock);
        result
    }
}

impl Store for DirStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.write(key, value)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.wait(&[key], None)?;
        self.read(key)?.ok_or_else(|| StoreError::Other(format!("{key} vanished")))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.locked(|| {
            let current = match self.read(key)? {
                Some(bytes) => String::from_utf8_lossy(&bytes)
                    .parse::<i64>()
                    .map_err(|e| StoreError::InvalidArgument(e.to_string()))?,
                None => 0,
            };
            let sum = current + delta;
            self.write(key, sum.to_string().as_bytes())?;
            Ok(sum)
        })
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.locked(|| match self.read(key)? {
            None if expected.is_empty() => {
                self.write(key, desired)?;
                Ok(desired.to_vec())
            }
            None => Ok(expected.to_vec()),
            Some(current) if current == expected => {
                self.write(key, desired)?;
                Ok(desired.to_vec())
            }
            Some(current) => Ok(current),
        })
    }

    fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        Ok(keys.iter().all(|key| self.path(key).exists()))
    }

    fn wait(&self, keys: &[&str], timeout: Option<Duration>) -> Result<(), StoreError> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let deadline = Instant::now() + timeout;
        while !self.check(keys)? {
            if Instant::now() > deadline {
                return Err(StoreError::Timeout { keys: keys.iter().map(|k| k.to_string()).collect(), timeout });
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        Ok(())
    }

    fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        Ok(fs::remove_file(self.path(key)).is_ok())
    }

    fn num_keys(&self) -> Result<i64, StoreError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| StoreError::Other(e.to_string()))?;
        Ok(entries.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with('k')).count() as i64)
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>, StoreError> {
        Ok(Arc::new(DirStore::new(&self.dir, self.timeout())?))
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = timeout;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_store(name: &str) -> DirStore {
        let dir = std::env::temp_dir().join(format!("pg-dirstore-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        DirStore::new(&dir, Duration::from_millis(200)).unwrap()
    }

    #[test]
    fn set_get_add_compare_set_and_timeout() {
        let store = temp_store("ops");
        store.set("smoke/0", b"id").unwrap();
        assert_eq!(store.get("smoke/0").unwrap(), b"id");
        assert!(store.check(&["smoke/0"]).unwrap());
        assert_eq!(store.add("n", 2).unwrap(), 2);
        assert_eq!(store.add("n", 3).unwrap(), 5);
        assert_eq!(store.compare_set("c", b"", b"x").unwrap(), b"x");
        assert_eq!(store.compare_set("c", b"y", b"z").unwrap(), b"x");
        let err = store.get("missing").unwrap_err();
        assert!(matches!(err, StoreError::Timeout { .. }), "{err}");
        assert!(store.delete_key("n").unwrap());
        let _ = fs::remove_dir_all(&store.dir);
    }

    #[test]
    fn another_handle_sees_the_keys() {
        let store = temp_store("clone");
        let other = store.clone_store().unwrap();
        store.set("k", b"v").unwrap();
        assert_eq!(other.get("k").unwrap(), b"v");
        let _ = fs::remove_dir_all(&store.dir);
    }
}
