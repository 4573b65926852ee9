//! Two writes of one stream side by side, on two sessions of a Postgres destination (how a
//! snapshot's chunks load two at a time): the one beside loads its rows while the one before
//! commits, and commits only once the run loop says that one is durable; never if it failed.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::Int64Array;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use serde_json::json;
use sluice_connectors::postgres::{PostgresTableConfig, PostgresTarget};
use sluice_core::sink::Preceding;
use sluice_core::{Delivery, Destination, ErrorKind, Stamp, SyncMode};
use tokio::sync::Mutex;

use crate::harness::wait_until;
use crate::postgres::Postgres;

fn rows(ids: std::ops::Range<i64>) -> Delivery {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(ids))]).unwrap();
    Delivery {
        sync: "s".into(),
        run_id: String::new(),
        mode: SyncMode::Append,
        keys: Vec::new(),
        schema,
        rows: vec![batch],
        deletes: Vec::new(),
        table: Some("chunks".into()),
        copy: None,
        keep: Vec::new(),
        multiset: false,
    }
}

fn stamp(checkpoint: &str) -> Stamp {
    Stamp { owner: "s".into(), checkpoint: checkpoint.into() }
}

fn target(pg: &Postgres) -> Arc<Mutex<PostgresTarget>> {
    let config: PostgresTableConfig = serde_json::from_value(json!({
        "host": "127.0.0.1", "port": pg.port, "database": "etltest", "user": "etl", "password": "etl",
        "schema": "public", "table": "chunks"}))
    .unwrap();
    Arc::new(Mutex::new(PostgresTarget::new(config)))
}

/// A write of `ids` with `checkpoint` beside the write before, on `lane`, on its own task.
fn beside(
    lane: &Arc<Mutex<PostgresTarget>>,
    ids: std::ops::Range<i64>,
    checkpoint: &'static str,
    previous: Preceding,
) -> tokio::task::JoinHandle<sluice_core::Result<()>> {
    let lane = lane.clone();
    tokio::spawn(async move { lane.lock().await.write_after(&[rows(ids)], Some(&stamp(checkpoint)), previous).await })
}

/// Whether a session has loaded rows into `chunks` and waits, its transaction open.
fn loaded_and_waiting(pg: &Postgres) -> bool {
    pg.lines(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.relation = 'public.chunks'::regclass AND l.mode = 'RowExclusiveLock' \
           AND a.state = 'idle in transaction'",
    ) == ["1"]
}

#[tokio::test]
async fn a_write_beside_the_one_before_loads_at_once_and_commits_only_after_it() {
    let pg = Postgres::start();
    let count = || pg.lines("SELECT count(*) FROM chunks")[0].parse::<i64>().unwrap();
    let held = || pg.lines("SELECT checkpoint FROM sluice_positions WHERE owner = 's'");
    let wait = || {
        wait_until("rows loaded, waiting for the write before", Duration::from_secs(30), || async {
            loaded_and_waiting(&pg)
        })
    };
    let (first, second) = (target(&pg), target(&pg));
    first.lock().await.write(&[rows(0..10)], Some(&stamp("a"))).await.unwrap();

    // The write before is in flight: the one beside it loads its rows, then waits for it.
    let (done, previous) = Preceding::new();
    let write = beside(&second, 10..20, "b", previous);
    wait().await;
    assert!(!write.is_finished(), "the write beside committed before the one before it was durable");
    assert_eq!((held(), count()), (vec!["a".to_string()], 10));
    done.send_replace(Some(true));
    write.await.unwrap().unwrap();
    assert_eq!((held(), count()), (vec!["b".to_string()], 20));

    // The write before failed: the one beside it rolls back, retryably.
    let (done, previous) = Preceding::new();
    let write = beside(&first, 20..30, "c", previous);
    wait().await;
    done.send_replace(Some(false));
    let refused = write.await.unwrap().unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Transient, "{refused}");
    assert_eq!((held(), count()), (vec!["b".to_string()], 20), "no row of a write whose predecessor failed");

    // The write before was stopped (its sender dropped with its task): the same.
    let (done, previous) = Preceding::new();
    let write = beside(&second, 20..30, "c", previous);
    wait().await;
    drop(done);
    assert_eq!(write.await.unwrap().unwrap_err().kind(), ErrorKind::Transient);
    assert_eq!((held(), count()), (vec!["b".to_string()], 20));

    // The write beside is itself stopped while it waits (the run loop aborts it): its rows never
    // land, and its lane's next write lands. (A write stopped in the middle of its COPY leaves
    // its session unused too, by the same `busy` mark; this one is stopped between statements.)
    let (_done, previous) = Preceding::new();
    let write = beside(&first, 20..30, "c", previous);
    wait().await;
    write.abort();
    assert!(write.await.unwrap_err().is_cancelled());
    let (done, previous) = Preceding::new();
    done.send_replace(Some(true));
    first.lock().await.write_after(&[rows(30..40)], Some(&stamp("d")), previous).await.unwrap();
    wait_until("the stopped write's session to end", Duration::from_secs(30), || async {
        pg.lines("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'") == ["0"]
    })
    .await;
    assert_eq!((held(), count()), (vec!["d".to_string()], 30));
    assert_eq!(pg.lines("SELECT count(*) FROM chunks WHERE id BETWEEN 20 AND 29"), ["0"]);
}

