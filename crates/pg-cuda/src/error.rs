//! The typed error of pg-cuda.

use cudarc::driver::DriverError;

/// The result type of pg-cuda.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// What went wrong talking to the CUDA driver.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// The driver library (`libcuda.so.1`) could not be loaded: no GPU driver on this machine.
    #[error("the CUDA driver library (libcuda) could not be loaded: no NVIDIA driver here")]
    DriverNotFound,
    /// A driver call failed.
    #[error("{call} failed: {source}")]
    Driver {
        /// What was being done (the driver call or the pg-cuda operation).
        call: &'static str,
        /// The driver's error, with its name and text.
        #[source]
        source: DriverError,
    },
    /// A caller error: a size mismatch, a device ordinal out of range, a stream of another device.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// Adds the failed call's name to a driver error.
pub(crate) trait DriverContext<T> {
    fn during(self, call: &'static str) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, DriverError> {
    fn during(self, call: &'static str) -> Result<T> {
        self.map_err(|source| CudaError::Driver { call, source })
    }
}
