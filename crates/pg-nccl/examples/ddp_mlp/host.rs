//! The [`Math`] of the simulated backend: plain f32 arithmetic on the host, each array beside a mock buffer of
//! the same length that the collectives move (the mock holds real data, so the reduced values are real).

use std::cell::RefCell;

use pg_core::{DType, Device as _, Result};
use pg_mock::{Mock, MockBuffer, MockDevice};

use crate::train::{Math, View};

/// Host arithmetic for one rank of a simulated world (one thread).
#[derive(Debug)]
pub struct HostMath {
    device: MockDevice,
}

impl HostMath {
    pub fn new(device: MockDevice) -> Self {
        Self { device }
    }
}

/// A host array and the mock buffer the collectives use.
#[derive(Debug)]
pub struct HostArray {
    data: RefCell<Vec<f32>>,
    buffer: MockBuffer,
}

fn read<'a>(view: &View<'a, HostArray>) -> std::cell::Ref<'a, [f32]> {
    std::cell::Ref::map(view.array.data.borrow(), |d| &d[view.offset..view.offset + view.len])
}

fn write<'a>(view: &View<'a, HostArray>) -> std::cell::RefMut<'a, [f32]> {
    std::cell::RefMut::map(view.array.data.borrow_mut(), |d| &mut d[view.offset..view.offset + view.len])
}

fn to_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Math for HostMath {
    type B = Mock;
    type Array = HostArray;

    fn device(&self) -> &MockDevice {
        &self.device
    }

    fn zeros(&self, len: usize) -> Result<HostArray> {
        Ok(HostArray { data: RefCell::new(vec![0.0; len]), buffer: self.device.alloc(DType::F32, len)? })
    }

    fn upload(&self, array: &HostArray, data: &[f32]) -> Result<()> {
        let mut values = array.data.borrow_mut();
        if values.len() != data.len() {
            return Err(pg_core::Error::invalid(format!("{} values for an array of {}", data.len(), values.len())));
        }
        values.copy_from_slice(data);
        Ok(())
    }

    fn download(&self, array: &HostArray) -> Result<Vec<f32>> {
        Ok(array.data.borrow().clone())
    }

    fn gemm(
        &self,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        a: View<'_, HostArray>,
        b: View<'_, HostArray>,
        beta: f32,
        c: View<'_, HostArray>,
    ) -> Result<()> {
        let (a, b) = (read(&a), read(&b));
        let mut c = write(&c);
        for row in 0..m {
            for col in 0..n {
                let mut sum = 0.0f32;
                for p in 0..k {
                    let x = if ta { a[p * m + row] } else { a[row * k + p] };
                    let y = if tb { b[col * k + p] } else { b[p * n + col] };
                    sum += x * y;
                }
                let out = &mut c[row * n + col];
                *out = alpha * sum + if beta == 0.0 { 0.0 } else { beta * *out };
            }
        }
        Ok(())
    }

    fn bias_act(&self, z: View<'_, HostArray>, bias: View<'_, HostArray>, relu: bool) -> Result<()> {
        let bias = read(&bias);
        for row in write(&z).chunks_mut(bias.len()) {
            for (value, b) in row.iter_mut().zip(bias.iter()) {
                *value += b;
                if relu {
                    *value = value.max(0.0);
                }
            }
        }
        Ok(())
    }

    fn relu_backward(&self, grad: View<'_, HostArray>, act: View<'_, HostArray>) -> Result<()> {
        for (g, a) in write(&grad).iter_mut().zip(read(&act).iter()) {
            if *a <= 0.0 {
                *g = 0.0;
            }
        }
        Ok(())
    }

    fn mse(
        &self,
        y: View<'_, HostArray>,
        t: View<'_, HostArray>,
        grad: View<'_, HostArray>,
        loss: View<'_, HostArray>,
        scale: f32,
    ) -> Result<()> {
        let mut sum = 0.0f32;
        for ((g, y), t) in write(&grad).iter_mut().zip(read(&y).iter()).zip(read(&t).iter()) {
            let d = y - t;
            *g = scale * d;
            sum += d * d;
        }
        write(&loss)[0] += sum;
        Ok(())
    }

    fn sgd(&self, param: View<'_, HostArray>, grad: View<'_, HostArray>, lr: f32) -> Result<()> {
        for (p, g) in write(&param).iter_mut().zip(read(&grad).iter()) {
            *p -= lr * g;
        }
        Ok(())
    }

    fn buffer<'a>(&self, array: &'a HostArray) -> &'a MockBuffer {
        &array.buffer
    }

    fn publish(&self, array: &HostArray) -> Result<()> {
        let bytes = to_bytes(&array.data.borrow());
        self.device.copy_from_host(&array.buffer, &bytes, &self.device.current_stream())
    }

    fn collect(&self, array: &HostArray) -> Result<()> {
        let bytes = self.device.copy_to_host(&array.buffer, &self.device.current_stream())?;
        let mut values = array.data.borrow_mut();
        for (value, chunk) in values.iter_mut().zip(bytes.chunks_exact(4)) {
            *value = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        Ok(())
    }
}
