//! Idempotency keys a push stream remembers: each key's answer once its push is durable, and
//! the keys whose push is still in flight. The durable copy lives in `sluice.push_keys`,
//! committed with the rows; this is what the push route consults, loaded at stream start.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a push with a key should do.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// A new key: go ahead; it is marked in flight until [`KeyMemory::settle`].
    New,
    /// This key's push was stored; answer with this body again.
    Replay(String),
    /// A push with this key is being stored right now.
    InFlight,
}

#[derive(Default)]
struct Keys {
    done: HashMap<String, (Instant, String)>,
    order: VecDeque<(Instant, String)>,
    inflight: HashSet<String>,
}

/// The keys of one stream, shared by the push route and the source.
#[derive(Clone)]
pub struct KeyMemory {
    keys: Arc<Mutex<Keys>>,
    window: Duration,
    limit: usize,
}

impl std::fmt::Debug for KeyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyMemory").field("window", &self.window).field("limit", &self.limit).finish()
    }
}

impl KeyMemory {
    /// Keys kept for `window`, at most `limit` of them (the oldest go first).
    pub fn new(window: Duration, limit: usize) -> Self {
        Self { keys: Arc::default(), window, limit }
    }

    /// How long a key is honoured.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Most keys kept.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        // A panic while holding this lock leaves plain data behind; keep using it.
        self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Claim `key` for a push.
    pub fn claim(&self, key: &str) -> Claim {
        let mut keys = self.lock();
        self.expire(&mut keys);
        if let Some((_, answer)) = keys.done.get(key) {
            return Claim::Replay(answer.clone());
        }
        if !keys.inflight.insert(key.to_string()) {
            return Claim::InFlight;
        }
        Claim::New
    }

    /// The push with `key` ended: stored with `answer`, or not stored (`None`).
    pub fn settle(&self, key: &str, answer: Option<String>) {
        let mut keys = self.lock();
        keys.inflight.remove(key);
        if let Some(answer) = answer {
            remember(&mut keys, key.to_string(), answer, self.limit);
        }
    }

    /// Keys already durable (at stream start), oldest first.
    pub fn load(&self, stored: Vec<(String, String)>) {
        let mut keys = self.lock();
        for (key, answer) in stored {
            remember(&mut keys, key, answer, self.limit);
        }
    }

    fn expire(&self, keys: &mut Keys) {
        while let Some((at, _)) = keys.order.front() {
            if at.elapsed() < self.window {
                break;
            }
            if let Some((at, key)) = keys.order.pop_front()
                && keys.done.get(&key).is_some_and(|(stored, _)| *stored == at)
            {
                keys.done.remove(&key);
            }
        }
    }
}

fn remember(keys: &mut Keys, key: String, answer: String, limit: usize) {
    let now = Instant::now();
    keys.done.insert(key.clone(), (now, answer));
    keys.order.push_back((now, key));
    while keys.done.len() > limit {
        let Some((at, key)) = keys.order.pop_front() else { break };
        if keys.done.get(&key).is_some_and(|(stored, _)| *stored == at) {
            keys.done.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_new_then_in_flight_then_replayed_and_forgotten_past_the_limit() {
        let keys = KeyMemory::new(Duration::from_secs(60), 2);
        assert_eq!(keys.claim("a"), Claim::New);
        assert_eq!(keys.claim("a"), Claim::InFlight);
        keys.settle("a", Some("{}".into()));
        assert_eq!(keys.claim("a"), Claim::Replay("{}".into()));
        // A failed push frees its key.
        assert_eq!(keys.claim("b"), Claim::New);
        keys.settle("b", None);
        assert_eq!(keys.claim("b"), Claim::New);
        keys.settle("b", Some("1".into()));
        keys.load(vec![("c".into(), "2".into())]);
        assert_eq!(keys.claim("a"), Claim::New, "the oldest key goes past the limit");
        assert_eq!(keys.claim("c"), Claim::Replay("2".into()));
    }

    #[test]
    fn keys_expire_after_the_window() {
        let keys = KeyMemory::new(Duration::from_millis(0), 10);
        keys.load(vec![("a".into(), "{}".into())]);
        assert_eq!(keys.claim("a"), Claim::New);
    }
}
