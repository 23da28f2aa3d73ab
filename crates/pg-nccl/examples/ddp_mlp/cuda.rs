//! The [`Math`] of a CUDA device: GEMMs through cuBLAS, the elementwise steps as hand-written PTX loaded by the
//! driver, on memory cudarc allocated and handed to pg zero copy (`Buffer::from_cuda_slice`), everything on one
//! cudarc stream that pg uses as its current stream.

use std::sync::Arc;

use pg_core::{Device as _, Error, Result};
use pg_nccl::pg_cuda::cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use pg_nccl::pg_cuda::cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use pg_nccl::pg_cuda::cudarc::nvrtc::Ptx;
use pg_nccl::{Buffer, Device, Nccl};

use crate::train::{Math, View};

/// The kernels: `mlp_bias_act(z, bias, n, cols, relu)`, `mlp_relu_backward(grad, act, n)`,
/// `mlp_mse(y, t, grad, loss, n, scale)` and `mlp_sgd(param, grad, n, lr)`, one thread per element.
/// PTX 7.0 for sm_75 runs on every later GPU through the driver's JIT; register names carry no `%`.
pub const PTX: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.visible .entry mlp_bias_act(.param .u64 p_z, .param .u64 p_bias, .param .u32 p_n, .param .u32 p_cols, .param .u32 p_relu)
{
    .reg .pred p, q;
    .reg .b32 r_tid, r_ntid, r_ctaid, i, n, cols, col, use_relu;
    .reg .b64 z, bias, off;
    .reg .f32 v, b;
    ld.param.u64 z, [p_z];
    ld.param.u64 bias, [p_bias];
    ld.param.u32 n, [p_n];
    ld.param.u32 cols, [p_cols];
    ld.param.u32 use_relu, [p_relu];
    mov.u32 r_tid, %tid.x;
    mov.u32 r_ntid, %ntid.x;
    mov.u32 r_ctaid, %ctaid.x;
    mad.lo.u32 i, r_ctaid, r_ntid, r_tid;
    setp.ge.u32 p, i, n;
    @p bra BIAS_ACT_DONE;
    cvta.to.global.u64 z, z;
    cvta.to.global.u64 bias, bias;
    rem.u32 col, i, cols;
    mul.wide.u32 off, i, 4;
    add.u64 z, z, off;
    mul.wide.u32 off, col, 4;
    add.u64 bias, bias, off;
    ld.global.f32 v, [z];
    ld.global.f32 b, [bias];
    add.f32 v, v, b;
    setp.ne.u32 q, use_relu, 0;
    @q max.f32 v, v, 0f00000000;
    st.global.f32 [z], v;
BIAS_ACT_DONE:
    ret;
}

.visible .entry mlp_relu_backward(.param .u64 p_grad, .param .u64 p_act, .param .u32 p_n)
{
    .reg .pred p, q;
    .reg .b32 r_tid, r_ntid, r_ctaid, i, n;
    .reg .b64 grad, act, off;
    .reg .f32 g, a;
    ld.param.u64 grad, [p_grad];
    ld.param.u64 act, [p_act];
    ld.param.u32 n, [p_n];
    mov.u32 r_tid, %tid.x;
    mov.u32 r_ntid, %ntid.x;
    mov.u32 r_ctaid, %ctaid.x;
    mad.lo.u32 i, r_ctaid, r_ntid, r_tid;
    setp.ge.u32 p, i, n;
    @p bra RELU_BACKWARD_DONE;
    cvta.to.global.u64 grad, grad;
    cvta.to.global.u64 act, act;
    mul.wide.u32 off, i, 4;
    add.u64 grad, grad, off;
    add.u64 act, act, off;
    ld.global.f32 g, [grad];
    ld.global.f32 a, [act];
    setp.gt.f32 q, a, 0f00000000;
    selp.f32 g, g, 0f00000000, q;
    st.global.f32 [grad], g;
RELU_BACKWARD_DONE:
    ret;
}

