//! The workspace sink and state store on a real DuckDB file.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::json;
use sluice_connectors::workspace::{QueryLimits, QueryResult, Workspace};
use sluice_core::{
    Checkpoint, Decoder, MetadataConfig, Payload, Position, Record, RecordMeta, Sink, StateStore, WriteUnit,
};

fn records(values: Vec<serde_json::Value>) -> Vec<Record> {
    values
        .into_iter()
        .map(|v| Record {
            payload: Payload::Json(v),
            meta: RecordMeta { received_us: 1_700_000_000_000_000, ..Default::default() },
        })
        .collect()
}

async fn query(ws: &Workspace, sql: &str, rows: usize) -> sluice_core::Result<QueryResult> {
    let limits = QueryLimits { rows, max_bytes: 1 << 20 };
    ws.query(sql.into(), limits, std::time::Duration::from_secs(30), std::future::pending())
        .await
        .map_err(|e| sluice_core::Error::new(sluice_core::ErrorKind::Data, e.message))
}

async fn write(ws: &Workspace, decoder: &mut Decoder, cp: &mut Checkpoint, values: Vec<serde_json::Value>) {
    let (decoded, pending) = decoder.decode(records(values), cp.sequence + 1).unwrap();
    let next = Checkpoint {
        position: Position(json!(decoded.last_sequence)),
        sequence: decoded.last_sequence,
        totals: Default::default(),
    };
    let unit = WriteUnit {
        stream: "s".into(),
        tables: decoded.tables,
        rejects: decoded.rejects.finish(),
        idempotency: Vec::new(),
        replayed: Vec::new(),
        checkpoint: next.clone(),
    };
    ws.write(std::sync::Arc::new(unit)).await.unwrap();
    decoder.commit(pending);
    *cp = next;
}

#[tokio::test]
async fn evolves_and_reads_back() {
    let dir = std::env::temp_dir().join(format!("sluice-ws-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ws = Workspace::open(&dir).unwrap();
    let meta = MetadataConfig { received_at: true, position: true, ..Default::default() };
    let mut decoder = Decoder::new("t".into(), meta, HashMap::new());
    let mut cp = Checkpoint::default();
    let started = Instant::now();
    write(&ws, &mut decoder, &mut cp, vec![
        json!({"id": 1, "at": "2024-01-01T00:00:00+02:00", "tags": ["a"], "user": {"name": "x", "geo": {"lat": 1.5}}}),
        json!({"id": 2, "day": "2024-02-03", "ok": true}),
    ]).await;
    write(&ws, &mut decoder, &mut cp, vec![json!({"id": 2.5, "new": "col", "ok": "nope"})]).await;
    assert!(started.elapsed().as_secs() < 60);

    let schema = ws.table_schema("t").await.unwrap().unwrap();
    let cols: Vec<(String, String)> =
        schema.columns().iter().map(|c| (c.name.clone(), c.ty.sql().to_string())).collect();
    assert!(cols.contains(&("id".into(), "DOUBLE".into())), "{cols:?}");
    assert!(cols.contains(&("tags".into(), "JSON".into())), "{cols:?}");
    assert!(cols.contains(&("user__geo__lat".into(), "DOUBLE".into())), "{cols:?}");
    assert!(cols.contains(&("at".into(), "TIMESTAMPTZ".into())), "{cols:?}");
    assert!(cols.contains(&("day".into(), "DATE".into())), "{cols:?}");

    let r = query(
        &ws,
        r#"SELECT id, tags->>0 AS tag, epoch("at")::BIGINT AS "at", ok, new, _position FROM t ORDER BY _position"#,
        100,
    )
    .await
    .unwrap();
    let rows = r.rows().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["tag"], json!("a"));
    assert_eq!(rows[0]["at"], json!(1704060000));
    assert_eq!(rows[2]["id"], json!(2.5));
    assert_eq!(rows[2].get("ok"), Some(&json!(null)), "misfit is NULL: {:?}", rows[2]);
    let rejects =
        query(&ws, "SELECT \"column\", expected_type, value, position FROM sluice.rejects", 10).await.unwrap();
    let rejects = rejects.rows().unwrap();
    assert_eq!(rejects.len(), 1);
    assert_eq!(rejects[0]["column"], json!("ok"));
    assert_eq!(rejects[0]["expected_type"], json!("BOOLEAN"));
    assert_eq!(rejects[0]["value"], json!("\"nope\""));
    assert_eq!(rejects[0]["position"], json!(3));
    let stored = ws.checkpoint("s").await.unwrap().unwrap();
    assert_eq!(stored.sequence, 3);

    for bad in ["DELETE FROM t", "SELECT 1; SELECT 2", "CREATE TABLE x AS SELECT 1", "PRAGMA version", "ATTACH 'x.db'"]
    {
        assert!(query(&ws, bad, 10).await.is_err(), "{bad} must be refused");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A row DuckDB refuses (text that is not a UUID, for a UUID column) is found by trying parts of
/// the unit and rolling them back; the rest is written and the row is a ledger row.
#[tokio::test]
async fn rows_the_workspace_refuses_are_isolated_by_rolled_back_tries() {
    use arrow::array::{ArrayRef, StringArray};
    use sluice_core::quarantine::{Isolated, isolate};
    use sluice_core::schema::{Column, SchemaChange};
    use sluice_core::{ColumnType, TableWrite};

    let dir = std::env::temp_dir().join(format!("sluice-ws-quarantine-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ws = Workspace::open(&dir).unwrap();
    let ids: ArrayRef = std::sync::Arc::new(StringArray::from(vec![
        "0b9b6a4e-3f1c-4a51-9d3a-7e2f1b8c9d01",
        "not a uuid",
        "5f0c2b7e-8a43-4e6b-b1d2-c3a4e5f60789",
    ]));
    let data = arrow::record_batch::RecordBatch::try_from_iter(vec![("id", ids)]).unwrap();
    let table = TableWrite {
        table: "q".into(),
        changes: vec![SchemaChange::Create(vec![Column { name: "id".into(), ty: ColumnType::Uuid }])],
        brought_by: Vec::new(),
        data,
        mirror: None,
        snapshot: None,
    };
    let checkpoint = Checkpoint { position: Position(json!(1)), sequence: 3, totals: Default::default() };
    let unit = WriteUnit {
        stream: "s".into(),
        tables: vec![table],
        rejects: Default::default(),
        idempotency: Vec::new(),
        replayed: Vec::new(),
        checkpoint,
    };
    let error = ws.write(std::sync::Arc::new(unit.clone())).await.expect_err("DuckDB refuses the text");
    let Isolated::Cleaned(cleaned, refused) = isolate(&ws, &unit, &error, 0).await else {
        panic!("the refused row was not isolated");
    };
    assert_eq!(refused, 1);
    // Nothing of the tries was kept.
    assert!(ws.table_schema("q").await.unwrap().is_none());
    ws.write(std::sync::Arc::from(cleaned)).await.unwrap();
    let rows = query(&ws, "SELECT count(*) AS n FROM q", 10).await.unwrap().rows().unwrap();
    assert_eq!(rows[0]["n"], json!(2));
    let ledger = query(&ws, "SELECT value, reason FROM sluice.rejects", 10).await.unwrap().rows().unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["value"], json!(r#"{"id":"not a uuid"}"#));
    assert!(ledger[0]["reason"].as_str().unwrap().contains("refused"), "{ledger:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
