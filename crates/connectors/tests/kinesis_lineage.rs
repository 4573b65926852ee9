//! Which Kinesis shards may be read, and from where: the lineage rules, without a server.

use std::collections::HashSet;

use sluice_connectors::kinesis::KinesisStart;
use sluice_connectors::kinesis::shards::{Plan, Progress, ShardInfo, ShardProgress, ShardState, StartAt, plan};

fn shard(id: &str, parents: &[&str], closed: bool) -> ShardInfo {
    ShardInfo { id: id.into(), parents: parents.iter().map(|p| p.to_string()).collect(), closed }
}

fn progress(entries: &[(&str, Option<&str>, ShardState)]) -> Progress {
    entries
        .iter()
        .map(|(id, seq, state)| (id.to_string(), ShardProgress { seq: seq.map(Into::into), state: *state }))
        .collect()
}

#[test]
fn a_child_waits_for_every_parent_to_end() {
    let listed: HashSet<&str> = ["p", "q", "child"].into();
    let child = shard("child", &["p", "q"], false);
    let none = HashSet::new();
    let reading = progress(&[("p", Some("5"), ShardState::Ended), ("q", Some("7"), ShardState::Reading)]);
    assert_eq!(plan(&child, &listed, &reading, &none, &KinesisStart::Oldest), None);
    let ended = progress(&[("p", Some("5"), ShardState::Ended), ("q", Some("9"), ShardState::Ended)]);
    assert_eq!(plan(&child, &listed, &ended, &none, &KinesisStart::Oldest), Some(Plan::Read(StartAt::TrimHorizon)));
    // A parent aged out of the listing no longer holds its children back.
    let only_child: HashSet<&str> = ["child"].into();
    assert_eq!(
        plan(&child, &only_child, &Progress::new(), &none, &KinesisStart::Oldest),
        Some(Plan::Read(StartAt::TrimHorizon))
    );
}

#[test]
fn checkpoints_resume_after_the_last_record_and_done_shards_stay_done() {
    let listed: HashSet<&str> = ["a", "b"].into();
    let p = progress(&[("a", Some("42"), ShardState::Reading), ("b", Some("9"), ShardState::Ended)]);
    let none = HashSet::new();
    assert_eq!(
        plan(&shard("a", &[], false), &listed, &p, &none, &KinesisStart::Latest),
        Some(Plan::Read(StartAt::After("42".into())))
    );
    assert_eq!(plan(&shard("b", &[], true), &listed, &p, &none, &KinesisStart::Oldest), None);
    let running: HashSet<String> = ["a".to_string()].into();
    assert_eq!(plan(&shard("a", &[], false), &listed, &p, &running, &KinesisStart::Oldest), None);
}

#[test]
fn latest_skips_closed_shards_but_reads_children_of_shards_it_read_from_their_start() {
    let listed: HashSet<&str> = ["old", "new", "x", "y"].into();
    let none = HashSet::new();
    let empty = Progress::new();
    assert_eq!(plan(&shard("old", &[], true), &listed, &empty, &none, &KinesisStart::Latest), Some(Plan::Skip));
    assert_eq!(plan(&shard("new", &["old"], false), &listed, &empty, &none, &KinesisStart::Latest), None);
    let skipped = progress(&[("old", None, ShardState::Skipped)]);
    assert_eq!(
        plan(&shard("new", &["old"], false), &listed, &skipped, &none, &KinesisStart::Latest),
        Some(Plan::Read(StartAt::Latest))
    );
    let read = progress(&[("x", None, ShardState::Ended)]);
    assert_eq!(
        plan(&shard("y", &["x"], false), &listed, &read, &none, &KinesisStart::Latest),
        Some(Plan::Read(StartAt::TrimHorizon))
    );
    let at = KinesisStart::AtTimestamp("2026-11-29T12:00:00Z".into());
    let Some(Plan::Read(StartAt::AtTimestamp(t))) = plan(&shard("x", &[], false), &listed, &empty, &none, &at) else {
        panic!("at_timestamp opens at the time")
    };
    assert_eq!(t.to_rfc3339(), "2026-11-29T12:00:00+00:00");
}

#[test]
fn kpl_aggregates_need_the_magic_and_a_matching_digest() {
    use sluice_connectors::kinesis::{KPL_MAGIC, deaggregate};
    assert_eq!(deaggregate(br#"{"plain": 1}"#, "k"), None);
    let mut forged = KPL_MAGIC.to_vec();
    forged.extend_from_slice(&[0u8; 20]);
    assert_eq!(deaggregate(&forged, "k"), None, "a bad digest means an ordinary record");
}