.visible .entry mlp_mse(.param .u64 p_y, .param .u64 p_t, .param .u64 p_grad, .param .u64 p_loss, .param .u32 p_n, .param .f32 p_scale)
{
    .reg .pred p;
    .reg .b32 r_tid, r_ntid, r_ctaid, i, n;
    .reg .b64 y, t, grad, loss, off;
    .reg .f32 vy, vt, d, g, sq, scale;
    ld.param.u64 y, [p_y];
    ld.param.u64 t, [p_t];
    ld.param.u64 grad, [p_grad];
    ld.param.u64 loss, [p_loss];
    ld.param.u32 n, [p_n];
    ld.param.f32 scale, [p_scale];
    mov.u32 r_tid, %tid.x;
    mov.u32 r_ntid, %ntid.x;
    mov.u32 r_ctaid, %ctaid.x;
    mad.lo.u32 i, r_ctaid, r_ntid, r_tid;
    setp.ge.u32 p, i, n;
    @p bra MSE_DONE;
    cvta.to.global.u64 y, y;
    cvta.to.global.u64 t, t;
    cvta.to.global.u64 grad, grad;
    cvta.to.global.u64 loss, loss;
    mul.wide.u32 off, i, 4;
    add.u64 y, y, off;
    add.u64 t, t, off;
    add.u64 grad, grad, off;
    ld.global.f32 vy, [y];
    ld.global.f32 vt, [t];
    sub.f32 d, vy, vt;
    mul.f32 g, d, scale;
    st.global.f32 [grad], g;
    mul.f32 sq, d, d;
    red.global.add.f32 [loss], sq;
MSE_DONE:
    ret;
}

.visible .entry mlp_sgd(.param .u64 p_param, .param .u64 p_grad, .param .u32 p_n, .param .f32 p_lr)
{
    .reg .pred p;
    .reg .b32 r_tid, r_ntid, r_ctaid, i, n;
    .reg .b64 pw, grad, off;
    .reg .f32 w, g, lr;
    ld.param.u64 pw, [p_param];
    ld.param.u64 grad, [p_grad];
    ld.param.u32 n, [p_n];
    ld.param.f32 lr, [p_lr];
    mov.u32 r_tid, %tid.x;
    mov.u32 r_ntid, %ntid.x;
    mov.u32 r_ctaid, %ctaid.x;
    mad.lo.u32 i, r_ctaid, r_ntid, r_tid;
    setp.ge.u32 p, i, n;
    @p bra SGD_DONE;
    cvta.to.global.u64 pw, pw;
    cvta.to.global.u64 grad, grad;
    mul.wide.u32 off, i, 4;
    add.u64 pw, pw, off;
    add.u64 grad, grad, off;
    ld.global.f32 w, [pw];
    ld.global.f32 g, [grad];
    neg.f32 lr, lr;
    fma.rn.f32 w, lr, g, w;
    st.global.f32 [pw], w;
SGD_DONE:
    ret;
}
"#;

/// The arguments of a column-major GEMM (cuBLAS's) that computes the row-major `C = op(A) op(B)` (`m x n`,
/// inner size `k`): a row-major matrix read column-major is its transpose, so it computes
/// `C^T = op(B)^T op(A)^T` with `B` as the first operand, `A` as the second and the sides swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnMajor {
    /// Whether the first (`B`) and second (`A`) operands are transposed.
    pub transposed: (bool, bool),
    /// `(m, n, k)` of the column-major call.
    pub dims: (usize, usize, usize),
    /// The leading dimensions of `B`, `A` and `C`.
    pub ld: (usize, usize, usize),
}

/// [`ColumnMajor`] for the row-major product with `ta`/`tb` (stored transposed) and sides `(m, n, k)`.
pub fn column_major((ta, tb): (bool, bool), (m, n, k): (usize, usize, usize)) -> ColumnMajor {
    ColumnMajor { transposed: (tb, ta), dims: (n, m, k), ld: (if tb { k } else { n }, if ta { m } else { k }, n) }
}

