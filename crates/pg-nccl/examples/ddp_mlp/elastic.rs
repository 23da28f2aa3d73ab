//! Elastic training: the example's loop going on after a rank is lost, in the same processes. Each step starts
//! from a copy of the parameters on the host; when the group was revoked during a step (the watchdog revokes it
//! on a dead peer, `Options::revoke_on_error`), the survivors agree on who is left, shrink the group to them, put
//! the parameters back, and run the step again over the new world. The global batch stays the same and is
//! redistributed: rank r of w takes rows `r * batch / w .. (r + 1) * batch / w` (shares may differ by one row),
//! each rank scales its loss gradient by `1 / batch` and the buckets are summed, so the gradient is the global
//! batch's mean at any world size and the loss curve continues as world 1's.
//!
//! With a rejoin step, the dead rank's replacement comes back: its thread (on NCCL its process) plays a new process
//! that joins with `ProcessGroup::join_grown`, knowing only the world's store, its rank and the size, while the
//! survivors grow the group back at that step's start (`ProcessGroup::grow`); rank 0 broadcasts the parameters and
//! the global batch is spread over the grown world again.

use std::sync::Arc;
use std::time::Duration;

use pg_core::{AgreeOptions, Device as _, GrowOptions, ProcessGroup, ReduceOp, Result, ShrinkOptions};

use crate::train::{init_params, share_params, step_on_device, update, Config, Math, Model, StepRecord, Teacher};

/// How long the replacement waits for the survivors' grow: they detect the death, agree, shrink and train on
/// until the rejoin step first.
const REJOIN_TIMEOUT: Duration = Duration::from_secs(600);

/// What the elastic loop is told.
#[derive(Debug, Clone, Copy)]
pub struct Elastic {
    /// How long survivors wait for each other in the agreement.
    pub agree_timeout: Duration,
    /// The world rank that dies, and the step at whose start it does (the dying rank's loop returns there).
    pub death: Option<(usize, usize)>,
    /// The step at whose start the dead rank's replacement joins and the survivors grow the group back (`None`: it
    /// stays dead).
    pub rejoin: Option<usize>,
}

/// One recovery: at which step, from and to which world size, and its host times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recovery {
    pub step: usize,
    pub from: usize,
    pub to: usize,
    /// From the failed step's start until the group was found revoked (the peer's death detected).
    pub detect_ms: f64,
    /// From then until the shrunk group and the restored parameters were ready.
    pub recover_ms: f64,
}

/// One grow: at which step, from and to which world size, and its host time (the grow, the new rank's
/// parameters and the redistributed batch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Growth {
    pub step: usize,
    pub from: usize,
    pub to: usize,
    pub ms: f64,
}

/// This rank's run: its curve, the recoveries and grows it went through, and whether it was the rank that died
/// (whose replacement's steps, when it rejoined, follow its own in `records`).
#[derive(Debug, Clone, Default)]
pub struct ElasticRun {
    pub records: Vec<StepRecord>,
    pub recoveries: Vec<Recovery>,
    pub growths: Vec<Growth>,
    pub died: bool,
}

/// Rows `start..end` of the global batch for rank `rank` of `world`.
pub fn rows(batch: usize, rank: usize, world: usize) -> std::ops::Range<usize> {
    rank * batch / world..(rank + 1) * batch / world
}

