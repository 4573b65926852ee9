use std::sync::Arc;

use arrow::array::{Array, AsArray, Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
use arrow::record_batch::RecordBatch;
use sluice_core::transform::{FieldRule, Rule, TransformConfig};

use super::{build, check};

fn config(json: serde_json::Value) -> TransformConfig {
    serde_json::from_value(json).unwrap()
}

fn batch() -> RecordBatch {
    let schema = Schema::new(vec![
        Field::new("price", DataType::Float64, true),
        Field::new("qty", DataType::Int64, true),
        Field::new("kind", DataType::Utf8, true),
        Field::new("code", DataType::Utf8, true),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(Float64Array::from(vec![Some(2.5), Some(1.0), None, Some(4.0)])),
            Arc::new(Int64Array::from(vec![Some(2), Some(3), Some(1), Some(-1)])),
            Arc::new(StringArray::from(vec![Some("sale"), Some("test"), Some("sale"), Some("sale")])),
            Arc::new(StringArray::from(vec![Some("1"), Some("2"), Some("x"), Some("4")])),
        ],
    )
    .unwrap()
}

#[test]
fn expressions_compute_filter_and_validate_a_batch_row_for_row() {
    let c = config(serde_json::json!({
        "fields": [
            {"field": "total", "sql": "price * qty"},
            {"field": "label", "sql": "upper(kind) || '-' || coalesce(discount, 0)"},
        ],
        "filter": "kind <> 'test'",
        "validate": [{"name": "positive_qty", "sql": "qty > 0"}, {"name": "priced", "sql": "price IS NOT NULL"}],
    }));
    let t = build(Some(&c)).unwrap().unwrap();
    let (e, errors) = t.evaluate(&batch()).unwrap().unwrap();
    assert!(errors.is_empty());
    let total = e.computed[0].as_primitive::<Float64Type>();
    assert_eq!((total.value(0), total.value(1)), (5.0, 3.0));
    assert!(total.is_null(2), "NULL price gives a NULL total");
    // `discount` is in no row yet: it reads as NULL.
    assert_eq!(e.computed[1].as_string::<i32>().value(0), "SALE-0");
    let keep = e.keep.unwrap();
    assert_eq!((0..4).map(|i| keep.value(i)).collect::<Vec<_>>(), vec![true, false, true, true]);
    let failed = e.failed.unwrap();
    assert!(failed.is_null(0) && failed.is_null(1));
    assert_eq!(failed.value(2), 1, "row 2 has no price");
    assert_eq!(failed.value(3), 0, "row 3 has a negative qty");
}

#[test]
fn a_value_an_expression_cannot_take_fails_only_its_row() {
    let c = TransformConfig {
        fields: vec![FieldRule {
            field: "n".into(),
            sql: Some("CAST(code AS BIGINT) * 10".into()),
            ..FieldRule::default()
        }],
        ..TransformConfig::default()
    };
    let t = build(Some(&c)).unwrap().unwrap();
    let (e, errors) = t.evaluate(&batch()).unwrap().unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, 2);
    assert!(errors[0].1.contains("Conversion"), "{}", errors[0].1);
    let n = e.computed[0].as_primitive::<Int64Type>();
    assert_eq!((n.value(0), n.value(1), n.value(3)), (10, 20, 40));
    assert!(n.is_null(2));
}

#[test]
fn bad_expressions_are_refused_with_the_field_and_the_place() {
    let syntax = config(serde_json::json!({"filter": "kind = = 'x'"}));
    let e = check(&syntax).unwrap_err().to_string();
    assert!(e.starts_with("transform.filter:") && e.contains("at character"), "{e}");
    let unknown = config(serde_json::json!({"validate": [{"name": "r", "sql": "no_such_fn(qty)"}]}));
    let e = check(&unknown).unwrap_err().to_string();
    assert!(e.starts_with("transform.validate[0].sql:") && e.contains("no_such_fn"), "{e}");
    let sub = config(serde_json::json!({"fields": [{"field": "x", "sql": "(SELECT 1)"}]}));
    assert!(check(&sub).unwrap_err().to_string().contains("subquery"));
    let two = config(serde_json::json!({"filter": "1; DROP TABLE scratch"}));
    assert!(check(&two).unwrap_err().to_string().starts_with("transform.filter:"));
    let from = config(serde_json::json!({"filter": "1 FROM scratch"}));
    assert!(check(&from).unwrap_err().to_string().contains("one SQL expression"));
    let file = config(serde_json::json!({"filter": "length(read_text('/etc/passwd')) > 0"}));
    assert!(check(&file).is_err(), "no table function, no file");
    let ok = TransformConfig {
        validate: vec![Rule { name: "r".into(), sql: "qty > 0".into() }],
        ..TransformConfig::default()
    };
    check(&ok).unwrap();
}

