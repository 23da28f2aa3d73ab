//! What a case is and what it gives: [`Case`] (a name, the fewest ranks, the function) and [`Outcome`], named by
//! the cases and by the registry that lists them (so that the registry depends on the cases, not both ways).

use crate::check::Check;
use crate::harness::Harness;

/// What running a case gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held.
    Pass,
    /// A check failed: what was wrong.
    Fail(String),
    /// The case cannot run on this harness or world: why. Never counted as a pass.
    NotApplicable(String),
}

impl Outcome {
    /// The result word of the JSON and the table: `pass`, `fail` or `not_applicable`.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail(_) => "fail",
            Outcome::NotApplicable(_) => "not_applicable",
        }
    }

    /// The detail: what failed or why the case did not apply (empty for a pass).
    pub fn detail(&self) -> &str {
        match self {
            Outcome::Pass => "",
            Outcome::Fail(detail) | Outcome::NotApplicable(detail) => detail,
        }
    }
}

/// A case that passed.
pub(crate) fn pass() -> Check<Outcome> {
    Ok(Outcome::Pass)
}

/// A case that does not apply, with why.
pub(crate) fn not_applicable(why: impl Into<String>) -> Check<Outcome> {
    Ok(Outcome::NotApplicable(why.into()))
}

/// One conformance case.
pub struct Case<H: Harness> {
    /// Its name (unique; the same on every backend).
    pub name: &'static str,
    /// The fewest ranks it needs.
    pub min_ranks: usize,
    /// Runs it: `Err` is a failure with its detail.
    pub run: fn(&H) -> Check<Outcome>,
}

impl<H: Harness> std::fmt::Debug for Case<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case").field("name", &self.name).field("min_ranks", &self.min_ranks).finish()
    }
}
