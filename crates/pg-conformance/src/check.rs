//! How a case says what went wrong: `Check<T>` is a result whose error is the readable detail.

use std::fmt::Display;

/// The result of a check: the error is the detail the runner reports.
pub type Check<T = ()> = Result<T, String>;

/// Turns any displayable error into a [`Check`] error that says what was being done.
pub trait Context<T> {
    /// The error, prefixed with `what`.
    fn ctx(self, what: &str) -> Check<T>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Check<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Fails the check with a formatted detail unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($detail:tt)+) => {
        if !$cond {
            return Err(format!($($detail)+));
        }
    };
}

/// Fails the check unless the two values are equal, showing both.
#[macro_export]
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($detail:tt)+) => {{
        let (left, right) = (&$left, &$right);
        if left != right {
            return Err(format!("{}: {:?} != {:?}", format!($($detail)+), left, right));
        }
    }};
}
