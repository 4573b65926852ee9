//! A Delta table's transaction log (`_delta_log/`): the actions Sluice reads and writes, the
//! table's state replayed from a checkpoint and the JSON commits after it, and a commit as a
//! put that succeeds only if no other writer has taken the version (`PutMode::Create`: a hard
//! link on a local folder, `If-None-Match: *` on S3).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_core::{Error, ErrorKind, Result};

/// The table's protocol: the reader and writer versions (and features) a client needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Protocol {
    pub min_reader_version: i32,
    pub min_writer_version: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader_features: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_features: Option<Vec<String>>,
}

/// The table's identity, schema and configuration (where Sluice keeps stream positions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Metadata {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub format: Format,
    pub schema_string: String,
    #[serde(default)]
    pub partition_columns: Vec<String>,
    #[serde(default)]
    pub configuration: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_time: Option<i64>,
}

/// The data files' format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Format {
    pub provider: String,
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// A data file that joins the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Add {
    pub path: String,
    #[serde(default)]
    pub partition_values: BTreeMap<String, Option<String>>,
    pub size: i64,
    pub modification_time: i64,
    pub data_change: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_vector: Option<Value>,
}

/// A data file that leaves the table (kept on the store for older versions until vacuumed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Remove {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<i64>,
    pub data_change: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_file_metadata: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
}

/// An application's transaction version: the protocol's own marker for idempotent writers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Txn {
    pub app_id: String,
    pub version: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<i64>,
}

/// One line of a commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum Action {
    Protocol(Protocol),
    MetaData(Metadata),
    Add(Add),
    Remove(Remove),
    Txn(Txn),
    CommitInfo(Value),
}

/// The actions of a commit (or a checkpoint) as JSON lines; lines of kinds Sluice does not use
/// (`cdc`, `domainMetadata`, …) are skipped.
pub(crate) fn parse(text: &str, origin: &str) -> Result<Vec<Action>> {
    const KNOWN: [&str; 6] = ["protocol", "metaData", "add", "remove", "txn", "commitInfo"];
    let mut actions = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let value: Value = serde_json::from_str(line).map_err(|e| corrupt(origin, &e))?;
        if value.as_object().is_some_and(|o| o.keys().any(|k| KNOWN.contains(&k.as_str()))) {
            actions.push(serde_json::from_value(value).map_err(|e| corrupt(origin, &e))?);
        }
    }
    Ok(actions)
}

fn corrupt(origin: &str, e: &dyn std::fmt::Display) -> Error {
    Error::new(ErrorKind::Fatal, format!("delta: {origin} is not a Delta log Sluice can read: {e}"))
}

/// What the log says the table is at `version`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// The last version read; `-1` before the first commit.
    pub version: i64,
    pub protocol: Option<Protocol>,
    pub metadata: Option<Metadata>,
    /// Live data files by path.
    pub files: BTreeMap<String, Add>,
    /// Each application's last transaction version.
    pub txns: HashMap<String, i64>,
    /// Removed files by path, with when they were removed (ms), until vacuumed.
    pub removed: BTreeMap<String, i64>,
    /// The version of the last checkpoint; `-1`: none.
    pub checkpoint: i64,
}

impl Snapshot {
    fn empty() -> Self {
        Self { version: -1, checkpoint: -1, ..Self::default() }
    }

    /// Apply one commit's actions.
    pub(crate) fn apply(&mut self, actions: &[Action]) {
        for action in actions {
            match action {
                Action::Protocol(p) => self.protocol = Some(p.clone()),
                Action::MetaData(m) => self.metadata = Some(m.clone()),
                Action::Add(a) => {
                    self.removed.remove(&a.path);
                    self.files.insert(a.path.clone(), a.clone());
                }
                Action::Remove(r) => {
                    self.files.remove(&r.path);
                    self.removed.insert(r.path.clone(), r.deletion_timestamp.unwrap_or(0));
                }
                Action::Txn(t) => {
                    self.txns.insert(t.app_id.clone(), t.version);
                }
                Action::CommitInfo(_) => {}
            }
        }
    }

