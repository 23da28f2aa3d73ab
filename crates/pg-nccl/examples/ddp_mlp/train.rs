//! The data-parallel training step of the example, written once over a small [`Math`] abstraction: a 2-layer MLP
//! (`input -> hidden -> output`, relu, mean squared error) learns a fixed teacher network on synthetic data, with
//! its gradients all-reduced in DDP-style buckets while backward goes on.
//!
//! Every rank holds the whole model and takes its share of each global batch (rows `rank * b .. (rank + 1) * b`
//! with `b = batch / world`). Backward produces the second layer's gradients first: that bucket is all-reduced
//! (`Avg`) at once, asynchronously, while the first layer's gradients are computed; the optimizer waits on each
//! Work before it reads the bucket. With equal shares, the average over ranks of the per-rank mean gradients is
//! the global batch's mean gradient, so world N follows world 1's loss curve to float tolerance.

use pg_core::{Backend, Device as _, ProcessGroup, ReduceOp, Result, WorkHandle};

/// Device arithmetic on f32 arrays, what one training step needs. Matrices are row-major; a [`View`] is a
/// contiguous part of an array. An implementation orders everything it enqueues on the device's current stream,
/// so a collective enqueued after it sees its results, and it sees a collective's results after `wait()`.
pub trait Math {
    /// The backend whose process group reduces the gradients.
    type B: Backend;
    /// An f32 array on the device, with a pg buffer over the same memory.
    type Array;

    /// The device the arrays live on.
    fn device(&self) -> &<Self::B as Backend>::Device;
    /// A new array of `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Array>;
    /// Writes `data` (the array's length) into the array.
    fn upload(&self, array: &Self::Array, data: &[f32]) -> Result<()>;
    /// Reads the array back (waits for the work before it).
    fn download(&self, array: &Self::Array) -> Result<Vec<f32>>;
    /// `c = alpha * op(a) * op(b) + beta * c`, where `op(a)` is `m x k` and `op(b)` is `k x n`; `ta`/`tb`
    /// say the stored matrix is the transpose (`k x m`, `n x k`).
    fn gemm(
        &self,
        transposed: (bool, bool),
        dims: (usize, usize, usize),
        alpha: f32,
        a: View<'_, Self::Array>,
        b: View<'_, Self::Array>,
        beta: f32,
        c: View<'_, Self::Array>,
    ) -> Result<()>;
    /// `z[r][c] = f(z[r][c] + bias[c])` for a `rows x bias.len` matrix, `f` relu or the identity.
    fn bias_act(&self, z: View<'_, Self::Array>, bias: View<'_, Self::Array>, relu: bool) -> Result<()>;
    /// `grad[i] = 0` where `act[i] <= 0` (relu's backward, from its output).
    fn relu_backward(&self, grad: View<'_, Self::Array>, act: View<'_, Self::Array>) -> Result<()>;
    /// `grad[i] = scale * (y[i] - t[i])`, and `loss[0] += sum (y[i] - t[i])^2`.
    fn mse(
        &self,
        y: View<'_, Self::Array>,
        t: View<'_, Self::Array>,
        grad: View<'_, Self::Array>,
        loss: View<'_, Self::Array>,
        scale: f32,
    ) -> Result<()>;
    /// `param[i] -= lr * grad[i]`.
    fn sgd(&self, param: View<'_, Self::Array>, grad: View<'_, Self::Array>, lr: f32) -> Result<()>;
    /// The pg buffer over the array's memory.
    fn buffer<'a>(&self, array: &'a Self::Array) -> &'a <Self::B as Backend>::Buffer;
    /// Before a collective reads the array's buffer: makes the buffer hold the array's values (a no-op where
    /// they are the same memory).
    fn publish(&self, array: &Self::Array) -> Result<()>;
    /// After a collective's `wait()`: makes the array hold the buffer's values (a no-op where they are the same
    /// memory).
    fn collect(&self, array: &Self::Array) -> Result<()>;
}

/// `len` elements of an array from `offset`.
#[derive(Debug)]
pub struct View<'a, A> {
    pub array: &'a A,
    pub offset: usize,
    pub len: usize,
}

impl<A> Clone for View<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for View<'_, A> {}

/// The whole of `array`, `len` elements.
pub fn all<A>(array: &A, len: usize) -> View<'_, A> {
    View { array, offset: 0, len }
}

