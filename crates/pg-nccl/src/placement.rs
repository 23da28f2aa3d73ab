//! Where the rank processes of a job on one machine run: rank `r` on GPU `r % gpus`. When a GPU holds more
//! than one rank, each rank poses to NCCL as a host of its own (`NCCL_HOSTID`), since NCCL refuses two ranks of
//! one communicator on one GPU of one host; NCCL then links the ranks with its network (socket) transport over
//! the loopback interface: the transport of multi-node jobs, so any world size runs (and rehearses a
//! multi-node job) on one GPU.

/// Where one rank runs and the environment its process needs beside torchrun's `RANK`, `WORLD_SIZE`,
/// `MASTER_ADDR` and `MASTER_PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The GPU (device ordinal) the rank uses; also its `LOCAL_RANK`.
    pub gpu: usize,
    /// Variables to set in the rank's process: `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, and with several ranks on a
    /// GPU `NCCL_HOSTID` (one per rank), `NCCL_SOCKET_IFNAME=lo` and `NCCL_IB_DISABLE=1` (the last two only
    /// where the launcher's environment does not set them).
    pub env: Vec<(&'static str, String)>,
}

/// Whether `nproc` ranks on `gpus` GPUs put more than one rank on a GPU (and so use the network transport).
pub fn shares_gpus(nproc: usize, gpus: usize) -> bool {
    nproc > gpus.max(1)
}

/// Where rank `rank` of `nproc` runs on a machine with `gpus` GPUs (at least one).
pub fn place(rank: usize, nproc: usize, gpus: usize) -> Placement {
    let gpus = gpus.max(1);
    let gpu = rank % gpus;
    let mut env = vec![("LOCAL_RANK", gpu.to_string()), ("LOCAL_WORLD_SIZE", nproc.min(gpus).to_string())];
    if shares_gpus(nproc, gpus) {
        env.push(("NCCL_HOSTID", format!("pg-rank-host-{rank}")));
        for (name, value) in [("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1")] {
            if std::env::var_os(name).is_none() {
                env.push((name, value.to_owned()));
            }
        }
    }
    Placement { gpu, env }
}

/// For a rank that another launcher placed (torchrun: `RANK`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`): its GPU,
/// `LOCAL_RANK % gpus`, and, when the launcher put more local ranks than GPUs on this machine, the variables that
/// make it a host of its own to NCCL: `NCCL_HOSTID` = the launcher's (one per node, or `pg-node` when unset) with
/// `-rank-{rank}` appended, and `NCCL_SOCKET_IFNAME=lo`, `NCCL_IB_DISABLE=1` where `env` does not set them. The
/// variables are empty when nothing needs to change, so that a process can set them and start itself again
/// (they are read by NCCL at its initialisation) without doing so twice.
pub fn place_launched(
    rank: usize,
    local_rank: usize,
    local_world_size: usize,
    gpus: usize,
    env: &dyn Fn(&str) -> Option<String>,
) -> Placement {
    let gpus = gpus.max(1);
    let gpu = local_rank % gpus;
    let mut vars = Vec::new();
    let suffix = format!("-rank-{rank}");
    let host_id = env("NCCL_HOSTID");
    if shares_gpus(local_world_size, gpus) && !host_id.as_deref().is_some_and(|id| id.ends_with(&suffix)) {
        vars.push(("NCCL_HOSTID", format!("{}{suffix}", host_id.as_deref().unwrap_or("pg-node"))));
        for (name, value) in [("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1")] {
            if env(name).is_none() {
                vars.push((name, value.to_owned()));
            }
        }
    }
    Placement { gpu, env: vars }
}

/// How a job of `nproc` ranks on `gpus` GPUs is laid out, for result files: "4 ranks on 1 GPU, network
/// transport (loopback sockets)" or "2 ranks on 2 GPUs, one rank per GPU".
pub fn describe(nproc: usize, gpus: usize) -> String {
    let used = nproc.min(gpus.max(1));
    let ranks = if nproc == 1 { "1 rank".to_owned() } else { format!("{nproc} ranks") };
    let on = if used == 1 { "1 GPU".to_owned() } else { format!("{used} GPUs") };
    match shares_gpus(nproc, gpus) {
        true => format!("{ranks} on {on}, network transport (NCCL_HOSTID per rank, loopback sockets)"),
        false => format!("{ranks} on {on}, one rank per GPU"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value<'a>(placement: &'a Placement, name: &str) -> Option<&'a str> {
        placement.env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn one_rank_per_gpu_needs_no_host_ids() {
        for rank in 0..4 {
            let placement = place(rank, 4, 4);
            assert_eq!(placement.gpu, rank);
            assert_eq!(value(&placement, "LOCAL_RANK"), Some(rank.to_string().as_str()));
            assert_eq!(value(&placement, "NCCL_HOSTID"), None);
        }
        assert_eq!(describe(2, 2), "2 ranks on 2 GPUs, one rank per GPU");
    }

    #[test]
    fn ranks_beyond_the_gpus_wrap_around_each_with_its_own_host_id() {
        let placements: Vec<Placement> = (0..8).map(|rank| place(rank, 8, 2)).collect();
        let gpus: Vec<usize> = placements.iter().map(|p| p.gpu).collect();
        assert_eq!(gpus, [0, 1, 0, 1, 0, 1, 0, 1]);
        let mut ids: Vec<&str> = placements.iter().filter_map(|p| value(p, "NCCL_HOSTID")).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 8, "every rank is a host of its own");
        assert!(describe(8, 1).starts_with("8 ranks on 1 GPU, network transport"));
        assert!(describe(3, 2).starts_with("3 ranks on 2 GPUs, network transport"));
    }

    #[test]
    fn ranks_torchrun_put_on_one_gpu_get_a_host_id_each_once() {
        let vars = |pairs: &[(&str, &str)]| {
            let map: std::collections::HashMap<String, String> =
                pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            move |name: &str| map.get(name).cloned()
        };
        // Two local ranks of node 1 on one GPU: both on GPU 0, each its own host id under the node's.
        let node = vars(&[("NCCL_HOSTID", "torchrun-node-1")]);
        let placement = place_launched(3, 1, 2, 1, &node);
        assert_eq!(placement.gpu, 0);
        assert_eq!(value(&placement, "NCCL_HOSTID"), Some("torchrun-node-1-rank-3"));
        assert_eq!(value(&placement, "NCCL_SOCKET_IFNAME"), Some("lo"));
        // Started again with those variables: nothing more to change.
        let again = vars(&[("NCCL_HOSTID", "torchrun-node-1-rank-3"), ("NCCL_SOCKET_IFNAME", "lo")]);
        assert!(place_launched(3, 1, 2, 1, &again).env.is_empty());
        // One local rank per GPU: the launcher's host id stands (NVLink within the node).
        let placement = place_launched(3, 1, 2, 2, &node);
        assert_eq!(placement.gpu, 1);
        assert!(placement.env.is_empty());
        assert_eq!(value(&place_launched(0, 0, 4, 1, &vars(&[])), "NCCL_HOSTID"), Some("pg-node-rank-0"));
    }

    #[test]
    fn no_gpu_count_is_taken_as_one() {
        assert_eq!(place(5, 6, 0).gpu, 0);
        assert!(shares_gpus(2, 0));
    }
}
