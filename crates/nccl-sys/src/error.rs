//! The typed error of nccl-sys.

use std::path::PathBuf;

use crate::{Status, Version};

/// The result type of nccl-sys.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong loading or calling NCCL.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// No candidate library could be opened; each candidate with its loader message.
    #[error("NCCL library not found (tried {})", display_tried(.tried))]
    LibraryNotFound {
        /// The names or paths tried, in order, each with the `dlopen` error.
        tried: Vec<(PathBuf, String)>,
    },
    /// The library was opened but lacks an entry point pg needs.
    #[error("NCCL library {library} lacks the symbol {symbol}: {message}")]
    MissingSymbol {
        /// The library's name or path.
        library: PathBuf,
        /// The C name of the missing function.
        symbol: &'static str,
        /// The loader's message.
        message: String,
    },
    /// The library is older than pg supports.
    #[error("NCCL {found} at {library} is older than the oldest supported version {min}")]
    VersionTooOld {
        /// The library's name or path.
        library: PathBuf,
        /// Its version.
        found: Version,
        /// The oldest version pg supports.
        min: Version,
    },
    /// An NCCL call returned a failure.
    #[error("{call} failed: {status}{}", display_detail(.detail))]
    Call {
        /// The C function that failed.
        call: &'static str,
        /// Its result code.
        status: Status,
        /// `ncclGetErrorString` and `ncclGetLastError`'s text, where there is any.
        detail: String,
    },
    /// A call the loaded library does not have (an optional entry point).
    #[error("{call} is not available in NCCL {version}")]
    Unavailable {
        /// The C function.
        call: &'static str,
        /// The loaded version.
        version: Version,
    },
    /// A call that first came in a later NCCL than the one loaded.
    #[error("{call} needs NCCL {needs} or newer; the loaded NCCL is {version}")]
    TooOld {
        /// The C function.
        call: &'static str,
        /// The loaded version.
        version: Version,
        /// The first version that has it.
        needs: Version,
    },
    /// An argument out of NCCL's range (a count above `i32::MAX` ranks, a rank out of range).
    #[error("invalid argument to {call}: {message}")]
    InvalidArgument {
        /// The C function.
        call: &'static str,
        /// What was wrong.
        message: String,
    },
}

impl Error {
    /// The NCCL result code, for [`Error::Call`].
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Call { status, .. } => Some(*status),
            _ => None,
        }
    }
}

fn display_tried(tried: &[(PathBuf, String)]) -> String {
    tried.iter().map(|(name, why)| format!("{}: {why}", name.display())).collect::<Vec<_>>().join("; ")
}

fn display_detail(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_code_name_and_text() {
        let err = Error::Call {
            call: "ncclAllReduce",
            status: Status(5),
            detail: "invalid usage; last error: wrong stream".into(),
        };
        assert_eq!(
            err.to_string(),
            "ncclAllReduce failed: ncclInvalidUsage (5) (invalid usage; last error: wrong stream)"
        );
        assert_eq!(err.status(), Some(Status(5)));
        let missing = Error::LibraryNotFound { tried: vec![("libnccl.so.2".into(), "not found".into())] };
        assert_eq!(missing.to_string(), "NCCL library not found (tried libnccl.so.2: not found)");
        assert_eq!(missing.status(), None);
    }
}