/// Trains on `pg`'s ranks, going on over the survivors when ranks are lost (see the module's docs). `pg` must
/// revoke on a failed peer (`Options::revoke_on_error`) with an op timeout that bounds detection.
pub fn train_elastic<M: Math>(
    math: &M,
    pg: &ProcessGroup<M::B>,
    config: &Config,
    elastic: &Elastic,
) -> Result<ElasticRun> {
    if config.batch < pg.size() {
        return Err(pg_core::Error::invalid(format!(
            "a global batch of {} rows cannot give each of {} ranks a row",
            config.batch,
            pg.size()
        )));
    }
    let me = pg.rank();
    let mut group = pg.clone();
    let mut model = Model::new(math, config, rows(config.batch, group.rank(), group.size()).len())?;
    init_params(math, &group, config, &model)?;
    let teacher = Teacher::new(config);
    let device = math.device();
    let mut run = ElasticRun::default();
    let mut step = 0;
    if elastic.rejoin.is_some_and(|at| elastic.death.is_none_or(|(_, death)| at <= death)) {
        return Err(pg_core::Error::invalid(format!(
            "a rejoin at step {:?} needs a death before it (death {:?})",
            elastic.rejoin, elastic.death
        )));
    }
    while step < config.steps {
        if elastic.death == Some((me, step)) {
            run.died = true;
            // Nothing of the dead process runs on: its group's threads stop (its watchdog would otherwise answer
            // for it in the survivors' agreement).
            group.abort("this rank's process died");
            let Some(at) = elastic.rejoin else { return Ok(run) };
            // This rank's process is gone. Its thread plays the replacement: a new process on the same device, which
            // knows the world's store, its rank (the last) and the size, and joins when the survivors grow back.
            let mut options = pg.options().clone();
            options.timeout = REJOIN_TIMEOUT;
            let (rank, size) = (pg.size() - 1, pg.size());
            group = ProcessGroup::join_grown(Arc::clone(pg.store()), rank, size, device.clone(), options)?;
            group.set_timeout(pg.options().timeout);
            model = Model::new(math, config, rows(config.batch, group.rank(), group.size()).len())?;
            share_params(math, &group, &model)?;
            step = at;
            continue;
        }
        if elastic.rejoin == Some(step) && group.size() < pg.size() {
            let (start, from) = (device.now(), group.size());
            let checkpoint = [math.download(&model.params[0])?, math.download(&model.params[1])?];
            group = group.grow(pg.size() - from, &GrowOptions::default())?;
            model = Model::new(math, config, rows(config.batch, group.rank(), group.size()).len())?;
            for (params, values) in model.params.iter().zip(&checkpoint) {
                math.upload(params, values)?;
            }
            share_params(math, &group, &model)?;
            let ms = (device.now() - start).as_secs_f64() * 1e3;
            run.growths.push(Growth { step, from, to: group.size(), ms });
        }
        let checkpoint = [math.download(&model.params[0])?, math.download(&model.params[1])?];
        let (x, t) = teacher.batch(config, step, rows(config.batch, group.rank(), group.size()));
        let start = device.now();
        let outcome = one_step(math, &group, config, &model, (&x, &t));
        match outcome {
            Ok(loss) if !group.is_revoked() => {
                let ms = (device.now() - start).as_secs_f64() * 1e3;
                run.records.push(StepRecord { step, loss, ms });
                step += 1;
            }
            Err(error) if !group.is_revoked() => return Err(error),
            _ => {
                let detected = device.now();
                let survivors = group
                    .agree_survivors(&AgreeOptions { timeout: elastic.agree_timeout, ..AgreeOptions::default() })?;
                let shrunk = group.shrink(&survivors.excluded, &ShrinkOptions::default())?;
                let from = group.size();
                group = shrunk;
                model = Model::new(math, config, rows(config.batch, group.rank(), group.size()).len())?;
                for (params, values) in model.params.iter().zip(&checkpoint) {
                    math.upload(params, values)?;
                }
                let ready = device.now();
                run.recoveries.push(Recovery {
                    step,
                    from,
                    to: group.size(),
                    detect_ms: (detected - start).as_secs_f64() * 1e3,
                    recover_ms: (ready - detected).as_secs_f64() * 1e3,
                });
            }
        }
    }
    group.barrier()?.wait()?;
    Ok(run)
}

/// One step over `group` with this rank's rows `(x, t)`: the global loss.
fn one_step<M: Math>(
    math: &M,
    group: &ProcessGroup<M::B>,
    config: &Config,
    model: &Model<M::Array>,
    (x, t): (&[f32], &[f32]),
) -> Result<f64> {
    let o = config.output;
    let b = x.len() / config.input;
    math.upload(&model.x, x)?;
    math.upload(&model.t, t)?;
    math.upload(&model.loss, &[0.0])?;
    let reduce = (2.0 / (config.batch * o) as f32, ReduceOp::Sum);
    let works = step_on_device(math, group, config, model, b, reduce)?;
    update(math, config, model, &works)?;
    let total = math.download(&model.loss)?[0] as f64;
    Ok(total / (config.batch * o) as f64)
}