/// The write before needs a lock the write beside holds (the same value of a unique index),
/// which Postgres cannot see as a deadlock, as the write beside waits in Sluice: the write
/// beside notices, rolls back retryably, and the write before goes on. Tried again, the write
/// beside is refused for the value, which the run loop then sends to the ledger.
#[tokio::test]
async fn a_write_beside_gives_way_when_the_write_before_waits_for_its_lock() {
    let pg = Postgres::start();
    let held = || pg.lines("SELECT checkpoint FROM sluice_positions WHERE owner = 's'");
    let (first, second) = (target(&pg), target(&pg));
    first.lock().await.write(&[rows(0..10)], Some(&stamp("a"))).await.unwrap();
    pg.sql("CREATE UNIQUE INDEX chunks_id ON chunks (id)");

    let (done, previous) = Preceding::new();
    let write = beside(&second, 100..110, "c", previous.clone());
    wait_until("rows loaded, waiting for the write before", Duration::from_secs(30), || async {
        loaded_and_waiting(&pg)
    })
    .await;
    // The write before inserts 105, which the write beside holds uncommitted.
    let before = {
        let first = first.clone();
        tokio::spawn(async move { first.lock().await.write(&[rows(105..106)], Some(&stamp("b"))).await })
    };
    let gave_way = tokio::time::timeout(Duration::from_secs(60), write).await.expect("the two writes hung");
    let error = gave_way.unwrap().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Transient, "{error}");
    assert!(error.to_string().contains("waits for a lock"), "{error}");
    tokio::time::timeout(Duration::from_secs(60), before).await.expect("the write before hung").unwrap().unwrap();
    done.send_replace(Some(true));
    assert_eq!(held(), ["b"]);
    // Tried again behind it: refused for 105, as one write at a time would have been.
    let again = beside(&second, 100..110, "c", previous).await.unwrap().unwrap_err();
    assert!(again.to_string().contains("duplicate key"), "{again}");
    assert_eq!(held(), ["b"]);
    assert_eq!(pg.lines("SELECT count(*) FROM chunks WHERE id >= 100"), ["1"]);
}

/// A lock the write could not get in time (the role's `lock_timeout`), like a deadlock or a
/// serialization failure, is an error to try again, not a refusal of the rows: the run loop
/// retries it instead of looking for rows at fault.
#[tokio::test]
async fn a_lock_not_granted_in_time_is_retryable() {
    let pg = Postgres::start();
    let first = target(&pg);
    first.lock().await.write(&[rows(0..10)], Some(&stamp("a"))).await.unwrap();
    pg.sql("ALTER ROLE etl SET lock_timeout = '300ms'");
    let dir = std::env::temp_dir().join(format!("sluice-lanes-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut holder = pg.run_script(
        &dir.join("hold.sql"),
        "BEGIN; LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(3); COMMIT;\n",
    );
    wait_until("the table locked by another session", Duration::from_secs(30), || async {
        pg.lines("SELECT count(*) FROM pg_locks WHERE relation = 'public.chunks'::regclass AND mode = 'AccessExclusiveLock' AND granted")
            == ["1"]
    })
    .await;
    // A new session, which takes the role's lock_timeout.
    let second = target(&pg);
    let refused = second.lock().await.write(&[rows(10..20)], Some(&stamp("b"))).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Transient, "{refused}");
    assert!(holder.wait().unwrap().success());
    second.lock().await.write(&[rows(10..20)], Some(&stamp("b"))).await.unwrap();
    assert_eq!(pg.lines("SELECT count(*) FROM chunks"), ["20"]);
    let _ = std::fs::remove_dir_all(&dir);
}
