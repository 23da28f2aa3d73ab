//! The two kernels pg needs, in hand-written PTX loaded through the driver (no toolkit at build or run time).

use std::sync::Arc;

use cudarc::driver::safe::CudaFunction;
use cudarc::driver::CudaContext;
use cudarc::nvrtc::Ptx;

use crate::error::{DriverContext, Result};

/// `pg_spin(u64 cycles)`: one thread reads `%clock64` until `cycles` ticks have passed (PyTorch's `_sleep`).
/// `pg_fill_b64(u64 ptr, u64 count, u64 pattern)`: a grid-stride loop storing `pattern` into `count` words.
///
/// PTX 7.0 for sm_75 runs on every later GPU through the driver's JIT. Register names carry no `%`, which
/// would clash with special registers such as `%tid`.
pub(crate) const PTX: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.visible .entry pg_spin(.param .u64 cycles)
{
    .reg .pred p;
    .reg .b64 t_start, t_now, t_elapsed, t_want;
    ld.param.u64 t_want, [cycles];
    mov.u64 t_start, %clock64;
SPIN:
    mov.u64 t_now, %clock64;
    sub.u64 t_elapsed, t_now, t_start;
    setp.lt.u64 p, t_elapsed, t_want;
    @p bra SPIN;
    ret;
}

.visible .entry pg_fill_b64(.param .u64 ptr, .param .u64 count, .param .u64 pattern)
{
    .reg .pred p;
    .reg .b32 r_tid, r_ntid, r_ctaid, r_nctaid;
    .reg .b64 base, n, value, i, stride, offset, address, tid64;
    ld.param.u64 base, [ptr];
    ld.param.u64 n, [count];
    ld.param.u64 value, [pattern];
    cvta.to.global.u64 base, base;
    mov.u32 r_tid, %tid.x;
    mov.u32 r_ntid, %ntid.x;
    mov.u32 r_ctaid, %ctaid.x;
    mov.u32 r_nctaid, %nctaid.x;
    mul.wide.u32 i, r_ctaid, r_ntid;
    cvt.u64.u32 tid64, r_tid;
    add.u64 i, i, tid64;
    mul.wide.u32 stride, r_nctaid, r_ntid;
LOOP:
    setp.ge.u64 p, i, n;
    @p bra DONE;
    shl.b64 offset, i, 3;
    add.u64 address, base, offset;
    st.global.u64 [address], value;
    add.u64 i, i, stride;
    bra LOOP;
DONE:
    ret;
}
"#;

/// The loaded kernels of one device.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub(crate) spin: CudaFunction,
    pub(crate) fill64: CudaFunction,
}

impl Kernels {
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let module = ctx.load_module(Ptx::from_src(PTX)).during("cuModuleLoadData(pg kernels)")?;
        Ok(Self {
            spin: module.load_function("pg_spin").during("cuModuleGetFunction(pg_spin)")?,
            fill64: module.load_function("pg_fill_b64").during("cuModuleGetFunction(pg_fill_b64)")?,
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ptx_declares_both_entries() {
        assert!(super::PTX.contains(".visible .entry pg_spin(.param .u64 cycles)"));
        assert!(super::PTX.contains(".visible .entry pg_fill_b64("));
    }

    #[test]
    fn ptx_declares_no_register_named_like_a_special_register() {
        for line in super::PTX.lines().filter(|l| l.trim_start().starts_with(".reg")) {
            assert!(!line.contains('%'), "a declared register clashes with PTX's %-names: {line}");
        }
    }
}
