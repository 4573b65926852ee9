//! Fuzzing on stable: property tests over generated and damaged inputs, and a replay of the
//! seed corpus (`tests/fuzz_corpus/<target>/`), through the same checks the cargo-fuzz targets
//! run (`fuzz/`). `PROPTEST_CASES` sets the cases per property (256 by default); a failing
//! input belongs in the corpus once fixed.

mod checks;
mod inputs;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use proptest::prelude::*;
use proptest::test_runner::Config;
use sluice_core::batch::CopyRows;
use sluice_core::{ChangeConfig, ColumnType, Decoder, Format, MetadataConfig, Mode, Payload, Record, RecordMeta};

/// Run `check` on every file of the corpus of `target`, naming the file that fails.
pub fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    for file in files {
        let data = std::fs::read(&file).expect("a corpus file");
        if let Err(panic) = std::panic::catch_unwind(|| check(&data)) {
            eprintln!("corpus file {} fails", file.display());
            std::panic::resume_unwind(panic);
        }
    }
}

fn config() -> Config {
    // No regression files: a failing input goes into the corpus instead.
    Config { failure_persistence: None, ..Config::default() }
}

#[test]
fn corpus_body() {
    replay("body", checks::body);
}

/// Objects wide enough that a name given twice is found through an index, not a scan.
#[test]
fn wide_objects_with_names_given_twice() {
    let mut fields: Vec<String> = (0..40).map(|i| format!("\"f{i}\": {i}")).collect();
    fields.push("\"f35\": \"again\"".into());
    fields.push("\"f2\": 2.5".into());
    fields.push("\"n\": {\"x\": 1, \"x\": [1]}".into());
    let object = format!("{{{}}}", fields.join(", "));
    checks::body(format!("{object}\n{object}\n").as_bytes());
    checks::body(format!("[{object}, {object}]").as_bytes());
}

#[test]
fn corpus_decoder() {
    replay("decoder", checks::decoder);
}

#[test]
fn corpus_copy() {
    replay("copy", checks::copy);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn body_layouts(body in inputs::mutated(inputs::body())) {
        checks::body(&body);
    }

    #[test]
    fn body_bytes(body in proptest::collection::vec(any::<u8>(), 0..48)) {
        checks::body(&body);
    }

    #[test]
    fn decoder_json(flags in proptest::sample::select(b"@ADEaCGK".to_vec()), body in inputs::mutated(inputs::body())) {
        checks::decoder(&[&[flags][..], &body].concat());
    }

    #[test]
    fn decoder_debezium(event in inputs::mutated(inputs::debezium())) {
        checks::decoder(&event);
    }

    #[test]
    fn decoder_bytes(data in proptest::collection::vec(any::<u8>(), 0..48)) {
        checks::decoder(&data);
    }

    #[test]
    fn copy_rows(chunk in inputs::mutated(inputs::copy())) {
        checks::copy(&chunk);
    }

    /// Binary `COPY` rows with fields of any bytes and length, for columns of any type, and
    /// whole rows of any bytes: decoded or refused to the ledger, never a panic; every row is
    /// a row or a ledger entry.
    #[test]
    fn binary_copy_rows(
        wires in proptest::collection::vec(0usize..12, 1..6),
        types in proptest::collection::vec(0usize..8, 6),
        fields in proptest::collection::vec(proptest::option::of(proptest::collection::vec(any::<u8>(), 0..10)), 0..30),
        junk in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        use sluice_core::decode::Wire;
        const WIRES: [Wire; 12] = [Wire::Text, Wire::Bool, Wire::Int2, Wire::Int4, Wire::Int8, Wire::Float4,
            Wire::Float8, Wire::Date, Wire::Timestamp, Wire::Timestamptz, Wire::Bytea, Wire::Numeric];
        const TYPES: [ColumnType; 8] = [ColumnType::Boolean, ColumnType::Bigint, ColumnType::Double,
            ColumnType::Varchar, ColumnType::Timestamptz, ColumnType::Date, ColumnType::Blob, ColumnType::Decimal(6, 2)];
        let n = wires.len();
        let columns: Vec<(String, ColumnType)> = (0..n).map(|i| (format!("c{i}"), TYPES[types[i]])).collect();
        let mut rows: Vec<bytes::Bytes> = fields
            .chunks(n)
            .map(|row| {
                let mut out = (row.len() as i16).to_be_bytes().to_vec();
                for f in row {
                    match f {
                        Some(v) => {
                            out.extend((v.len() as i32).to_be_bytes());
                            out.extend(v);
                        }
                        None => out.extend((-1i32).to_be_bytes()),
                    }
                }
                bytes::Bytes::from(out)
            })
            .collect();
        rows.push(bytes::Bytes::from(junk));
        let count = rows.len();
        let copy = CopyRows {
            columns: Arc::new(columns),
            keys: vec!["c0".into()],
            whole_row: false,
            db: "d".into(),
            schema: "s".into(),
            table: "t".into(),
            clear: false,
            last: false,
            rows,
            binary: Some(Arc::new(wires.iter().map(|w| WIRES[*w]).collect())),
        };
        let changes = ChangeConfig { mode: Mode::Mirror, keys: vec![], history: false, format: Format::Debezium };
        let decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new()).with_changes(changes);
        let record = Record { payload: Payload::Copy(copy), meta: RecordMeta::default() };
        let (out, _) = decoder.decode(vec![record], 1).expect("decode");
        prop_assert_eq!(out.events as usize, count);
        let refused: std::collections::HashSet<i64> =
            out.rejects.iter().filter(|r| r.column.is_none()).map(|r| r.sequence).collect();
        prop_assert_eq!(out.rows as usize + refused.len(), count);
    }

    /// Text escaped as `COPY` prints it comes back as it was.
    #[test]
    fn copy_text_round_trips(texts in proptest::collection::vec(inputs::text(12), 1..4)) {
        let columns: Vec<(String, ColumnType)> =
            (0..texts.len()).map(|i| (format!("c{i}"), ColumnType::Varchar)).collect();
        let line: Vec<String> = texts.iter().map(|t| inputs::escape(t)).collect();
        let rows = CopyRows {
            columns: Arc::new(columns),
            keys: vec!["c0".into()],
            whole_row: false,
            db: "d".into(),
            schema: "s".into(),
            table: "t".into(),
            clear: false,
            last: false,
            rows: vec![bytes::Bytes::from(format!("{}\n", line.join("\t")))],
            binary: None,
        };
        let changes = ChangeConfig { mode: Mode::Mirror, keys: vec![], history: false, format: Format::Debezium };
        let decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new()).with_changes(changes);
        let record = Record { payload: Payload::Copy(rows), meta: RecordMeta::default() };
        let (out, _) = decoder.decode(vec![record], 1).expect("decode");
        prop_assert_eq!(out.rejects.len(), 0);
        let data = &out.tables[0].data;
        for (i, text) in texts.iter().enumerate() {
            let column = data.column(i).as_string::<i32>();
            prop_assert!(!column.is_null(0));
            prop_assert_eq!(column.value(0), text.as_str());
        }
    }
}