fn backend(what: &str) -> impl Fn(&dyn std::fmt::Display) -> Error + '_ {
    move |e| Error::Backend(format!("{what}: {e}"))
}

/// cuBLAS, the kernels and the stream of one GPU.
#[derive(Debug)]
pub struct CudaMath {
    device: Device,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    bias_act: CudaFunction,
    relu_backward: CudaFunction,
    mse: CudaFunction,
    sgd: CudaFunction,
}

/// A pg buffer over memory cudarc allocated; `ptr` is its first element.
#[derive(Debug)]
pub struct CudaArray {
    buffer: Buffer,
    ptr: u64,
}

impl CudaMath {
    /// Everything on a new stream of `ordinal`'s primary context (the one pg uses), made with cudarc.
    pub fn new(device: &Device) -> Result<(Self, pg_nccl::Stream)> {
        let ordinal = device.index();
        let ctx = CudaContext::new(ordinal).map_err(|e| backend("CudaContext::new")(&e))?;
        let stream = ctx.new_stream().map_err(|e| backend("new_stream")(&e))?;
        // SAFETY: only tries to open the library (cudarc's loader would panic where it is missing).
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(Error::Backend(
                "libcublas (libcublas.so.13 or .12) is not on the library path: add its directory to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let blas = CudaBlas::new(Arc::clone(&stream))
            .map_err(|e| backend("cublasCreate (is libcublas on the library path?)")(&e))?;
        let module = ctx.load_module(Ptx::from_src(PTX)).map_err(|e| backend("loading the MLP kernels")(&e))?;
        let function = |name: &str| module.load_function(name).map_err(|e| backend(name)(&e));
        let math = Self {
            device: device.clone(),
            stream: Arc::clone(&stream),
            blas,
            bias_act: function("mlp_bias_act")?,
            relu_backward: function("mlp_relu_backward")?,
            mse: function("mlp_mse")?,
            sgd: function("mlp_sgd")?,
        };
        let pg_stream = device.wrap_stream(stream)?;
        Ok((math, pg_stream))
    }

    fn at(view: &View<'_, CudaArray>) -> u64 {
        view.array.ptr + 4 * view.offset as u64
    }

    /// The element count as the kernels take it, and a launch of one thread per element (`None`: no elements).
    fn grid(n: usize) -> Result<(u32, Option<LaunchConfig>)> {
        let n32 = u32::try_from(n).map_err(|_| Error::invalid(format!("{n} elements for one kernel launch")))?;
        let config = LaunchConfig { grid_dim: (n32.div_ceil(256), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        Ok((n32, (n > 0).then_some(config)))
    }
}

/// Launches a kernel of this file's PTX on the math's stream with the arguments in its signature's order.
macro_rules! launch {
    ($math:expr, $function:ident, $config:expr, $($arg:expr),+) => {{
        let Some(config) = $config else { return Ok(()) };
        let mut builder = $math.stream.launch_builder(&$math.$function);
        $(builder.arg($arg);)+
        // SAFETY: the arguments match the kernel's PTX signature in order and type; every pointer is into a live
        // array of this context, and the kernel touches only elements below `n`, which the views hold.
        unsafe { builder.launch(config) }.map(drop).map_err(|e| backend(stringify!($function))(&e))
    }};
}

impl Math for CudaMath {
    type B = Nccl;
    type Array = CudaArray;

    fn device(&self) -> &Device {
        &self.device
    }

    fn zeros(&self, len: usize) -> Result<CudaArray> {
        let slice = self.stream.alloc_zeros::<f32>(len).map_err(|e| backend("alloc_zeros")(&e))?;
        let buffer = Buffer::from_cuda_slice(&self.device, slice)?;
        let ptr = buffer.cuda().ptr();
        Ok(CudaArray { buffer, ptr })
    }

    fn upload(&self, array: &CudaArray, data: &[f32]) -> Result<()> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.device.copy_from_host(&array.buffer, &bytes, &self.device.current_stream())
    }

    fn download(&self, array: &CudaArray) -> Result<Vec<f32>> {
        let bytes = self.device.copy_to_host(&array.buffer, &self.device.current_stream())?;
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    fn gemm(
        &self,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        a: View<'_, CudaArray>,
        b: View<'_, CudaArray>,
        beta: f32,
        c: View<'_, CudaArray>,
    ) -> Result<()> {
        if a.len < m * k || b.len < k * n || c.len < m * n {
            return Err(Error::invalid(format!(
                "a {m}x{k} by {k}x{n} product on views of {}, {} and {}",
                a.len, b.len, c.len
            )));
        }
        let int = |v: usize| i32::try_from(v).map_err(|_| Error::invalid(format!("a matrix side of {v}")));
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let call = column_major((ta, tb), (m, n, k));
        // SAFETY: the three views hold at least the elements the product reads and writes (checked above), in
        // arrays of this context that outlive the call; cuBLAS enqueues on the handle's stream.
        unsafe {
            blas::sgemm(
                *self.blas.handle(),
                op(call.transposed.0),
                op(call.transposed.1),
                int(call.dims.0)?,
                int(call.dims.1)?,
                int(call.dims.2)?,
                &alpha,
                Self::at(&b) as *const f32,
                int(call.ld.0)?,
                Self::at(&a) as *const f32,
                int(call.ld.1)?,
                &beta,
                Self::at(&c) as *mut f32,
                int(call.ld.2)?,
            )
        }
        .map_err(|e| backend("cublasSgemm")(&e))
    }

    fn bias_act(&self, z: View<'_, CudaArray>, bias: View<'_, CudaArray>, relu: bool) -> Result<()> {
        let (n, config) = Self::grid(z.len)?;
        let (cols, relu) = (bias.len as u32, u32::from(relu));
        if cols == 0 || z.len % bias.len != 0 {
            return Err(Error::invalid(format!("a bias of {} for {} elements", bias.len, z.len)));
        }
        let (zp, bp) = (Self::at(&z), Self::at(&bias));
        launch!(self, bias_act, config, &zp, &bp, &n, &cols, &relu)
    }

    fn relu_backward(&self, grad: View<'_, CudaArray>, act: View<'_, CudaArray>) -> Result<()> {
        let (n, config) = Self::grid(grad.len.min(act.len))?;
        let (gp, ap) = (Self::at(&grad), Self::at(&act));
        launch!(self, relu_backward, config, &gp, &ap, &n)
    }

    fn mse(
        &self,
        y: View<'_, CudaArray>,
        t: View<'_, CudaArray>,
        grad: View<'_, CudaArray>,
        loss: View<'_, CudaArray>,
        scale: f32,
    ) -> Result<()> {
        let (n, config) = Self::grid(y.len.min(t.len).min(grad.len))?;
        let (yp, tp, gp, lp) = (Self::at(&y), Self::at(&t), Self::at(&grad), Self::at(&loss));
        launch!(self, mse, config, &yp, &tp, &gp, &lp, &n, &scale)
    }

    fn sgd(&self, param: View<'_, CudaArray>, grad: View<'_, CudaArray>, lr: f32) -> Result<()> {
        let (n, config) = Self::grid(param.len.min(grad.len))?;
        let (pp, gp) = (Self::at(&param), Self::at(&grad));
        launch!(self, sgd, config, &pp, &gp, &n, &lr)
    }

    fn buffer<'a>(&self, array: &'a CudaArray) -> &'a Buffer {
        &array.buffer
    }

    fn publish(&self, _array: &CudaArray) -> Result<()> {
        Ok(())
    }

    fn collect(&self, _array: &CudaArray) -> Result<()> {
        Ok(())
    }
}
