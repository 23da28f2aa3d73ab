//! The case registry: every case with its name and minimum ranks, and the runner that turns each into an
//! [`Outcome`].

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::case::{Case, Outcome};
use crate::harness::Harness;

/// A case's result, as the table and the JSON report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseReport {
    /// The case's name.
    pub name: String,
    /// The fewest ranks it needs.
    pub min_ranks: usize,
    /// What it gave.
    pub outcome: Outcome,
}

/// Every case of the suite, in a fixed order.
pub fn cases<H: Harness>() -> Vec<Case<H>> {
    let mut all = Vec::new();
    all.extend(crate::cases::semantics::cases::<H>());
    all.extend(crate::cases::ops::cases::<H>());
    all.extend(crate::cases::collectives::cases::<H>());
    all.extend(crate::cases::lifecycle::cases::<H>());
    all.extend(crate::cases::dtypes::cases::<H>());
    all.extend(crate::cases::subgroups::cases::<H>());
    all.extend(crate::cases::interop::cases::<H>());
    all.extend(crate::cases::capture::cases::<H>());
    all.extend(crate::cases::recovery::cases::<H>());
    all.extend(crate::cases::trace::cases::<H>());
    all
}

/// The failure-and-recovery cases alone (a rank killed mid-op, revoke, the survivors' agreement, shrink).
pub fn recovery_cases<H: Harness>() -> Vec<Case<H>> {
    crate::cases::recovery::cases::<H>()
}

/// The cases of the collectives beyond the one-buffer set (reduce, gather, scatter, all-to-all, list forms,
/// batched point-to-point, coalesced blocks): cheap enough to run at more world sizes than the whole suite.
pub fn collective_cases<H: Harness>() -> Vec<Case<H>> {
    crate::cases::collectives::cases::<H>()
}

/// The cases of every dtype and `PREMUL_SUM`, whose expectations must hold in the dtypes' own arithmetic at any
/// world size: cheap enough to run at a large one.
pub fn dtype_cases<H: Harness>() -> Vec<Case<H>> {
    crate::cases::dtypes::cases::<H>()
}

/// The subgroup cases alone (`new_group`, `split_by_color`, `DeviceMesh` and their failures).
pub fn subgroup_cases<H: Harness>() -> Vec<Case<H>> {
    crate::cases::subgroups::cases::<H>()
}

/// Runs one case: not applicable if the world is too small, a failure if it panics.
pub fn run_case<H: Harness>(harness: &H, case: &Case<H>) -> CaseReport {
    let outcome = if harness.world_size() < case.min_ranks {
        Outcome::NotApplicable(format!("needs {} ranks; the world has {}", case.min_ranks, harness.world_size()))
    } else {
        match catch_unwind(AssertUnwindSafe(|| (case.run)(harness))) {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(detail)) => Outcome::Fail(detail),
            Err(payload) => Outcome::Fail(format!("panicked: {}", panic_text(payload.as_ref()))),
        }
    };
    CaseReport { name: case.name.to_owned(), min_ranks: case.min_ranks, outcome }
}

/// Runs every case whose name passes `filter`, in order.
pub fn run_all<H: Harness>(harness: &H, filter: impl Fn(&str) -> bool) -> Vec<CaseReport> {
    cases::<H>().iter().filter(|case| filter(case.name)).map(|case| run_case(harness, case)).collect()
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-text panic".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::MockHarness;

    /// The longest line `docs/semantics.md` may have, in characters: a row is its rule and its case names; the detail of
    /// what a case does is in its comment.
    const LONGEST_SEMANTICS_LINE: usize = 400;

    #[test]
    fn every_semantics_line_is_at_most_400_characters() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/semantics.md");
        let page = std::fs::read_to_string(path).expect("docs/semantics.md");
        let long: Vec<String> = page
            .lines()
            .enumerate()
            .filter(|(_, line)| line.chars().count() > LONGEST_SEMANTICS_LINE)
            .map(|(i, line)| {
                format!(
                    "line {}: {} characters: {}...",
                    i + 1,
                    line.chars().count(),
                    line.chars().take(80).collect::<String>()
                )
            })
            .collect();
        assert!(
            long.is_empty(),
            "docs/semantics.md lines over {LONGEST_SEMANTICS_LINE} characters:\n{}",
            long.join("\n")
        );
    }

    /// `docs/semantics.md` names every case, and every name it gives in backticks that looks like a case is one.
    #[test]
    fn the_semantics_page_names_every_case_and_only_cases() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/semantics.md");
        let page = std::fs::read_to_string(path).expect("docs/semantics.md");
        let cases = cases::<MockHarness>();
        let names: Vec<&str> = cases.iter().map(|c| c.name).collect();
        let mut seen = std::collections::HashSet::new();
        for (i, name) in names.iter().enumerate() {
            assert!(seen.insert(*name), "case {name} is registered twice");
            assert!(page.contains(&format!("`{name}`")), "docs/semantics.md does not name case {name} (#{i})");
        }
        let quoted = page.split('`').skip(1).step_by(2);
        for word in quoted {
            let looks_like_a_case = word.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && word.matches('_').count() >= 3;
            if looks_like_a_case {
                assert!(names.contains(&word), "docs/semantics.md names {word}, which is no case");
            }
        }
    }
}
