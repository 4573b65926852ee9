//! Crash points for kill -9 tests that need the process to die at one exact step, where a
//! signal from outside could only land there by chance. `SLUICE_CRASH_AT=<point>:<n>` makes
//! the process abort (no destructors, no flush: what kill -9 leaves) the `n`th time it reaches
//! `point`. `SLUICE_LOSE_AT=<point>:<n>` makes the `n`th pass through `point` act as if the
//! answer of what was just done were lost (tests of a commit that landed while its caller heard
//! a failure). Unset, as in any real run, a point costs one read of a value set once.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

type Armed = OnceLock<Option<(String, u64)>>;

/// The point and hit number the variable `name` names, read once into `cell`.
fn armed(cell: &'static Armed, name: &str) -> Option<&'static (String, u64)> {
    cell.get_or_init(|| {
        let value = std::env::var(name).ok()?;
        let (point, n) = value.rsplit_once(':').unwrap_or((value.as_str(), "1"));
        Some((point.to_string(), n.parse().ok()?))
    })
    .as_ref()
}

/// Abort the process here if `SLUICE_CRASH_AT` names `point` and this is its `n`th hit.
pub fn point(point: &str) {
    static ARMED: Armed = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    if let Some((armed, n)) = armed(&ARMED, "SLUICE_CRASH_AT")
        && armed == point
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n
    {
        eprintln!("sluice: SLUICE_CRASH_AT reached {point} (hit {n}): aborting");
        std::process::abort();
    }
}

/// Whether `SLUICE_LOSE_AT` names `point` and this is its `n`th hit: the caller then answers as
/// if what it just did had failed.
pub fn lose(point: &str) -> bool {
    static ARMED: Armed = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let lost = armed(&ARMED, "SLUICE_LOSE_AT")
        .is_some_and(|(armed, n)| armed == point && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n);
    if lost {
        eprintln!("sluice: SLUICE_LOSE_AT reached {point}: its answer is lost");
    }
    lost
}
