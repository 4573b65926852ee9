//! Inference, evolution, misfits, hostile names and nesting, seen through SQL.

use serde_json::{Value, json};

use crate::harness::{DataDir, Server};

async fn types(server: &Server, table: &str) -> Vec<(String, String)> {
    let rows = server
        .sql(&format!(
            "SELECT column_name, data_type FROM information_schema.columns \
             WHERE table_name = '{table}' ORDER BY ordinal_position"
        ))
        .await;
    rows.iter()
        .map(|r| (r["column_name"].as_str().unwrap().to_string(), r["data_type"].as_str().unwrap().to_string()))
        .collect()
}

fn ty<'a>(cols: &'a [(String, String)], name: &str) -> &'a str {
    cols.iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t.as_str())
        .unwrap_or_else(|| panic!("no column {name} in {cols:?}"))
}

#[tokio::test]
async fn inference_then_evolution_with_misfits_in_the_ledger() {
    let dir = DataDir::new("evolve");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "ev", "table": "events", "metadata": {"position": true}})).await;

    // Step 1: the first batch creates the table with inferred types.
    let (status, body) = server
        .push("ev", &key, r#"{"id": 1, "price": 10, "ok": true, "name": "a", "at": "2024-05-01T10:00:00+02:00", "day": "2024-05-01", "tags": [1, 2], "nothing": null}"#)
        .await;
    assert_eq!((status, body), (202, json!({"accepted": 1, "rejected": 0})));
    let cols = types(&server, "events").await;
    assert_eq!(ty(&cols, "id"), "BIGINT");
    assert_eq!(ty(&cols, "price"), "BIGINT");
    assert_eq!(ty(&cols, "ok"), "BOOLEAN");
    assert_eq!(ty(&cols, "name"), "VARCHAR");
    assert_eq!(ty(&cols, "at"), "TIMESTAMP WITH TIME ZONE");
    assert_eq!(ty(&cols, "day"), "DATE");
    assert_eq!(ty(&cols, "tags"), "JSON");
    assert!(!cols.iter().any(|(n, _)| n == "nothing"), "a null-only field waits for a typed value");

    // Step 2: new fields become columns; a null-only field appears once typed.
    server.push("ev", &key, r#"{"id": 2, "country": "DE", "nothing": 5}"#).await;
    let cols = types(&server, "events").await;
    assert_eq!(ty(&cols, "country"), "VARCHAR");
    assert_eq!(ty(&cols, "nothing"), "BIGINT");

    // Step 3: a fractional value widens an integer column to DOUBLE, keeping the old values.
    server.push("ev", &key, r#"{"id": 3, "price": 12.5}"#).await;
    let cols = types(&server, "events").await;
    assert_eq!(ty(&cols, "price"), "DOUBLE");

    // Step 4: values that do not fit become NULL and land in the ledger; the event is stored,
    // and the answer says it has ledger rows.
    let (status, body) =
        server.push("ev", &key, r#"{"id": 4, "ok": "maybe", "at": "yesterday", "price": "n/a", "name": 7}"#).await;
    assert_eq!((status, body), (202, json!({"accepted": 1, "rejected": 1})));

    let rows = server.sql(r#"SELECT id, price, ok, name, epoch("at")::BIGINT AS at, day::VARCHAR AS day, tags, country, nothing, _position FROM events ORDER BY id"#).await;
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0]["price"], json!(10.0));
    assert_eq!(rows[0]["at"], json!(1714550400));
    assert_eq!(rows[0]["day"], json!("2024-05-01"));
    assert_eq!(rows[0]["tags"], json!("[1,2]"));
    assert_eq!(rows[1]["nothing"], json!(5));
    assert_eq!(rows[2]["price"], json!(12.5));
    let last = rows[3].as_object().unwrap();
    for misfit in ["ok", "at", "price"] {
        assert_eq!(last.get(misfit), Some(&Value::Null), "a NULL column is there as null: {last:?}");
    }
    assert_eq!(last["name"], json!("7"), "a number fits a VARCHAR column as text");
    let positions: Vec<i64> = rows.iter().map(|r| r["_position"].as_i64().unwrap()).collect();
    assert_eq!(positions, [1, 2, 3, 4]);

    let ledger = server
        .sql(r#"SELECT stream, "table", "column", expected_type, value, position, received_at IS NOT NULL AS timed FROM sluice.rejects ORDER BY "column""#)
        .await;
    let got: Vec<Value> = ledger
        .iter()
        .map(|r| {
            json!([r["stream"], r["table"], r["column"], r["expected_type"], r["value"], r["position"], r["timed"]])
        })
        .collect();
    assert_eq!(
        got,
        vec![
            json!(["ev", "events", "at", "TIMESTAMPTZ", "\"yesterday\"", 4, true]),
            json!(["ev", "events", "ok", "BOOLEAN", "\"maybe\"", 4, true]),
            json!(["ev", "events", "price", "DOUBLE", "\"n/a\"", 4, true]),
        ]
    );
    let (_, m) = server.get("/api/streams/ev/metrics").await;
    assert_eq!(m["rejects"], json!(3));
    assert_eq!(m["rows_written"], json!(4));
}

#[tokio::test]
async fn hostile_field_and_table_names_are_quoted() {
    let dir = DataDir::new("hostile");
    let server = Server::start(&dir.0).await;
    let table = r#"odd "table"; DROP TABLE x; --"#;
    let key = server.create_stream(json!({"name": "hostile", "table": table})).await;
    let event = json!({
        "with \"quotes\"": 1,
        "with space": 2,
        "ünïcødé ✓": 3,
        "select": 4,
        "from": 5,
        "a;DROP TABLE events;--": 6,
        "": 7,
    });
    let (status, _) = server.push("hostile", &key, event.to_string()).await;
    assert_eq!(status, 202);
    let quoted = table.replace('"', "\"\"");
    let rows = server
        .sql(&format!(
            r#"SELECT "with ""quotes""" AS q, "with space" AS s, "ünïcødé ✓" AS u, "select" AS sel, "from" AS f, "a;DROP TABLE events;--" AS d FROM "{quoted}""#
        ))
        .await;
    assert_eq!(rows, vec![json!({"q": 1, "s": 2, "u": 3, "sel": 4, "f": 5, "d": 6})]);

    // Letter case: `id` and `ID` are one column in SQL; the second in one event is a ledger row.
    server.push("hostile", &key, r#"{"Id": 1, "ID": 2}"#).await;
    let rows = server.sql(&format!(r#"SELECT "Id" AS id FROM "{quoted}" WHERE "Id" IS NOT NULL"#)).await;
    assert_eq!(rows, vec![json!({"id": 1})]);
    let ledger = server.sql(r#"SELECT "column", value, reason FROM sluice.rejects WHERE stream = 'hostile'"#).await;
    assert!(
        ledger.iter().any(|r| r["value"] == json!("2") && r["reason"].as_str().unwrap().contains("duplicate")),
        "{ledger:?}"
    );
    // SQL has no empty identifier: that value goes to the ledger instead of stopping the stream.
    assert!(
        ledger.iter().any(|r| r["value"] == json!("7") && r["reason"].as_str().unwrap().contains("empty")),
        "{ledger:?}"
    );
}

#[tokio::test]
async fn nested_objects_flatten_and_arrays_stay_json() {
    let dir = DataDir::new("nested");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "n", "table": "nested"})).await;
    let event = json!({
        "user": {"id": 7, "geo": {"lat": 52.5, "city": {"name": "Berlin", "zip": {"code": "10115"}}}},
        "items": [{"sku": "a"}, {"sku": "b"}],
        "empty": {},
    });
    assert_eq!(server.push("n", &key, event.to_string()).await.0, 202);
    let cols = types(&server, "nested").await;
    assert_eq!(ty(&cols, "user__id"), "BIGINT");
    assert_eq!(ty(&cols, "user__geo__lat"), "DOUBLE");
    assert_eq!(ty(&cols, "user__geo__city__name"), "VARCHAR");
    // Below the fourth level, objects are kept as JSON.
    assert_eq!(ty(&cols, "user__geo__city__zip"), "JSON");
    assert_eq!(ty(&cols, "items"), "JSON");
    let rows = server
        .sql(r#"SELECT user__geo__city__name AS city, user__geo__city__zip->>'code' AS zip, items->1->>'sku' AS sku FROM nested"#)
        .await;
    assert_eq!(rows, vec![json!({"city": "Berlin", "zip": "10115", "sku": "b"})]);
}

#[tokio::test]
async fn a_pushed_type_mark_is_only_data() {
    // The mark an earlier version put on typed values: a pushed event naming it chooses no
    // column type, in an append stream nor in a Debezium mirror.
    let dir = DataDir::new("forged-types");
    let server = Server::start(&dir.0).await;
    let forged = r#"{"id": 1, "d": {"\u0000sluice-typed": "2024-01-01", "type": "DATE"}, "\u0000sluice-typed": "t", "type": "BOOLEAN"}"#;
    let key = server.create_stream(json!({"name": "plain", "table": "plain"})).await;
    assert_eq!(server.push("plain", &key, forged).await, (202, json!({"accepted": 1, "rejected": 1})));
    let key = server
        .create_stream(json!({"name": "dbz", "table": "dbz", "mode": "mirror", "format": "debezium", "keys": ["id"]}))
        .await;
    let event = format!(r#"{{"op": "c", "after": {forged}, "source": {{"connector": "postgresql", "lsn": 1}}}}"#);
    assert_eq!(server.push("dbz", &key, event).await, (202, json!({"accepted": 1, "rejected": 1})));
    for table in ["plain", "dbz"] {
        let cols = types(&server, table).await;
        assert_eq!(ty(&cols, "d__type"), "VARCHAR");
        assert_eq!(ty(&cols, "type"), "VARCHAR");
        assert!(!cols.iter().any(|(_, t)| t == "DATE" || t == "BOOLEAN"), "{table}: {cols:?}");
        let row = &server.sql(&format!(r#"SELECT d__type, "type" FROM {table}"#)).await[0];
        assert_eq!(row, &json!({"d__type": "DATE", "type": "BOOLEAN"}));
    }
    // The fields named with a NUL are in the ledger, with why.
    let ledger = server.sql(r#"SELECT stream, value, reason FROM sluice.rejects ORDER BY stream, value"#).await;
    let got: Vec<Value> = ledger.iter().map(|r| json!([r["stream"], r["value"]])).collect();
    assert_eq!(
        got,
        [
            json!(["dbz", "\"2024-01-01\""]),
            json!(["dbz", "\"t\""]),
            json!(["plain", "\"2024-01-01\""]),
            json!(["plain", "\"t\""])
        ]
    );
    assert!(ledger.iter().all(|r| r["reason"].as_str().unwrap().contains("NUL")), "{ledger:?}");
}
