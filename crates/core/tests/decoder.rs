//! Decoder golden cases: records in, schema changes, rows and rejects out.

use std::collections::HashMap;

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int64Type;
use serde_json::{Value, json};
use sluice_core::schema::{Column, SchemaChange};
use sluice_core::{ColumnType, Decoder, MetadataConfig, Payload, Record, RecordMeta, TableSchema};

fn rec(v: Value) -> Record {
    Record { payload: Payload::Json(v), meta: RecordMeta { received_us: 7, ..RecordMeta::default() } }
}

fn col(name: &str, ty: ColumnType) -> Column {
    Column { name: name.into(), ty }
}

#[test]
fn first_batch_creates_with_batch_order_and_types() {
    let mut d = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new());
    let (out, pending) = d
        .decode(vec![rec(json!({"b": 1, "a": {"x": true}})), rec(json!({"c": "2024-01-01T00:00:00Z", "b": 2}))], 1)
        .unwrap();
    d.commit(pending);
    assert_eq!(out.events, 2);
    assert_eq!(out.last_sequence, 2);
    let w = &out.tables[0];
    assert_eq!(
        w.changes,
        vec![SchemaChange::Create(vec![
            col("b", ColumnType::Bigint),
            col("a__x", ColumnType::Boolean),
            col("c", ColumnType::Timestamptz)
        ])]
    );
    assert_eq!(w.data.num_rows(), 2);
    assert_eq!(w.data.column(2).null_count(), 1);

    // Next batch: an existing table only gets additions.
    let (out, _) = d.decode(vec![rec(json!({"b": 3, "d": [1]}))], 3).unwrap();
    assert_eq!(out.tables[0].changes, vec![SchemaChange::Add(col("d", ColumnType::Json))]);
    assert_eq!(out.tables[0].data.num_columns(), 4);
}