/// The model, the data and the optimizer.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub input: usize,
    pub hidden: usize,
    pub output: usize,
    /// The hidden width of the teacher network that makes the targets.
    pub teacher_hidden: usize,
    /// The global batch, split evenly between the ranks.
    pub batch: usize,
    pub steps: usize,
    pub lr: f32,
    pub seed: u64,
    /// Gradient buckets: 2 (one per layer, layer 2's all-reduced while layer 1's backward runs) or 1 (both
    /// layers in one all_reduce after backward).
    pub buckets: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            input: 64,
            hidden: 256,
            output: 16,
            teacher_hidden: 32,
            batch: 256,
            steps: 100,
            lr: 0.5,
            seed: 0,
            buckets: 2,
        }
    }
}

/// One step's global loss and time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRecord {
    pub step: usize,
    /// The mean squared error over the global batch, before the step's update.
    pub loss: f64,
    /// The step's time on the device's clock (virtual on the simulated backend), from before its batch's upload
    /// to after its loss reached the host (the synthetic data are made before the first step).
    pub ms: f64,
}

/// SplitMix64's output function: the generator under every random number here (a counter-based stream, so
/// any rank can produce any element without producing the ones before it).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in `[-1, 1)`, element `index` of stream `key` (24 bits, exact in f32).
pub fn uniform(seed: u64, key: u64, index: u64) -> f32 {
    let z =
        splitmix64(seed.wrapping_mul(0x100_0000_01B3).wrapping_add(key).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index);
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// The streams of [`uniform`]: weights of the student and the teacher, then one stream of inputs per step.
pub(crate) const KEY_W1: u64 = 1;
pub(crate) const KEY_W2: u64 = 2;
const KEY_TEACHER1: u64 = 3;
const KEY_TEACHER2: u64 = 4;
const KEY_INPUTS: u64 = 1 << 32;

/// `count` uniform numbers of stream `key` scaled by `scale`.
pub(crate) fn weights(config: &Config, key: u64, count: usize, scale: f32) -> Vec<f32> {
    (0..count as u64).map(|i| uniform(config.seed, key, i) * scale).collect()
}

/// The teacher network: `t = w2 * tanh(w1 * x)`, no biases.
pub(crate) struct Teacher {
    w1: Vec<f32>,
    w2: Vec<f32>,
}

impl Teacher {
    pub(crate) fn new(config: &Config) -> Self {
        let w1 =
            weights(config, KEY_TEACHER1, config.teacher_hidden * config.input, 3.0 / (config.input as f32).sqrt());
        let w2 = weights(
            config,
            KEY_TEACHER2,
            config.output * config.teacher_hidden,
            (3.0 / config.teacher_hidden as f32).sqrt(),
        );
        Self { w1, w2 }
    }

    /// The inputs and targets of global rows `rows` of step `step`.
    pub(crate) fn batch(&self, config: &Config, step: usize, rows: std::ops::Range<usize>) -> (Vec<f32>, Vec<f32>) {
        let (i, h, o) = (config.input, config.teacher_hidden, config.output);
        let key = KEY_INPUTS + step as u64;
        let mut x = Vec::with_capacity(rows.len() * i);
        let mut t = Vec::with_capacity(rows.len() * o);
        for row in rows {
            let xs: Vec<f32> = (0..i).map(|c| uniform(config.seed, key, (row * i + c) as u64)).collect();
            let hidden: Vec<f32> = (0..h)
                .map(|j| xs.iter().zip(&self.w1[j * i..(j + 1) * i]).map(|(a, b)| a * b).sum::<f32>().tanh())
                .collect();
            t.extend((0..o).map(|k| hidden.iter().zip(&self.w2[k * h..(k + 1) * h]).map(|(a, b)| a * b).sum::<f32>()));
            x.extend(xs);
        }
        (x, t)
    }
}

/// The model's arrays on one rank. Each layer's parameters are one array `[weight (out x in), bias (out)]`, and
/// its gradients one array per bucket ([`grad_place`]), each layer's in the layout of its parameters.
pub(crate) struct Model<A> {
    pub(crate) params: [A; 2],
    pub(crate) grads: Vec<A>,
    pub(crate) x: A,
    pub(crate) t: A,
    h: A,
    y: A,
    dy: A,
    dh: A,
    pub(crate) ones: A,
    pub(crate) loss: A,
}

impl<A> Model<A> {
    /// The arrays of a rank that takes `b` rows of each batch (parameters zero).
    pub(crate) fn new<M: Math<Array = A>>(math: &M, config: &Config, b: usize) -> Result<Self> {
        let (i, h, o) = (config.input, config.hidden, config.output);
        if !matches!(config.buckets, 1 | 2) {
            return Err(pg_core::Error::invalid(format!("{} gradient buckets: 1 or 2", config.buckets)));
        }
        let grads = match config.buckets {
            1 => vec![math.zeros(layer_len(config, 0) + layer_len(config, 1))?],
            _ => vec![math.zeros(layer_len(config, 0))?, math.zeros(layer_len(config, 1))?],
        };
        let model = Model {
            params: [math.zeros(layer_len(config, 0))?, math.zeros(layer_len(config, 1))?],
            grads,
            x: math.zeros(b * i)?,
            t: math.zeros(b * o)?,
            h: math.zeros(b * h)?,
            y: math.zeros(b * o)?,
            dy: math.zeros(b * o)?,
            dh: math.zeros(b * h)?,
            ones: math.zeros(b)?,
            loss: math.zeros(1)?,
        };
        math.upload(&model.ones, &vec![1.0; b])?;
        Ok(model)
    }
}

/// The length of layer `l`'s array (weight and bias).
pub(crate) fn layer_len(config: &Config, l: usize) -> usize {
    let (inputs, outputs) = dims(config, l);
    outputs * inputs + outputs
}

/// `(inputs, outputs)` of layer `l`.
pub(crate) fn dims(config: &Config, l: usize) -> (usize, usize) {
    if l == 0 {
        (config.input, config.hidden)
    } else {
        (config.hidden, config.output)
    }
}

/// The weight and bias views of a layer's array, from `offset`.
fn split<'a, A>(array: &'a A, offset: usize, (inputs, outputs): (usize, usize)) -> (View<'a, A>, View<'a, A>) {
    let weight = outputs * inputs;
    (View { array, offset, len: weight }, View { array, offset: offset + weight, len: outputs })
}

