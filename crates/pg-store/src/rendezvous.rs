//! Rendezvous from a URL, as `torch.distributed.rendezvous` does: `env://` (torchrun's variables),
//! `tcp://host:port?rank=R&world_size=N` and `file:///path?rank=R&world_size=N`.
//!
//! For `env://` and `tcp://`, rank 0 hosts the TCP store server in-process and every rank connects to it,
//! unless torchrun's agent hosts it (`TORCHELASTIC_USE_AGENT_STORE=True`): then every rank is a client of it, with
//! no prefix, as PyTorch's ranks (torchrun makes a new store for each restart).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::{FileStore, Store, StoreError, TcpStore, TcpStoreOptions};

/// What a rendezvous gives a rank.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    /// The store shared by the job.
    pub store: Arc<dyn Store>,
    /// This process's rank.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// `LOCAL_RANK`, the device index torchrun assigns, when set.
    pub local_rank: Option<usize>,
}

/// `env://` rendezvous with the process's environment.
pub fn env_rendezvous(timeout: Duration) -> Result<Rendezvous, StoreError> {
    rendezvous("env://", timeout)
}

/// Rendezvous on `url` with the process's environment.
pub fn rendezvous(url: &str, timeout: Duration) -> Result<Rendezvous, StoreError> {
    rendezvous_with(url, timeout, &|name| std::env::var(name).ok())
}

/// Rendezvous on `url`, reading variables through `env` (tests pass a map instead of the real environment).
pub fn rendezvous_with(
    url: &str,
    timeout: Duration,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Rendezvous, StoreError> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| invalid("url", url, "expected scheme://..."))?;
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let query: HashMap<&str, &str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .collect();
    let local_rank = env("LOCAL_RANK").map(|value| parse::<usize>("LOCAL_RANK", &value)).transpose()?;
    match scheme {
        "env" => {
            let rank = from_query_or_env(&query, "rank", "RANK", env)?;
            let world_size = from_query_or_env(&query, "world_size", "WORLD_SIZE", env)?;
            let addr = env("MASTER_ADDR").ok_or(StoreError::MissingEnv("MASTER_ADDR"))?;
            let port = env("MASTER_PORT").ok_or(StoreError::MissingEnv("MASTER_PORT"))?;
            let port = parse_port("MASTER_PORT", &port)?;
            let store = tcp_store(&addr, port, rank, world_size, timeout, env)?;
            Ok(Rendezvous { store, rank, world_size, local_rank })
        }
        "tcp" => {
            let (host, port) = location
                .rsplit_once(':')
                .filter(|(_, port)| !port.is_empty())
                .ok_or_else(|| invalid("url", url, "port number missing"))?;
            let port = parse_port("port", port.trim_end_matches('/'))?;
            let rank = query.get("rank").ok_or_else(|| invalid("url", url, "rank parameter missing"))?;
            let world_size =
                query.get("world_size").ok_or_else(|| invalid("url", url, "world size parameter missing"))?;
            let (rank, world_size) = check_rank(parse("rank", rank)?, parse("world_size", world_size)?)?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let store = tcp_store(host, port, rank, world_size, timeout, env)?;
            Ok(Rendezvous { store, rank, world_size, local_rank })
        }
        "file" => {
            let rank = query.get("rank").ok_or_else(|| invalid("url", url, "rank parameter missing"))?;
            let world_size =
                query.get("world_size").ok_or_else(|| invalid("url", url, "world size parameter missing"))?;
            let (rank, world_size) = check_rank(parse("rank", rank)?, parse("world_size", world_size)?)?;
            if location.is_empty() {
                return Err(invalid("url", url, "file path missing"));
            }
            // `check_rank` refused world sizes beyond i64.
            let store = FileStore::new(location, i64::try_from(world_size).unwrap_or(i64::MAX))?;
            store.set_timeout(timeout);
            Ok(Rendezvous { store: Arc::new(store), rank, world_size, local_rank })
        }
        other => Err(invalid("url", url, &format!("no rendezvous handler for {other}://"))),
    }
}

fn invalid(name: &str, value: &str, reason: &str) -> StoreError {
    StoreError::InvalidEnv { name: name.into(), value: value.into(), reason: reason.into() }
}

fn parse<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, StoreError> {
    value.trim().parse().map_err(|_| invalid(name, value, "not a non-negative integer"))
}

fn parse_port(name: &str, value: &str) -> Result<u16, StoreError> {
    value.trim().parse::<u16>().map_err(|_| invalid(name, value, "port must be an integer in 0..=65535"))
}

fn check_rank(rank: usize, world_size: usize) -> Result<(usize, usize), StoreError> {
    if world_size == 0 {
        return Err(invalid("world_size", "0", "must be at least 1"));
    }
    if i64::try_from(world_size).is_err() {
        // The stores count workers in an i64 (the TCP store's `init/`, the file store's cleanup count).
        let reason = format!("must be at most {} (i64::MAX, the stores' worker counters)", i64::MAX);
        return Err(invalid("world_size", &world_size.to_string(), &reason));
    }
    if rank >= world_size {
        return Err(invalid("rank", &rank.to_string(), &format!("must be below world_size {world_size}")));
    }
    Ok((rank, world_size))
}

fn from_query_or_env(
    query: &HashMap<&str, &str>,
    param: &str,
    var: &'static str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<usize, StoreError> {
    match query.get(param) {
        Some(value) => parse(param, value),
        None => parse(var, &env(var).ok_or(StoreError::MissingEnv(var))?),
    }
    .and_then(|value| match var {
        "RANK" => Ok(value),
        _ => check_rank(0, value).map(|(_, world)| world),
    })
}

/// PyTorch's `_create_c10d_store`: the agent's store under the attempt prefix, or rank 0 hosting.
fn tcp_store(
    host: &str,
    port: u16,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Store>, StoreError> {
    check_rank(rank, world_size)?;
    let options = TcpStoreOptions { port, num_workers: Some(world_size), timeout, ..TcpStoreOptions::default() };
    if env("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True") {
        // PyTorch's ranks use the agent's store as it is: torchrun makes a new one for each restart.
        return Ok(Arc::new(TcpStore::new(host, TcpStoreOptions { is_server: false, ..options })?));
    }
    // Like PyTorch, rank 0 shares a server this process already runs on the port (`multi_tenant=True`).
    Ok(Arc::new(TcpStore::new(host, TcpStoreOptions { is_server: rank == 0, multi_tenant: true, ..options })?))
}