#[test]
fn a_script_modifies_and_skips_events_and_a_bad_one_is_refused_at_save() {
    let c = config(serde_json::json!({
        "script": "SELECT * EXCLUDE (code) REPLACE (upper(kind) AS kind), price * qty AS total, \
                   coalesce(discount, 0) AS discount FROM event WHERE kind <> 'test'",
    }));
    let t = build(Some(&c)).unwrap().unwrap();
    let (out, errors) = t.run_script(&batch()).unwrap().unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    let out = out.unwrap();
    assert_eq!(out.num_rows(), 3);
    let names: Vec<String> = out.schema().fields().iter().map(|f| f.name().clone()).collect();
    // `discount` is in no event yet: the view has it as NULL, so `*` brings it too.
    assert_eq!(names, ["price", "qty", "kind", "discount", "total", "discount"]);
    assert_eq!(out.column(2).as_string::<i32>().value(0), "SALE");
    for (sql, words) in [
        ("SELECT * FROM read_csv('/etc/passwd')", "table function"),
        ("SELECT no_such_fn(a) FROM event", "no_such_fn"),
        ("DELETE FROM event", "transform.script"),
        ("SELECT * FROM event; SELECT 1", "one SELECT"),
        // A file named as a table is no table function: only DuckDB's sandbox stops it.
        ("SELECT * FROM '/etc/passwd'", "transform.script"),
    ] {
        let e = check(&config(serde_json::json!({"script": sql}))).unwrap_err().to_string();
        assert!(e.contains(words), "{sql}: {e}");
    }
}

/// The cost of the expressions per event, against a native row-level floor; run with
/// `cargo test --release -p sluice-connectors expression_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, for BENCHMARKS.md"]
fn expression_cost() {
    const ROWS: usize = 10_000;
    let schema = Schema::new(vec![
        Field::new("event_id", DataType::Int64, true),
        Field::new("amount", DataType::Float64, true),
        Field::new("kind", DataType::Utf8, true),
    ]);
    let batch = RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..ROWS as i64)),
            Arc::new(Float64Array::from_iter_values((0..ROWS).map(|i| i as f64 * 0.5))),
            Arc::new(StringArray::from_iter_values((0..ROWS).map(|i| ["a", "b", "test"][i % 3]))),
        ],
    )
    .unwrap();
    let c = config(serde_json::json!({
        "fields": [{"field": "x2", "sql": "amount * 2"}],
        "filter": "event_id % 100 <> 0 AND kind <> 'test'",
        "validate": [{"name": "positive", "sql": "amount >= 0"}],
    }));
    let t = build(Some(&c)).unwrap().unwrap();
    let rounds = 50;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        t.evaluate(&batch).unwrap().unwrap();
    }
    let duck = start.elapsed().as_secs_f64() * 1e9 / (rounds * ROWS) as f64;
    // The floor of any row-level language: the event as a value tree, read field by field
    // with nothing interpreted.
    let events: Vec<serde_json::Value> = (0..ROWS)
        .map(|i| {
            let kind = ["a", "b", "test"][i % 3];
            serde_json::json!({"event_id": i, "amount": i as f64 * 0.5, "kind": kind})
        })
        .collect();
    let start = std::time::Instant::now();
    let mut kept = 0usize;
    for _ in 0..rounds {
        for e in &events {
            let id = e["event_id"].as_i64().unwrap_or(0);
            let amount = e["amount"].as_f64().unwrap_or(0.0);
            if id % 100 != 0 && e["kind"] != "test" && amount >= 0.0 {
                kept += std::hint::black_box((amount * 2.0) as usize) & 1;
            }
        }
    }
    let native = start.elapsed().as_secs_f64() * 1e9 / (rounds * ROWS) as f64;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        let built: Vec<serde_json::Value> = (0..ROWS)
            .map(|i| {
                let kind = ["a", "b", "test"][i % 3];
                serde_json::json!({"event_id": i, "amount": i as f64 * 0.5, "kind": kind})
            })
            .collect();
        std::hint::black_box(built);
    }
    let tree = start.elapsed().as_secs_f64() * 1e9 / (rounds * ROWS) as f64;
    println!(
        "DuckDB over a batch of {ROWS}: {duck:.0} ns/event; native row loop: {native:.0} ns/event (+{tree:.0} ns/event to build the value tree a row-level language reads) ({kept})"
    );
}

#[test]
fn every_expression_error_points_at_its_character() {
    // (config, field, the expected 0-based character of the user's text)
    let long = format!("{}b +* 2", "a + ".repeat(40));
    let cases = [
        (serde_json::json!({"validate": [{"name": "r", "sql": "qty >>"}]}), "transform.validate[0].sql", 4),
        (serde_json::json!({"fields": [{"field": "t", "sql": "price qty"}]}), "transform.fields[0].sql", 6),
        (serde_json::json!({"filter": "no_such_fn(qty) > 1"}), "transform.filter", 0),
        (serde_json::json!({"filter": "é = 1 AND qty +* 2"}), "transform.filter", 14),
        (serde_json::json!({"filter": long}), "transform.filter", 162),
        (serde_json::json!({"script": "SELECT qty, no_such_fn(qty) FROM event"}), "transform.script", 12),
        (serde_json::json!({"script": "SELECT qty FROM event WHERE = 1"}), "transform.script", 28),
    ];
    for (transform, field, at) in cases {
        let e = check(&config(transform.clone())).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{field}:")), "{transform}: {e}");
        assert!(e.ends_with(&format!("(at character {at})")), "{transform}: {e}");
    }
}
