//! Repeated warnings, logged once per window. A client that cannot reach its brokers reports the
//! same failure many times a second (librdkafka's log line, its error callback, each poll); the
//! first of a kind is logged, later ones are counted, and the first after the window is logged
//! with the count of those left out. The stream's state shows every error as it happens.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long repeats of one kind of line stay quiet.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// Kinds remembered at most; beyond that the oldest are forgotten.
const KINDS: usize = 256;

/// Counts repeats of lines by kind.
pub(crate) struct Throttle {
    window: Duration,
    kinds: Mutex<HashMap<String, Kind>>,
}

struct Kind {
    logged: Instant,
    left_out: u64,
}

impl Throttle {
    pub(crate) fn new(window: Duration) -> Self {
        Self { window, kinds: Mutex::new(HashMap::new()) }
    }

    /// Whether a line of `text` should be logged now: `Some(n)` with the number of lines of its
    /// kind left out since the last one logged, or `None` to leave it out.
    pub(crate) fn admit(&self, text: &str) -> Option<u64> {
        self.admit_at(text, Instant::now())
    }

    fn admit_at(&self, text: &str, now: Instant) -> Option<u64> {
        let Ok(mut kinds) = self.kinds.lock() else { return Some(0) };
        let key = kind(text);
        if let Some(k) = kinds.get_mut(&key) {
            if now.duration_since(k.logged) < self.window {
                k.left_out += 1;
                return None;
            }
            let left_out = std::mem::take(&mut k.left_out);
            k.logged = now;
            return Some(left_out);
        }
        if kinds.len() >= KINDS
            && let Some(oldest) = kinds.iter().min_by_key(|(_, k)| k.logged).map(|(key, _)| key.clone())
        {
            kinds.remove(&oldest);
        }
        kinds.insert(key, Kind { logged: now, left_out: 0 });
        Some(0)
    }
}

/// The kind of a line: its text without digits or parenthesized remarks, so that "after 0ms" and
/// "after 3ms, 1 identical error(s) suppressed" are the same kind.
fn kind(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            c if depth == 0 && !c.is_ascii_digit() => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_counted_and_reported_once_per_window() {
        let t = Throttle::new(Duration::from_secs(60));
        let start = Instant::now();
        let line = |n: u32| format!("127.0.0.1:9/bootstrap: Connect failed (after {n}ms in state CONNECT)");
        assert_eq!(t.admit_at(&line(0), start), Some(0));
        for i in 1..=500 {
            assert_eq!(t.admit_at(&line(i), start + Duration::from_millis(u64::from(i) * 100)), None);
        }
        // Another kind of line is not held back by the first.
        assert_eq!(t.admit_at("all brokers are down", start + Duration::from_secs(1)), Some(0));
        assert_eq!(t.admit_at(&line(7), start + Duration::from_secs(61)), Some(500));
        assert_eq!(t.admit_at(&line(8), start + Duration::from_secs(62)), None);
    }

    #[test]
    fn kinds_are_bounded() {
        let t = Throttle::new(Duration::from_secs(60));
        let now = Instant::now();
        for i in 0..1000 {
            t.admit_at(&format!("topic-{}", "x".repeat(i % 300 + 1)), now);
        }
        assert!(t.kinds.lock().unwrap().len() <= KINDS);
    }
}
