//! Slowing password guessing: every failed login is answered after [`FAILURE_DELAY`], and
//! after [`FREE_FAILURES`] failures in a row a user name is locked for 2 s, a time that doubles
//! with each further failure, up to [`MAX_LOCK`]: a locked name gets 429 with `Retry-After`
//! without its password being checked. A successful login clears the count. At most
//! [`MAX_TRACKED`] names are remembered (unknown names included), so guessing names cannot
//! grow the memory; past that, the names not locked now are forgotten first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a failed login waits before it is answered.
pub const FAILURE_DELAY: Duration = Duration::from_millis(500);
/// Failures in a row before a name is locked.
pub const FREE_FAILURES: u32 = 5;
/// The longest lock.
pub const MAX_LOCK: Duration = Duration::from_secs(300);
/// Names remembered at most.
const MAX_TRACKED: usize = 10_000;

#[derive(Default)]
struct Failures {
    count: u32,
    locked_until: Option<Instant>,
}

/// Failed logins by user name.
#[derive(Default)]
pub struct LoginThrottle {
    failures: Mutex<HashMap<String, Failures>>,
}

impl LoginThrottle {
    /// How long `user` is still locked, if it is.
    pub fn locked(&self, user: &str) -> Option<Duration> {
        let failures = self.failures.lock().ok()?;
        let until = failures.get(user)?.locked_until?;
        until.checked_duration_since(Instant::now()).filter(|left| !left.is_zero())
    }

    /// Count a failed login of `user`.
    pub fn failed(&self, user: &str) {
        let Ok(mut failures) = self.failures.lock() else { return };
        let now = Instant::now();
        if failures.len() >= MAX_TRACKED && !failures.contains_key(user) {
            failures.retain(|_, f| f.locked_until.is_some_and(|until| until > now));
            if failures.len() >= MAX_TRACKED {
                return;
            }
        }
        let entry = failures.entry(user.to_string()).or_default();
        entry.count = entry.count.saturating_add(1);
        if entry.count >= FREE_FAILURES {
            let doublings = (entry.count - FREE_FAILURES).min(16);
            let lock = Duration::from_secs(2u64 << doublings).min(MAX_LOCK);
            entry.locked_until = Some(now + lock);
        }
    }

    /// A successful login of `user`: its count starts again.
    pub fn succeeded(&self, user: &str) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(user);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_locked_after_repeated_failures_and_freed_by_a_success() {
        let throttle = LoginThrottle::default();
        for _ in 0..FREE_FAILURES - 1 {
            throttle.failed("ada");
        }
        assert!(throttle.locked("ada").is_none());
        throttle.failed("ada");
        let first = throttle.locked("ada").unwrap();
        throttle.failed("ada");
        assert!(throttle.locked("ada").unwrap() > first, "each failure doubles the lock");
        assert!(throttle.locked("grace").is_none(), "per name");
        throttle.succeeded("ada");
        assert!(throttle.locked("ada").is_none());
    }
}
