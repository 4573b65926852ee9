//! Tables without a primary key (REPLICA IDENTITY FULL) mirrored next to a keyed one: identical
//! rows are counted, an unchanged TOASTed value is kept, and a kill -9 while changes stream in
//! loses and repeats nothing.

use std::time::Duration;

use serde_json::json;

use crate::harness::{DataDir, Server, wait_until};
use crate::kafka::wait_rows;
use crate::postgres::Postgres;

/// Every row of the keyless table, with a digest of the long value, as text lines in one order.
const SOURCE_ROWS: &str = "SELECT id, coalesce(v, '-'), coalesce(md5(body), '-'), length(body) FROM dup \
                           ORDER BY id, v NULLS FIRST, md5(body) NULLS FIRST";
const MIRROR_ROWS: &str = "SELECT id::VARCHAR, coalesce(v, '-'), coalesce(md5(body), '-'), length(body)::VARCHAR \
                           FROM dup ORDER BY id, v NULLS FIRST, md5(body) NULLS FIRST";

#[tokio::test]
async fn identical_rows_are_counted_and_unchanged_toast_is_kept_across_kill_9() {
    let pg = Postgres::start();
    // 9,600 characters of hex: stored out of line (TOASTed), so an update of another column does
    // not send it again.
    pg.sql(
        "CREATE TABLE dup (id int, v text, body text); ALTER TABLE dup REPLICA IDENTITY FULL;
         INSERT INTO dup VALUES (1, 'same', NULL), (1, 'same', NULL), (1, 'same', NULL), (2, NULL, NULL);
         INSERT INTO dup SELECT 3, 'long', string_agg(md5(i::text), '') FROM generate_series(1, 300) i;
         CREATE TABLE dd (a int, b text, gone text); ALTER TABLE dd REPLICA IDENTITY FULL;
         INSERT INTO dd VALUES (1, 'x', 'g'), (1, 'x', 'g'), (3, 'keep', 'g');
         CREATE TABLE keyed (id int PRIMARY KEY, n int);
         INSERT INTO keyed VALUES (1, 0);",
    );
    let dir = DataDir::new("pg-keyless-dup");
    let mut server = Server::start(&dir.0).await;
    let src = json!({"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                     "user": "etl", "password": "etl", "tables": ["public.dup", "public.dd", "public.keyed"]});
    server
        .create_stream(json!({"name": "k", "table": "[table]", "history": true, "source": src,
                              "flush": {"max_wait_ms": 20}}))
        .await;
    wait_rows(&server, "dup", 5, Duration::from_secs(60)).await;
    assert_eq!(server.lines(MIRROR_ROWS).await, pg.lines(SOURCE_ROWS));

    // One of three identical rows deleted, another updated; two more identical ones inserted in
    // one transaction; the long value left alone by an update of its row.
    pg.sql(
        "DELETE FROM dup WHERE ctid = (SELECT min(ctid) FROM dup WHERE id = 1);
         UPDATE dup SET v = 'changed' WHERE ctid = (SELECT max(ctid) FROM dup WHERE id = 1);
         BEGIN; INSERT INTO dup VALUES (2, NULL, NULL), (2, NULL, NULL); COMMIT;
         UPDATE dup SET v = 'long, updated' WHERE id = 3;",
    );
    // DDL on a keyless table: a column dropped (kept in the mirror, NULL from then on) and a
    // type widened, then one of two identical rows deleted and the other updated.
    pg.sql(
        "ALTER TABLE dd DROP COLUMN gone; ALTER TABLE dd ALTER COLUMN a TYPE bigint;
         DELETE FROM dd WHERE ctid = (SELECT min(ctid) FROM dd WHERE a = 1);
         UPDATE dd SET b = 'y' WHERE a = 1; INSERT INTO dd VALUES (2, 'z');",
    );
    wait_until("the keyless table with DDL to match", Duration::from_secs(60), || async {
        server.lines("SELECT a::VARCHAR, b, coalesce(gone, '-') FROM dd ORDER BY a").await
            == ["1|y|-", "2|z|-", "3|keep|g"]
    })
    .await;
    assert_eq!(pg.lines("SELECT a, b FROM dd ORDER BY a"), ["1|y", "2|z", "3|keep"]);
    let want = pg.lines(SOURCE_ROWS);
    assert_eq!(want.iter().filter(|l| l.starts_with("1|same|")).count(), 1, "{want:?}");
    assert!(want.iter().any(|l| l.starts_with("3|long, updated|") && l.ends_with("|9600")), "{want:?}");
    wait_until("the keyless mirror to match", Duration::from_secs(60), || async {
        server.lines(MIRROR_ROWS).await == want
    })
    .await;

    // A kill -9 while changes stream: psql runs 300 transactions of inserts and deletes of
    // identical rows and keyed updates, paced 30 ms apart, in the background.
    let mut script = String::new();
    for i in 0..300 {
        script.push_str(&format!(
            "BEGIN; INSERT INTO dup VALUES (4, 'x', NULL), (4, 'x', NULL);
             DELETE FROM dup WHERE ctid = (SELECT min(ctid) FROM dup WHERE id = 4);
             UPDATE keyed SET n = n + 1 WHERE id = 1; INSERT INTO keyed VALUES ({}, {i}); COMMIT; SELECT pg_sleep(0.03);\n",
            i + 10
        ));
    }
    let mut writer = pg.run_script(&dir.0.join("writes.sql"), &script);
    wait_until("some streamed rows", Duration::from_secs(60), || async {
        server.sql("SELECT count(*) AS n FROM keyed").await[0]["n"].as_i64().unwrap_or(0) > 20
    })
    .await;
    server.kill9();
    let running = writer.try_wait().unwrap().is_none();
    server = Server::start(&dir.0).await;
    assert!(writer.wait().unwrap().success());
    assert!(running, "the writes ended before the kill: it tests nothing");
    let want = pg.lines(SOURCE_ROWS);
    let keyed = pg.lines("SELECT id, n FROM keyed ORDER BY id");
    wait_until("both tables to match after the kill", Duration::from_secs(90), || async {
        server.lines(MIRROR_ROWS).await == want
            && server.lines("SELECT id::VARCHAR, n::VARCHAR FROM keyed ORDER BY id").await == keyed
    })
    .await;
    let fours = want.iter().filter(|l| l.starts_with("4|")).count();
    assert!(fours >= 60, "identical rows kept by count: {fours}");
    let history = server.sql("SELECT count(*) AS n FROM keyed__changes WHERE _op = 'insert'").await;
    assert_eq!(history[0]["n"].as_i64(), Some(keyed.len() as i64 - 1), "each insert recorded once");
    let (_, stream) = server.get("/api/streams/k").await;
    assert_eq!(stream["metrics"]["state"], "running", "{stream}");
    assert_eq!(server.sql("SELECT count(*) AS n FROM sluice.rejects").await[0]["n"], 0);
}