/// Where layer `l`'s gradients live: `(bucket, offset)`. Two buckets: one per layer. One bucket: layer 1's
/// gradients, then layer 2's.
fn grad_place(config: &Config, l: usize) -> (usize, usize) {
    match (config.buckets, l) {
        (1, 0) => (0, 0),
        (1, _) => (0, layer_len(config, 0)),
        _ => (l, 0),
    }
}

/// Waits for each bucket's all_reduce (`works`, in bucket order) and takes the SGD step of the layers it holds.
pub(crate) fn update<M: Math>(
    math: &M,
    config: &Config,
    model: &Model<M::Array>,
    works: &[WorkHandle<M::B>],
) -> Result<()> {
    for (bucket, work) in works.iter().enumerate() {
        work.wait()?;
        math.collect(&model.grads[bucket])?;
        for l in (0..2).filter(|&l| grad_place(config, l).0 == bucket) {
            let (len, offset) = (layer_len(config, l), grad_place(config, l).1);
            let grad = View { array: &model.grads[bucket], offset, len };
            math.sgd(all(&model.params[l], len), grad, config.lr)?;
        }
    }
    Ok(())
}

/// Rank 0 of `pg` initialises `model`'s parameters and broadcasts them to the other ranks, as DDP does at
/// construction.
pub(crate) fn init_params<M: Math>(
    math: &M,
    pg: &ProcessGroup<M::B>,
    config: &Config,
    model: &Model<M::Array>,
) -> Result<()> {
    if pg.rank() == 0 {
        for l in 0..2 {
            let (inputs, outputs) = dims(config, l);
            let key = if l == 0 { KEY_W1 } else { KEY_W2 };
            let mut values = weights(config, key, outputs * inputs, (6.0 / inputs as f32).sqrt() / 2.0);
            values.resize(layer_len(config, l), 0.0);
            math.upload(&model.params[l], &values)?;
        }
    }
    share_params(math, pg, model)
}

/// Every rank of `pg` takes rank 0's parameters (a broadcast of each layer's).
pub(crate) fn share_params<M: Math>(math: &M, pg: &ProcessGroup<M::B>, model: &Model<M::Array>) -> Result<()> {
    for params in &model.params {
        math.publish(params)?;
        pg.broadcast(math.buffer(params), 0)?.wait()?;
        math.collect(params)?;
    }
    Ok(())
}

