//! The rejoin watchdog. A group can leave partitions read by nobody while its members heartbeat
//! happily: tansu 0.6.0, for one, can hand the members that join right after a `kill -9` a
//! generation that still counts the dead member (as leader, or as the holder of a partition),
//! and then keep it for minutes, so a member sits with an empty assignment, or a partition sits
//! with no live reader. (Read in its `coordinator/group/administrator.rs`: dead members expire
//! only when a request checks, never on a timer; once a group is formed, a live member's
//! heartbeat that expires the dead member leaves the group formed with the old assignment (a
//! join, sync or leave that notices it first does reopen the group), and SyncGroup in that
//! state ignores the leader's new assignment. A LeaveGroup starts a new generation with the
//! members that have not timed out; 0.7's pre-releases change the join and sync paths.)
//! Holding no partitions is normal when other members hold them all, so the watchdog leaves and
//! rejoins the group only when, over a whole window without a rebalance, a partition of the
//! subscribed topics that this member does not hold has messages beyond the group's committed
//! offset and that offset did not move (or, with none committed, new messages arrived). Joining
//! again makes the broker form a new generation without the members that do not answer.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::consumer::Context;

/// What the subscription covers.
pub(crate) enum Topics {
    Names(Vec<String>),
    Pattern(regex::Regex),
}

/// A partition: topic and number.
type Partition = (String, i32);
/// Per partition: the group's committed offset (if any) and the high watermark.
pub(crate) type Snapshot = BTreeMap<Partition, (Option<i64>, i64)>;

const TIMEOUT: Duration = Duration::from_secs(2);

/// The start of the current window: when, what this member held, and the offsets then.
struct Window {
    at: Instant,
    held: BTreeSet<Partition>,
    offsets: Snapshot,
}

/// Watches for partitions that the group leaves unread.
pub(crate) struct Watchdog {
    after: Duration,
    topics: Option<Topics>,
    window: Option<Window>,
    /// A rejoin was asked for and no partition has been assigned since.
    rejoining: bool,
}

impl Watchdog {
    /// A watchdog that acts after `after` (zero: never) over `topics` (`None`: not measurable).
    pub(crate) fn new(after: Duration, topics: Option<Topics>) -> Self {
        Self { after, topics, window: None, rejoining: false }
    }

    /// Look once (about every second, from the consumer thread). Returns the reason to rejoin
    /// when the member should leave the group and join again; the caller does that.
    pub(crate) fn check(&mut self, consumer: &BaseConsumer<Context>) -> Option<String> {
        let topics = self.topics.as_ref()?;
        if self.after.is_zero() {
            return None;
        }
        let held: BTreeSet<Partition> = consumer
            .assignment()
            .map(|a| a.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect())
            .unwrap_or_default();
        if !held.is_empty() && std::mem::take(&mut self.rejoining) {
            consumer.context().metrics.set_state("running", None);
        }
        // A window starts now, and again after each rebalance.
        let Some(window) = self.window.as_ref().filter(|w| w.held == held) else {
            self.window = Some(Window { at: Instant::now(), held, offsets: snapshot(consumer, topics) });
            return None;
        };
        let quiet_for = window.at.elapsed();
        if quiet_for < self.after {
            return None;
        }
        let now = snapshot(consumer, topics);
        let idle = unread(&window.offsets, &now, &held);
        let holding =
            if held.is_empty() { "no partitions".to_string() } else { format!("{} partition(s)", held.len()) };
        self.window = Some(Window { at: Instant::now(), held, offsets: now });
        if idle.is_empty() {
            return None;
        }
        self.rejoining = true;
        Some(format!(
            "{} unread by the group for {} s ({}) while this member holds {holding}; rejoining the group",
            if idle.len() == 1 { "1 partition went".to_string() } else { format!("{} partitions went", idle.len()) },
            quiet_for.as_secs(),
            idle.join(", "),
        ))
    }
}

/// Partitions (as `topic/partition`) not in `held` whose committed offset stayed put between
/// `before` and `now` while messages wait beyond it; with nothing committed, while new messages
/// arrived.
fn unread(before: &Snapshot, now: &Snapshot, held: &BTreeSet<Partition>) -> Vec<String> {
    let mut out = Vec::new();
    for (key, (committed, high)) in now {
        let Some((was_committed, was_high)) = before.get(key).filter(|_| !held.contains(key)) else { continue };
        let (topic, partition) = key;
        let waiting = match committed {
            Some(c) => high > c,
            None => high > was_high,
        };
        if committed == was_committed && waiting {
            out.push(format!("{topic}/{partition}"));
        }
    }
    out
}

/// Committed offsets and high watermarks of every partition of the subscribed topics; empty
/// when the broker cannot be asked.
fn snapshot(consumer: &BaseConsumer<Context>, topics: &Topics) -> Snapshot {
    let mut out = Snapshot::new();
    // Only the subscribed topics' metadata where they are named; all topics' for a pattern.
    let names: Vec<Option<&str>> = match topics {
        Topics::Names(names) => names.iter().map(|n| Some(n.as_str())).collect(),
        Topics::Pattern(_) => vec![None],
    };
    let mut tpl = TopicPartitionList::new();
    for name in names {
        let Ok(metadata) = consumer.fetch_metadata(name, TIMEOUT) else { return out };
        for t in metadata.topics() {
            let wanted = match topics {
                Topics::Names(names) => names.iter().any(|n| n == t.name()),
                Topics::Pattern(p) => p.is_match(t.name()),
            };
            if wanted && t.error().is_none() {
                for p in t.partitions() {
                    tpl.add_partition(t.name(), p.id());
                }
            }
        }
    }
    if tpl.count() == 0 {
        return out;
    }
    let Ok(committed) = consumer.committed_offsets(tpl.clone(), TIMEOUT) else { return out };
    for e in tpl.elements() {
        let (topic, partition) = (e.topic(), e.partition());
        let Ok((_, high)) = consumer.fetch_watermarks(topic, partition, TIMEOUT) else { return Snapshot::new() };
        let at = committed.find_partition(topic, partition).and_then(|c| match c.offset() {
            Offset::Offset(o) if o >= 0 => Some(o),
            _ => None,
        });
        out.insert((topic.to_string(), partition), (at, high));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(rows: &[(&str, i32, Option<i64>, i64)]) -> Snapshot {
        rows.iter().map(|(t, p, c, h)| ((t.to_string(), *p), (*c, *h))).collect()
    }

    #[test]
    fn only_partitions_nobody_reads_count() {
        let before = snap(&[("a", 0, Some(10), 50), ("a", 1, Some(40), 40), ("a", 2, Some(5), 9), ("b", 0, None, 3)]);
        let now = snap(&[
            // Another member commits as it reads: fine.
            ("a", 0, Some(30), 80),
            // Caught up, nothing new: fine.
            ("a", 1, Some(40), 40),
            // Messages wait and the committed offset stands still: unread.
            ("a", 2, Some(5), 9),
            // Never committed, and new messages arrive: unread.
            ("b", 0, None, 7),
            // Not seen at the start of the window: not judged yet.
            ("c", 0, None, 100),
        ]);
        assert_eq!(unread(&before, &now, &BTreeSet::new()), ["a/2", "b/0"]);
        // This member's own partitions are not the group's to judge here.
        assert_eq!(unread(&before, &now, &BTreeSet::from([("a".to_string(), 2)])), ["b/0"]);
        // Never committed and nothing new (a `newest` group with an old backlog): fine.
        assert!(unread(&snap(&[("b", 0, None, 3)]), &snap(&[("b", 0, None, 3)]), &BTreeSet::new()).is_empty());
    }
}