    /// Refuse tables Sluice would write wrongly: partitioned tables, deletion vectors, column
    /// mapping and other reader features a plain Parquet writer does not honour.
    pub(crate) fn check_writable(&self, table: &str) -> Result<()> {
        let refuse = |why: String| Err(Error::new(ErrorKind::Fatal, format!("delta: table '{table}' {why}")));
        if let Some(p) = &self.protocol {
            let features = p.reader_features.iter().flatten().chain(p.writer_features.iter().flatten());
            let unknown: Vec<&String> = features.filter(|f| f.as_str() != "timestampNtz").collect();
            if !unknown.is_empty()
                || p.min_reader_version > 3
                || (p.min_writer_version > 4 && p.min_writer_version != 7)
            {
                return refuse(format!(
                    "needs Delta features Sluice does not write ({unknown:?}, reader {}, writer {})",
                    p.min_reader_version, p.min_writer_version
                ));
            }
        }
        if let Some(m) = &self.metadata {
            if !m.partition_columns.is_empty() {
                return refuse("is partitioned; Sluice writes unpartitioned tables".into());
            }
            // Rules a writer must enforce that Sluice does not: refused rather than broken.
            let on = |key: &str| m.configuration.get(key).is_some_and(|v| v.eq_ignore_ascii_case("true"));
            for key in ["delta.appendOnly", "delta.enableChangeDataFeed"] {
                if on(key) {
                    return refuse(format!("has {key} = true, which Sluice does not honour"));
                }
            }
            if let Some(key) = m.configuration.keys().find(|k| k.starts_with("delta.constraints.")) {
                return refuse(format!("has the CHECK constraint {key}, which Sluice does not enforce"));
            }
            for rule in ["delta.invariants", "delta.generationExpression", "delta.identity", "delta.columnMapping"] {
                if m.schema_string.contains(rule) {
                    return refuse(format!("has columns with {rule}, which Sluice does not honour"));
                }
            }
        }
        if self.files.values().any(|a| a.deletion_vector.is_some()) {
            return refuse("has deletion vectors; Sluice rewrites files instead".into());
        }
        Ok(())
    }
}

/// One table's log on a store.
#[derive(Clone)]
pub(crate) struct Log {
    store: Arc<dyn ObjectStore>,
    /// The table's folder inside the store (no trailing slash; empty at the root).
    root: String,
}

/// `version` as the 20-digit name of its commit.
fn commit_name(version: i64) -> String {
    format!("_delta_log/{version:020}.json")
}

impl Log {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, root: String) -> Self {
        Self { store, root }
    }

    /// The store path of `name` inside the table's folder.
    pub(crate) fn path(&self, name: &str) -> StorePath {
        if self.root.is_empty() { StorePath::from(name) } else { StorePath::from(format!("{}/{name}", self.root)) }
    }

    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// `name`'s bytes; `None` when it does not exist.
    pub(crate) async fn get(&self, name: &str) -> Result<Option<bytes::Bytes>> {
        match self.store.get(&self.path(name)).await {
            Ok(found) => found.bytes().await.map(Some).map_err(store_error),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_error(e)),
        }
    }

    /// The table as its log has it now: the last checkpoint, then every commit after it.
    pub(crate) async fn load(&self) -> Result<Snapshot> {
        let mut snapshot = Snapshot::empty();
        if let Some(version) = self.last_checkpoint().await? {
            let name = format!("_delta_log/{version:020}.checkpoint.parquet");
            let bytes = self.get(&name).await?.ok_or_else(|| corrupt(&name, &"missing"))?;
            snapshot.apply(&super::checkpoint::read(bytes, &name)?);
            snapshot.version = version;
            snapshot.checkpoint = version;
        }
        self.refresh(&mut snapshot).await?;
        Ok(snapshot)
    }

    /// The version of the newest checkpoint: `_last_checkpoint` says, or, without it, the log's
    /// listing when its first commit is gone (another tool cleaned up, and the pointer is lost).
    async fn last_checkpoint(&self) -> Result<Option<i64>> {
        if let Some(pointer) = self.get("_delta_log/_last_checkpoint").await? {
            let pointer: Value = serde_json::from_slice(&pointer).map_err(|e| corrupt("_last_checkpoint", &e))?;
            if pointer.get("parts").is_some_and(|p| !p.is_null()) {
                return Err(corrupt("_last_checkpoint", &"a multi-part checkpoint, which Sluice does not read"));
            }
            let version = pointer["version"].as_i64().ok_or_else(|| corrupt("_last_checkpoint", &"no version"))?;
            return Ok(Some(version));
        }
        if self.get(&commit_name(0)).await?.is_some() {
            return Ok(None);
        }
        let logs = self.path("_delta_log");
        let listed = self.store.list_with_delimiter(Some(&logs)).await.map_err(store_error)?;
        Ok(listed
            .objects
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".checkpoint.parquet")?.parse::<i64>().ok())
            .max())
    }

    /// Read the commits after `snapshot.version` into it; how many there were.
    pub(crate) async fn refresh(&self, snapshot: &mut Snapshot) -> Result<usize> {
        let mut read = 0;
        loop {
            let name = commit_name(snapshot.version + 1);
            let Some(bytes) = self.get(&name).await? else { return Ok(read) };
            let text = String::from_utf8_lossy(&bytes);
            snapshot.apply(&parse(&text, &name)?);
            snapshot.version += 1;
            read += 1;
        }
    }

    /// Write `actions` as `version`, unless another writer has written it first
    /// ([`Commit::Taken`]).
    pub(crate) async fn commit(&self, version: i64, actions: &[Action]) -> Result<Commit> {
        let mut text = String::new();
        for action in actions {
            text.push_str(&serde_json::to_string(action).map_err(|e| corrupt("a new commit", &e))?);
            text.push('\n');
        }
        let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match self.store.put_opts(&self.path(&commit_name(version)), PutPayload::from(text), options).await {
            Ok(_) => Ok(Commit::Done),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {
                // A put retried after an answer that was lost finds its own commit there: it
                // is this attempt's (its `txnId`), not another writer's.
                let ours = actions.iter().find_map(|a| match a {
                    Action::CommitInfo(info) => info.get("txnId").and_then(Value::as_str),
                    _ => None,
                });
                let there = self.get(&commit_name(version)).await?;
                let landed = match (ours, there) {
                    (Some(id), Some(bytes)) => parse(&String::from_utf8_lossy(&bytes), "a commit")?.iter().any(|a| {
                        matches!(a, Action::CommitInfo(info) if info.get("txnId").and_then(Value::as_str) == Some(id))
                    }),
                    _ => false,
                };
                Ok(if landed { Commit::Done } else { Commit::Taken })
            }
            Err(e) => Err(store_error(e)),
        }
    }

    /// Put `bytes` as `name` in the table's folder (a data file or checkpoint).
    pub(crate) async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.store.put(&self.path(name), PutPayload::from(bytes)).await.map(|_| ()).map_err(store_error)
    }

    /// Remove `name`; a missing file is fine.
    pub(crate) async fn delete(&self, name: &str) -> Result<()> {
        match self.store.delete(&self.path(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(e)),
        }
    }
}

