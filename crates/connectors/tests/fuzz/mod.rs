//! Fuzzing the replication stream's parsers on stable: property tests and a replay of the seed
//! corpus (`tests/fuzz_corpus/pgoutput/`), through the checks the cargo-fuzz target `pgoutput`
//! runs (`fuzz/`). The round trip of well-formed messages is a unit test in `pgoutput.rs`.

mod checks;

use sluice_connectors::postgres::fuzz as api;

use std::path::Path;

use proptest::prelude::*;

#[test]
fn corpus_pgoutput() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus/pgoutput");
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).expect("the pgoutput corpus").map(|e| e.expect("a corpus entry").path()).collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let data = std::fs::read(&file).expect("a corpus file");
        if let Err(panic) = std::panic::catch_unwind(|| checks::pgoutput(&data)) {
            eprintln!("corpus file {} fails", file.display());
            std::panic::resume_unwind(panic);
        }
    }
}

/// Column text as Postgres prints it, or near it.
fn text() -> impl Strategy<Value = Vec<u8>> {
    let known = proptest::sample::select(vec![
        "42",
        "-0",
        "12.50",
        "1e400",
        "NaN",
        "t",
        "{1,2,NULL}",
        "{\"a b\",\"c\\\"d\"}",
        "{{1,2},{3,4}}",
        "{}",
        "{",
        "{\"unterminated",
        "{a,\"b\"c}",
        "2024-02-29",
        "2024-01-01 10:00:00",
        "2024-01-01 10:00:00.5+05:30",
        "12:30:00",
        "\\x0aff",
        "{\"a\":[1]}",
        "null",
        "00000000-0000-0000-0000-000000000000",
        "happy",
    ])
    .prop_map(|s| s.as_bytes().to_vec());
    prop_oneof![3 => known, 1 => proptest::collection::vec(any::<u8>(), 0..16)]
}

/// Column modifiers: none, `numeric(p,s)` with any scale (PostgreSQL 15 allows a scale above the
/// precision, and a negative one), anything.
fn typmod() -> impl Strategy<Value = i32> {
    prop_oneof![
        1 => Just(-1),
        4 => (1i32..=40, -5i32..=45).prop_map(|(p, s)| ((p << 16) | (s & 0x7ff)) + 4),
        1 => any::<i32>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn messages(data in proptest::collection::vec(any::<u8>(), 0..64)) {
        checks::pgoutput(&data);
    }

    #[test]
    fn tagged_messages(kind in proptest::sample::select(b"RIUDBCT".to_vec()), rest in proptest::collection::vec(any::<u8>(), 0..64)) {
        checks::pgoutput(&[&[kind][..], &rest].concat());
    }

    #[test]
    fn values(typmod in typmod(), text in text()) {
        checks::pgoutput(&[&typmod.to_be_bytes()[..], &text].concat());
    }
}
