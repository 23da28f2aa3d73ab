//! A group's liveness hold in the store ([`crate::Options::liveness`]): a dedicated store connection that says
//! "rank r of this group is alive" by setting `pg.live/{r}` under the group's store prefix, and the reads by which
//! the other ranks learn that a rank's connection closed (`pg.dead/{r}`, counted at `pg.deaths`), which pg's
//! TCP store server publishes ([`pg_store::liveness`]) and the simulated store models.
//!
//! A closed connection is unambiguous (the process ended, or was killed and the kernel closed its sockets), so a
//! live rank is never declared dead however long its kernels or paused threads take. A store that does not
//! publish deaths (PyTorch's server, a `FileStore`, a `HashStore`) never acknowledges the hold: the group logs it
//! once and runs as without liveness (a dead rank is then found by its communicators and timeouts).

use std::sync::Arc;
use std::time::Duration;

use pg_store::liveness::{dead_key, live_key, watched_key, DEATHS_KEY};
use pg_store::{Store, StoreError};

/// How often a group with liveness reads the store for deaths: its heartbeat monitor's poll (its watchdog's period,
/// when monitoring is off, if that is shorter).
pub(crate) const LIVENESS_POLL: Duration = Duration::from_millis(10);

/// The timeout of the hold's own connection.
const HOLD_TIMEOUT: Duration = Duration::from_secs(5);

/// This rank's hold: the dedicated connection and the live key it set. Dropping it deletes the key first, so a
/// group that ends on purpose is not declared dead when the connection closes.
pub(crate) struct Hold {
    conn: Arc<dyn Store>,
    /// The live key, until the hold is let go without deleting it (a test's stand-in for a killed process).
    key: Option<String>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold").field("key", &self.key).finish()
    }
}

impl Hold {
    /// Opens a connection of its own to `store` and holds `pg.live/{rank}` on it. `Ok(None)` when the store does
    /// not acknowledge the hold (it will publish no death): logged once, naming the group.
    pub(crate) fn register(store: &Arc<dyn Store>, rank: usize, group: &str) -> Result<Option<Hold>, StoreError> {
        let conn = store.clone_store()?;
        // The connection only sets, checks and deletes its key: a store that stops answering must not hold a
        // group's drop for the store's whole timeout.
        conn.set_timeout(HOLD_TIMEOUT);
        let name = rank.to_string();
        let key = live_key(&name);
        conn.set(&key, std::process::id().to_string().as_bytes())?;
        // Answered after the SET on the same connection: a server that registered the hold has set it by now.
        if conn.check(&[&watched_key(&name)])? {
            return Ok(Some(Hold { conn, key: Some(key) }));
        }
        let _ = conn.delete_key(&key);
        tracing::warn!(target: "pg", group, rank, prefix = %store.key_prefix(),
            "liveness is on but the store does not publish closed connections (not pg's TCP store server?): a dead \
             rank will be found by its communicators and timeouts, as without liveness");
        Ok(None)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        if let Err(error) = self.conn.delete_key(&key) {
            tracing::debug!(target: "pg", key, %error, "could not release the liveness hold");
        }
    }
}

/// The ranks of a group of `size` (other than `me`) whose liveness connection closed, ascending; one store read
/// when nobody died.
pub(crate) fn dead_ranks(store: &dyn Store, size: usize, me: usize) -> Result<Vec<usize>, StoreError> {
    if !store.check(&[DEATHS_KEY])? {
        return Ok(Vec::new());
    }
    let mut dead = Vec::new();
    for rank in (0..size).filter(|&rank| rank != me) {
        if store.check(&[&dead_key(&rank.to_string())])? {
            dead.push(rank);
        }
    }
    Ok(dead)
}

/// Whether `rank`'s liveness connection closed.
pub(crate) fn is_dead(store: &dyn Store, rank: usize) -> Result<bool, StoreError> {
    store.check(&[&dead_key(&rank.to_string())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use pg_store::{HashStore, PrefixStore, TcpStore};

    #[test]
    fn a_store_that_does_not_acknowledge_the_hold_gives_none_and_keeps_no_key() {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        let group: Arc<dyn Store> = Arc::new(PrefixStore::new("g", Arc::clone(&store)));
        assert!(Hold::register(&group, 1, "g").unwrap().is_none());
        assert!(!store.check(&["g/pg.live/1"]).unwrap());
    }

    #[test]
    fn a_hold_on_pgs_server_publishes_the_death_of_a_closed_connection_only() {
        let server = TcpStore::serve(0, Duration::from_secs(20)).unwrap();
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new("g", server.clone_store().unwrap()));
        let (staying, leaving) = (Hold::register(&store, 1, "g").unwrap(), Hold::register(&store, 2, "g").unwrap());
        assert!(staying.is_some() && leaving.is_some());
        drop(leaving);
        // The dying rank's connection closes without its key deleted, as a killed process's does.
        let mut dying = Hold::register(&store, 3, "g").unwrap().unwrap();
        dying.key = None;
        drop(dying);
        store.wait(&["pg.dead/3"], Some(Duration::from_secs(20))).unwrap();
        assert_eq!(dead_ranks(store.as_ref(), 4, 0).unwrap(), vec![3], "the one that left on purpose is not dead");
        assert!(!is_dead(store.as_ref(), 1).unwrap());
    }
}
