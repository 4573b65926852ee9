//! Crash points for kill -9 tests that need the process to die at one exact step, where a
//! signal from outside could only land there by chance. `SLUICE_CRASH_AT=<point>:<n>` makes
//! the process abort (no destructors, no flush: what kill -9 leaves) the `n`th time it reaches
//! `point`. Unset, as in any real run, a point costs one read of a value set once.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The point and hit number `SLUICE_CRASH_AT` names, read once.
fn armed() -> Option<&'static (String, u64)> {
    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let value = std::env::var("SLUICE_CRASH_AT").ok()?;
            let (point, n) = value.rsplit_once(':').unwrap_or((value.as_str(), "1"));
            Some((point.to_string(), n.parse().ok()?))
        })
        .as_ref()
}

/// Abort the process here if `SLUICE_CRASH_AT` names `point` and this is its `n`th hit.
pub fn point(point: &str) {
    static HITS: AtomicU64 = AtomicU64::new(0);
    if let Some((armed, n)) = armed()
        && armed == point
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n
    {
        eprintln!("sluice: SLUICE_CRASH_AT reached {point} (hit {n}): aborting");
        std::process::abort();
    }
}