#[test]
fn fields_find_their_columns_whatever_shape_the_last_event_had() {
    // A field's column is first guessed from where the field at its place in the last event
    // went: a wrong guess must change nothing. Names that differ only in case, as a table made
    // elsewhere may have, each keep their own column.
    let existing = TableSchema::existing(vec![
        col("Foo", ColumnType::Bigint),
        col("foo", ColumnType::Bigint),
        col("a", ColumnType::Bigint),
    ]);
    let d = Decoder::new("t".into(), MetadataConfig::default(), HashMap::from([("t".to_string(), existing)]));
    let events =
        [r#"{"Foo":1,"foo":2,"a":3}"#, r#"{"foo":4,"Foo":5,"a":6}"#, r#"{"a":7,"FOO":8}"#, r#"{"b":9,"a":10}"#];
    let raw =
        |e: &&str| Record { payload: Payload::Bytes(bytes::Bytes::from(e.to_string())), meta: RecordMeta::default() };
    let parsed = |e: &&str| rec(serde_json::from_str(e).unwrap());
    for records in [events.iter().map(raw).collect::<Vec<_>>(), events.iter().map(parsed).collect()] {
        let (out, _) = d.decode(records, 1).unwrap();
        let data = &out.tables[0].data;
        let column = |i: usize| data.column(i).as_primitive::<Int64Type>().iter().collect::<Vec<_>>();
        assert_eq!(column(0), [Some(1), Some(5), None, None]);
        // Another spelling goes to the column named as its lower case.
        assert_eq!(column(1), [Some(2), Some(4), Some(8), None]);
        assert_eq!(column(2), [Some(3), Some(6), Some(7), Some(10)]);
        assert_eq!(column(3), [None, None, None, Some(9)]);
    }
    // The other order: `foo` made first keeps its own name when `Foo` comes after it (the index
    // used to point `foo` at the later column).
    let existing = TableSchema::existing(vec![col("foo", ColumnType::Bigint), col("Foo", ColumnType::Bigint)]);
    let d = Decoder::new("t".into(), MetadataConfig::default(), HashMap::from([("t".to_string(), existing)]));
    let events = [r#"{"foo":1,"Foo":2}"#, r#"{"Foo":3,"foo":4}"#, r#"{"FOO":5}"#];
    for records in [events.iter().map(raw).collect::<Vec<_>>(), events.iter().map(parsed).collect()] {
        let (out, _) = d.decode(records, 1).unwrap();
        let data = &out.tables[0].data;
        let column = |i: usize| data.column(i).as_primitive::<Int64Type>().iter().collect::<Vec<_>>();
        assert_eq!(column(0), [Some(1), Some(4), Some(5)]);
        assert_eq!(column(1), [Some(2), Some(3), None]);
    }
}

#[test]
fn widening_inside_a_new_column_and_on_an_existing_one() {
    let mut d = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new());
    let (out, pending) = d.decode(vec![rec(json!({"p": 1})), rec(json!({"p": 1.5}))], 1).unwrap();
    d.commit(pending);
    assert_eq!(out.tables[0].changes, vec![SchemaChange::Create(vec![col("p", ColumnType::Double)])]);
    let existing = TableSchema::existing(vec![col("q", ColumnType::Bigint)]);
    let d = Decoder::new("t".into(), MetadataConfig::default(), HashMap::from([("t".to_string(), existing)]));
    let (out, _) = d.decode(vec![rec(json!({"q": 2})), rec(json!({"q": 2.5}))], 1).unwrap();
    assert_eq!(out.tables[0].changes, vec![SchemaChange::Widen(col("q", ColumnType::Double))]);
    let values = out.tables[0].data.column(0).as_primitive::<arrow::datatypes::Float64Type>();
    assert_eq!((values.value(0), values.value(1)), (2.0, 2.5));
}

#[test]
fn misfits_duplicates_and_bad_events_are_ledger_rows() {
    let existing = TableSchema::existing(vec![col("n", ColumnType::Bigint), col("flag", ColumnType::Boolean)]);
    let d = Decoder::new("t".into(), MetadataConfig::default(), HashMap::from([("t".to_string(), existing)]));
    let records = vec![
        rec(json!({"n": "x", "flag": 1})),
        rec(json!({"N": 5, "n": 6})),
        Record {
            payload: Payload::Invalid { raw: "oops".into(), reason: "not JSON".into() },
            meta: RecordMeta::default(),
        },
        rec(json!({"": 1})),
    ];
    let (out, _) = d.decode(records, 10).unwrap();
    let reasons: Vec<(Option<String>, String, i64)> =
        out.rejects.iter().map(|r| (r.column.clone(), r.value.clone(), r.sequence)).collect();
    assert_eq!(
        reasons,
        vec![
            (Some("n".into()), "\"x\"".into(), 10),
            (Some("flag".into()), "1".into(), 10),
            (Some("n".into()), "6".into(), 11),
            (None, "oops".into(), 12),
            (None, "1".into(), 13),
        ]
    );
    assert_eq!(out.rows, 3, "the invalid event is not a row; the others are");
    let n = out.tables[0].data.column(0).as_primitive::<Int64Type>();
    assert!(n.is_null(0));
    assert_eq!(n.value(1), 5);
}

#[test]
fn metadata_columns_and_templates() {
    let meta = MetadataConfig {
        received_at: true,
        position: true,
        key: true,
        topic: true,
        partition: true,
        offset: true,
        event_time: true,
        headers: true,
        shard_id: true,
        sequence_number: true,
        partition_key: true,
        arrival_time: true,
    };
    let d = Decoder::new("events_*".into(), meta, HashMap::new());
    let record = Record {
        payload: Payload::Bytes(bytes::Bytes::from_static(br#"[{"a": 1}, {"a": 2}]"#)),
        meta: RecordMeta {
            received_us: 1,
            key: Some("k".into()),
            no_key: false,
            topic: Some("orders".into()),
            partition: Some(0),
            offset: Some(42),
            event_time_us: Some(5),
            headers: Some(json!({"h": "v"})),
            route: Some("orders".into()),
            shard: Some("shardId-000000000001".into()),
            sequence: Some("49590338271490256608559692538361571095921575989136588898".into()),
            idempotency: None,
        },
    };
    let (out, _) = d.decode(vec![record], 1).unwrap();
    let w = &out.tables[0];
    assert_eq!(w.table, "events_orders");
    let schema = w.data.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "_received_at",
            "_position",
            "_key",
            "_topic",
            "_partition",
            "_offset",
            "_event_time",
            "_headers",
            "_shard_id",
            "_sequence_number",
            "_partition_key",
            "_arrival_time",
            "a"
        ]
    );
    let seq = w.data.column(9).as_string::<i32>();
    assert_eq!(seq.value(1), "49590338271490256608559692538361571095921575989136588898");
    let pos = w.data.column(1).as_primitive::<Int64Type>();
    assert_eq!((pos.value(0), pos.value(1)), (1, 2));
}

#[test]
fn columns_are_capped() {
    let d = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new());
    let wide: serde_json::Map<String, Value> =
        (0..sluice_core::decode::MAX_COLUMNS + 5).map(|i| (format!("f{i}"), json!(i))).collect();
    let (out, _) = d.decode(vec![rec(Value::Object(wide))], 1).unwrap();
    assert_eq!(out.tables[0].data.num_columns(), sluice_core::decode::MAX_COLUMNS);
    assert_eq!(out.rejects.len(), 5);
    assert!(out.rejects.iter().next().unwrap().reason.contains("maximum"));
}