/// How a commit went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    Done,
    /// Another writer committed this version first.
    Taken,
}

pub(crate) fn store_error(e: object_store::Error) -> Error {
    let kind = match &e {
        object_store::Error::Generic { .. } => ErrorKind::Connect,
        object_store::Error::Unauthenticated { .. } | object_store::Error::PermissionDenied { .. } => ErrorKind::Config,
        _ => ErrorKind::Fatal,
    };
    Error::new(kind, format!("delta: {e}"))
}

/// A random UUID: a new table's id, and a commit attempt's `commitInfo.txnId` (how a writer
/// knows its own commit).
pub(crate) fn random_id() -> String {
    let hex = format!("{:032x}", rand::random::<u128>());
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_replay_into_the_live_files_and_versions() {
        let text = r#"{"commitInfo":{"operation":"WRITE"}}
{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}
{"metaData":{"id":"x","format":{"provider":"parquet","options":{}},"schemaString":"{}","partitionColumns":[],"configuration":{"a":"b"}}}
{"add":{"path":"p1.parquet","partitionValues":{},"size":10,"modificationTime":1,"dataChange":true}}
{"add":{"path":"p2.parquet","partitionValues":{},"size":10,"modificationTime":1,"dataChange":true}}
{"txn":{"appId":"s","version":3}}
{"domainMetadata":{"domain":"d","configuration":"{}","removed":false}}
"#;
        let mut snapshot = Snapshot::empty();
        snapshot.apply(&parse(text, "0").unwrap());
        snapshot
            .apply(&parse(r#"{"remove":{"path":"p1.parquet","deletionTimestamp":5,"dataChange":true}}"#, "1").unwrap());
        assert_eq!(snapshot.files.keys().collect::<Vec<_>>(), ["p2.parquet"]);
        assert_eq!(snapshot.removed.get("p1.parquet"), Some(&5));
        assert_eq!(snapshot.txns.get("s"), Some(&3));
        assert_eq!(snapshot.metadata.unwrap().configuration["a"], "b");
        assert!(parse("{not json", "2").unwrap_err().message().contains("not a Delta log"));
    }

    #[tokio::test]
    async fn a_log_whose_pointer_and_first_commits_are_gone_loads_from_its_newest_checkpoint() {
        let dir = std::env::temp_dir().join(format!("sluice-delta-log-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&dir).unwrap());
        let log = Log::new(store, "t".into());
        let mut at_five = Snapshot::empty();
        at_five.apply(
            &parse(
                r#"{"add":{"path":"a.parquet","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true}}"#,
                "0",
            )
            .unwrap(),
        );
        log.put(
            "_delta_log/00000000000000000005.checkpoint.parquet",
            super::super::checkpoint::write(&at_five).unwrap(),
        )
        .await
        .unwrap();
        let six =
            r#"{"add":{"path":"b.parquet","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true}}"#;
        log.put("_delta_log/00000000000000000006.json", six.as_bytes().to_vec()).await.unwrap();
        let snapshot = log.load().await.unwrap();
        assert_eq!((snapshot.version, snapshot.checkpoint), (6, 5));
        assert_eq!(snapshot.files.keys().collect::<Vec<_>>(), ["a.parquet", "b.parquet"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tables_with_features_sluice_cannot_honour_are_refused() {
        let mut snapshot = Snapshot::empty();
        snapshot.protocol = Some(Protocol {
            min_reader_version: 3,
            min_writer_version: 7,
            reader_features: Some(vec!["deletionVectors".into()]),
            writer_features: Some(vec!["deletionVectors".into()]),
        });
        assert!(snapshot.check_writable("t").unwrap_err().message().contains("deletionVectors"));
        snapshot.protocol = Some(Protocol {
            min_reader_version: 3,
            min_writer_version: 7,
            reader_features: Some(vec!["timestampNtz".into()]),
            writer_features: Some(vec!["timestampNtz".into()]),
        });
        assert!(snapshot.check_writable("t").is_ok());
    }
}