/// Trains on `pg`'s ranks and returns the loss curve (the same on every rank). Rank 0 initialises the
/// parameters and broadcasts them, as DDP does at construction.
pub fn train<M: Math>(math: &M, pg: &ProcessGroup<M::B>, config: &Config) -> Result<Vec<StepRecord>> {
    let (rank, world) = (pg.rank(), pg.size());
    if config.batch == 0 || config.batch % world != 0 {
        return Err(pg_core::Error::invalid(format!(
            "a global batch of {} rows does not split evenly between {world} ranks",
            config.batch
        )));
    }
    let b = config.batch / world;
    let o = config.output;
    let model = Model::new(math, config, b)?;
    init_params(math, pg, config, &model)?;

    // The data of every step, made before the loop so that a step's time is the device's work and its upload.
    let teacher = Teacher::new(config);
    let batches: Vec<_> = (0..config.steps).map(|step| teacher.batch(config, step, rank * b..(rank + 1) * b)).collect();
    let device = math.device();
    let mut records = Vec::with_capacity(config.steps);
    for (step, (x, t)) in batches.iter().enumerate() {
        let start = device.now();
        math.upload(&model.x, x)?;
        math.upload(&model.t, t)?;
        math.upload(&model.loss, &[0.0])?;
        let works = step_on_device(math, pg, config, &model, b, (2.0 / (b * o) as f32, ReduceOp::Avg))?;
        update(math, config, &model, &works)?;
        let total = math.download(&model.loss)?[0] as f64;
        let ms = (device.now() - start).as_secs_f64() * 1e3;
        records.push(StepRecord { step, loss: total / (config.batch * o) as f64, ms });
    }
    Ok(records)
}

/// Forward, loss and backward of one step on `b` rows; returns the Works of the buckets (in bucket order) and
/// has all-reduced the loss (`Sum`, waited) into `model.loss`. The loss gradient is scaled by `reduce.0` and the
/// buckets reduced with `reduce.1`: `2 / (b * outputs)` and `Avg` when every rank has `b` rows (each rank's mean,
/// averaged), `2 / (batch * outputs)` and `Sum` when the shares differ (each rank's part of the global mean).
pub(crate) fn step_on_device<M: Math>(
    math: &M,
    pg: &ProcessGroup<M::B>,
    config: &Config,
    model: &Model<M::Array>,
    b: usize,
    reduce: (f32, ReduceOp),
) -> Result<Vec<WorkHandle<M::B>>> {
    let (i, h, o) = (config.input, config.hidden, config.output);
    let (w1, b1) = split(&model.params[0], 0, dims(config, 0));
    let (w2, b2) = split(&model.params[1], 0, dims(config, 1));
    let grads = |l: usize| {
        let (bucket, offset) = grad_place(config, l);
        split(&model.grads[bucket], offset, dims(config, l))
    };
    let (dw1, db1) = grads(0);
    let (dw2, db2) = grads(1);
    let (x, t, hv, y) = (all(&model.x, b * i), all(&model.t, b * o), all(&model.h, b * h), all(&model.y, b * o));
    let (dy, dh, ones) = (all(&model.dy, b * o), all(&model.dh, b * h), all(&model.ones, b));
    let loss = all(&model.loss, 1);

    // Forward: h = relu(x w1^T + b1), y = h w2^T + b2.
    math.gemm((false, true), (b, h, i), 1.0, x, w1, 0.0, hv)?;
    math.bias_act(hv, b1, true)?;
    math.gemm((false, true), (b, o, h), 1.0, hv, w2, 0.0, y)?;
    math.bias_act(y, b2, false)?;
    // The local mean's gradient; averaging over the ranks makes it the global mean's.
    math.mse(y, t, dy, loss, reduce.0)?;

    // Layer 2's gradients: dw2 = dy^T h, db2 = ones^T dy; with two buckets, all-reduced while the rest of
    // backward runs.
    math.gemm((true, false), (o, h, b), 1.0, dy, hv, 0.0, dw2)?;
    math.gemm((false, false), (1, o, b), 1.0, ones, dy, 0.0, db2)?;
    let second = match config.buckets {
        1 => None,
        _ => {
            math.publish(&model.grads[1])?;
            Some(pg.all_reduce(math.buffer(&model.grads[1]), reduce.1)?)
        }
    };

    // Layer 1's gradients: dh = (dy w2) * relu'(h), dw1 = dh^T x, db1 = ones^T dh; then bucket 0 (layer 1's, or
    // both layers' with one bucket).
    math.gemm((false, false), (b, h, o), 1.0, dy, w2, 0.0, dh)?;
    math.relu_backward(dh, hv)?;
    math.gemm((true, false), (h, i, b), 1.0, dh, x, 0.0, dw1)?;
    math.gemm((false, false), (1, h, b), 1.0, ones, dh, 0.0, db1)?;
    math.publish(&model.grads[0])?;
    let first = pg.all_reduce(math.buffer(&model.grads[0]), reduce.1)?;

    // The global loss, for the curve.
    math.publish(&model.loss)?;
    pg.all_reduce(math.buffer(&model.loss), ReduceOp::Sum)?.wait()?;
    math.collect(&model.loss)?;
    Ok([Some(first), second].into_iter().flatten().collect())
}