#[test]
fn hostile_debezium_values_go_to_the_ledger_without_panicking() {
    use sluice_core::{ChangeConfig, Format, Mode};
    let changes =
        ChangeConfig { mode: Mode::Mirror, keys: vec!["id".into()], history: false, format: Format::Debezium };
    let d = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new()).with_changes(changes);
    let field = |name: &str, ty: &str, logical: &str, params: Value| json!({"field": name, "type": ty, "name": logical, "parameters": params});
    let schema = json!({"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        field("day", "int32", "io.debezium.time.Date", Value::Null),
        field("at", "int64", "io.debezium.time.Timestamp", Value::Null),
        field("t", "int64", "io.debezium.time.Time", Value::Null),
        field("price", "bytes", "org.apache.kafka.connect.data.Decimal", json!({"scale": "2"})),
        field("wide", "struct", "io.debezium.data.VariableScaleDecimal", Value::Null),
    ]}]});
    let events = [
        json!({"day": i64::MAX}),
        json!({"day": 2_147_483_000}),
        json!({"at": i64::MAX}),
        json!({"t": i64::MIN}),
        json!({"price": "!!not base64!!"}),
        json!({"price": "AAAAAAAAAAAAAAAAAAAAAAAA"}),
        json!({"wide": {"scale": 4_000_000_000u64, "value": "AQ=="}}),
    ];
    let records: Vec<Record> = events
        .iter()
        .enumerate()
        .map(|(i, after)| {
            let mut after = after.clone();
            after["id"] = json!(i);
            rec(json!({"schema": schema, "payload": {"op": "c", "after": after, "source": {"connector": "postgresql", "lsn": i}}}))
        })
        .collect();
    let (out, _) = d.decode(records, 1).unwrap();
    let rejects: Vec<_> = out.rejects.iter().collect();
    assert_eq!(rejects.len(), events.len(), "{rejects:?}");
    // Each value is NULL in its column with a ledger row naming it; the change still applies.
    for (r, event) in rejects.iter().zip(&events) {
        let name = event.as_object().unwrap().keys().next().unwrap();
        assert_eq!(r.column.as_deref(), Some(name.as_str()), "{r:?}");
    }
    assert_eq!(out.tables[0].data.num_rows(), events.len());
}
