//! Shard lineage and progress: which shards may be read now, and from where. A child shard is
//! read only once its parents are read to their end, so order per partition key holds across
//! splits and merges.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_core::Position;

use super::KinesisStart;

/// How far one shard has been read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardProgress {
    /// The last sequence number read (an aggregate's user records share theirs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<String>,
    /// Where the shard stands.
    #[serde(default)]
    pub state: ShardState,
}

/// Where a shard stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardState {
    /// Being read.
    #[default]
    Reading,
    /// Closed by a reshard and read to its end.
    Ended,
    /// Closed before the stream started and not read (start = latest).
    Skipped,
}

impl ShardState {
    /// Nothing more will be read from the shard.
    pub fn done(self) -> bool {
        self != Self::Reading
    }
}

/// Progress per shard id.
pub type Progress = BTreeMap<String, ShardProgress>;

/// The position of a chunk: every shard's progress.
pub fn position(progress: &Progress) -> Position {
    Position(serde_json::json!({ "shards": progress }))
}

/// Progress from a stored position (empty for none or another shape).
pub fn progress_of(position: &Position) -> Progress {
    serde_json::from_value(position.0.get("shards").cloned().unwrap_or(Value::Null)).unwrap_or_default()
}

/// A shard as ListShards describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard id.
    pub id: String,
    /// Its parent, and the adjacent parent of a merge.
    pub parents: Vec<String>,
    /// It has an ending sequence number: a reshard closed it.
    pub closed: bool,
}

/// Where a reader opens a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartAt {
    /// Right after this sequence number (a checkpoint).
    After(String),
    /// The oldest retained record.
    TrimHorizon,
    /// Records put from now on.
    Latest,
    /// Records from this time on.
    AtTimestamp(DateTime<Utc>),
}

/// What to do with a listed shard now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Open a reader here.
    Read(StartAt),
    /// Record it as skipped: closed before a `latest` stream began.
    Skip,
}

/// The plan for `shard`, or `None` while it is read, done, or waiting for a parent. `listed`
/// holds the ids ListShards returned: a parent no longer listed has aged out and is done.
pub fn plan(
    shard: &ShardInfo,
    listed: &HashSet<&str>,
    progress: &Progress,
    running: &HashSet<String>,
    start: &KinesisStart,
) -> Option<Plan> {
    if running.contains(&shard.id) {
        return None;
    }
    let own = progress.get(&shard.id);
    if own.is_some_and(|p| p.state.done()) {
        return None;
    }
    if let Some(seq) = own.and_then(|p| p.seq.clone()) {
        return Some(Plan::Read(StartAt::After(seq)));
    }
    let parents: Vec<&String> = shard.parents.iter().filter(|p| listed.contains(p.as_str())).collect();
    if parents.iter().any(|p| !progress.get(*p).is_some_and(|g| g.state.done())) {
        return None;
    }
    Some(match start {
        KinesisStart::Oldest => Plan::Read(StartAt::TrimHorizon),
        KinesisStart::AtTimestamp(_) => Plan::Read(StartAt::AtTimestamp(start.timestamp()?)),
        // A child of a shard this stream read gets everything since the reshard; otherwise
        // `latest` means now, and a shard that is already closed has nothing new.
        KinesisStart::Latest
            if parents.iter().any(|p| progress.get(*p).is_some_and(|g| g.state == ShardState::Ended)) =>
        {
            Plan::Read(StartAt::TrimHorizon)
        }
        KinesisStart::Latest if shard.closed => Plan::Skip,
        KinesisStart::Latest => Plan::Read(StartAt::Latest),
    })
}
