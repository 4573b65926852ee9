//! Generators for the property tests: JSON text (duplicate keys and odd numbers included),
//! bodies in every layout, Debezium events and `COPY` rows, and byte-level mutations.

use proptest::prelude::*;
use proptest::sample::select;

/// A JSON tree written by hand, so an object can name a field twice.
#[derive(Debug, Clone)]
pub enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    pub fn write(&self, out: &mut String) {
        match self {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Num(n) => out.push_str(n),
            J::Str(s) => out.push_str(&serde_json::Value::from(s.as_str()).to_string()),
            J::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            J::Obj(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    J::Str(k.clone()).write(out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }

    pub fn text(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }
}

/// Characters that matter to the parsers: quotes, escapes, separators, NUL, multi-byte.
fn chars() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => select(vec!['a', 'b', 'x', 'I', 'D', '_', '0', '9', ' ', '-', ':', 'T', 'Z']),
        1 => select(vec!['"', '\\', '\n', '\t', '\r', '\0', ',', '{', '[', 'é', '€', '😀', '\u{fffd}']),
        1 => any::<char>(),
    ]
}

pub fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(chars(), 0..max).prop_map(|c| c.into_iter().collect())
}

/// Strings the decoder types: dates, timestamps, times, UUIDs, hex, base64, numbers as text.
pub fn typed_text() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "2024-02-29",
            "2024-02-30",
            "2024-01-01T10:00:00+02:00",
            "2024-01-01T10:00:00Z",
            "+275760-09-13T00:00:00Z",
            "9999-12-31T23:59:60.999999999Z",
            "12:30:00",
            "24:00:00",
            "00000000-0000-0000-0000-000000000000",
            "\\x0aff",
            "\\xzz",
            "AQ==",
            "12.50",
            "-0.000",
            "1e3",
            "NaN",
            "infinity",
        ])
        .prop_map(str::to_string),
        text(12),
    ]
}

/// Names: plain, flattened-looking, letter-case twins, empty, NUL, very long, and the mark an
/// earlier version put on typed values (only a name now).
pub fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => select(vec!["id", "ID", "a", "A", "b", "a__b", "_position", "_key", "op", "after", "payload", "schema"])
            .prop_map(str::to_string),
        1 => Just(String::new()),
        1 => Just("\u{0}sluice-typed".to_string()),
        1 => Just("type".to_string()),
        1 => (1usize..300).prop_map(|n| "n".repeat(n)),
        2 => text(8),
    ]
}

pub fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| f.to_string()),
        select(vec!["-0", "0.0", "1.0", "1e3", "1E-7", "18446744073709551616", "1e308", "-1e-400", "1e400"])
            .prop_map(str::to_string),
    ]
}

pub fn json() -> impl Strategy<Value = J> {
    let leaf = prop_oneof![
        Just(J::Null),
        any::<bool>().prop_map(J::Bool),
        number().prop_map(J::Num),
        typed_text().prop_map(J::Str),
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(J::Arr),
            proptest::collection::vec((name(), inner), 0..6).prop_map(J::Obj),
        ]
    })
}

/// Mostly objects, as real events are.
pub fn event() -> impl Strategy<Value = J> {
    prop_oneof![
        4 => proptest::collection::vec((name(), json()), 0..6).prop_map(J::Obj),
        1 => json(),
    ]
}

/// A body in one of the push layouts: one object, pretty-printed, an array, or NDJSON (with
/// blank, bad and `\r\n` lines).
pub fn body() -> impl Strategy<Value = Vec<u8>> {
    let events = || proptest::collection::vec(event(), 0..6);
    prop_oneof![
        event().prop_map(|e| e.text()),
        event().prop_map(|e| {
            let v: serde_json::Value = serde_json::from_str(&e.text()).unwrap_or_default();
            serde_json::to_string_pretty(&v).unwrap_or_default()
        }),
        (events(), select(vec![",", ", ", ",\n"]))
            .prop_map(|(es, sep)| format!("[{}]", es.iter().map(J::text).collect::<Vec<_>>().join(sep))),
        (events(), proptest::collection::vec(select(vec!["", "nope", "  ", "\r", "[1]"]), 0..3), any::<bool>())
            .prop_map(|(es, bad, crlf)| {
                let mut lines: Vec<String> = es.iter().map(J::text).collect();
                lines.extend(bad.iter().map(|b| b.to_string()));
                lines.join(if crlf { "\r\n" } else { "\n" })
            }),
    ]
    .prop_map(String::into_bytes)
}

/// Bytes, sometimes damaged: cut short, a byte changed, inserted or removed.
pub fn mutated(base: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (base, 0u8..6, any::<usize>(), any::<u8>()).prop_map(|(mut b, how, at, byte)| {
        let at = if b.is_empty() { 0 } else { at % b.len() };
        match how {
            0 => b.truncate(at),
            1 if !b.is_empty() => b[at] = byte,
            2 => b.insert(at, byte),
            3 if !b.is_empty() => {
                b.remove(at);
            }
            _ => {}
        }
        b
    })
}

fn logical_field() -> impl Strategy<Value = serde_json::Value> {
    let logical = select(vec![
        "org.apache.kafka.connect.data.Decimal",
        "io.debezium.data.VariableScaleDecimal",
        "io.debezium.time.Date",
        "io.debezium.time.Timestamp",
        "io.debezium.time.MicroTimestamp",
        "io.debezium.time.NanoTimestamp",
        "io.debezium.time.ZonedTimestamp",
        "io.debezium.time.Time",
        "io.debezium.time.MicroTime",
        "io.debezium.time.NanoTime",
        "io.debezium.data.Uuid",
        "io.debezium.data.Json",
    ]);
    let scale = prop_oneof![Just(serde_json::Value::Null), (0i64..45).prop_map(|s| s.to_string().into())];
    (select(vec!["id", "a", "b"]), logical, scale)
        .prop_map(|(f, l, s)| serde_json::json!({"field": f, "type": "x", "name": l, "parameters": {"scale": s}}))
}

/// A Debezium change event with its key line, in the decoder check's layout (flags byte `R`).
pub fn debezium() -> impl Strategy<Value = Vec<u8>> {
    let image = proptest::collection::vec(
        (
            select(vec!["id", "a", "b", "c"]),
            prop_oneof![
                3 => json().prop_map(|j| serde_json::from_str(&j.text()).unwrap_or_default()),
                1 => any::<i64>().prop_map(serde_json::Value::from),
                1 => select(vec!["AQ==", "////////////////////////", "{\"$oid\":\"x\"}", "2024"]).prop_map(serde_json::Value::from),
            ],
        ),
        0..5,
    )
    .prop_map(|kv| serde_json::Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()));
    let maybe_image = prop_oneof![
        3 => image.clone(),
        1 => Just(serde_json::Value::Null),
        1 => image.clone().prop_map(|i| serde_json::Value::from(i.to_string())),
        1 => json().prop_map(|j| serde_json::Value::from(j.text())),
    ];
    let big = prop_oneof![
        any::<i64>().prop_map(serde_json::Value::from),
        (0i64..2_000_000_000_000).prop_map(serde_json::Value::from)
    ];
    let source = (
        select(vec!["postgresql", "mysql", "mariadb", "sqlserver", "oracle", "mongodb", "other"]),
        select(vec!["t", "", "orders"]),
        big.clone(),
        big.clone(),
        select(vec!["ts_ms", "ts_us", "ts_ns", "lsn", "pos", "scn", "ord", "txSeq", "row"]),
        select(vec!["mysql-bin.000003", "x", "bin.", "00000027:00000758:0003"]),
    )
        .prop_map(|(connector, table, n, m, other, file)| {
            serde_json::json!({"connector": connector, "db": "d", "schema": "s", "table": table, "ts_ms": n,
                other: m, "file": file, "commit_lsn": file, "change_lsn": file, "lsn": m, "pos": n})
        });
    let op = prop_oneof![select(vec!["c", "u", "d", "r", "t", "m", "x"]).prop_map(Some), Just(None)];
    let key = prop_oneof![
        3 => image.clone().prop_map(|i| Some(i.to_string())),
        1 => Just(None),
        1 => text(6).prop_map(Some),
    ];
    let logical = proptest::collection::vec(logical_field(), 0..4);
    // Flags (see checks.rs): Debezium with a key line, plus metadata, history or `[table]`.
    let flags = select(vec!['R', 'V', 'Z', 'r', 'z']);
    (op, maybe_image.clone(), maybe_image, source, big, key, logical, (0u8..3, flags)).prop_map(
        |(op, before, after, source, ts, key, fields, (wrap, flags))| {
            let mut payload = serde_json::json!({"before": before, "after": after, "source": source, "ts_ms": ts});
            if let Some(op) = op {
                payload["op"] = op.into();
            }
            let event = match wrap {
                0 => payload,
                1 => serde_json::json!({"schema": {"fields": [{"field": "before", "fields": fields},
                    {"field": "after", "fields": fields}]}, "payload": payload}),
                _ => serde_json::Value::Null,
            };
            // Without a key line the flag loses bit 4 (`R` becomes `B`).
            let mut out = match &key {
                Some(k) => format!("{flags}{}\n", k.replace('\n', " ")),
                None => char::from(flags as u8 & !16).to_string(),
            };
            out.push_str(&event.to_string());
            out.into_bytes()
        },
    )
}

/// A `COPY` chunk in the copy check's layout: a header of column types, then rows whose fields
/// are real-looking values (or not) for those types, escaped as `COPY` escapes them.
pub fn copy() -> impl Strategy<Value = Vec<u8>> {
    let ty = select(vec![
        "BOOLEAN",
        "BIGINT",
        "DOUBLE",
        "VARCHAR",
        "TIMESTAMPTZ",
        "DATE",
        "JSON",
        "TIMESTAMP",
        "TIME",
        "UUID",
        "BLOB",
        "DECIMAL(6,2)",
        "DECIMAL(38,10)",
        "BIGINT[]",
        "VARCHAR[]",
    ]);
    let field = prop_oneof![
        3 => select(vec![
            "\\N", "t", "f", "42", "-9223372036854775808", "9223372036854775808", "1.5", "NaN", "2024-02-29",
            "2024-01-01 10:00:00+02", "2024-01-01 10:00:00.123456+05:30:15", "2024-01-01 10:00:00", "infinity",
            "12:30:00.5", "\\\\x0aff", "[1,null,3]", "[\"a\"]", "{\"a\":1}", "123.45", "0.001", "\\101\\x41\\t",
            "00000000-0000-0000-0000-000000000000", "1999-12-31 23:59:60+00", "0000-01-01 00:00:00+00",
        ]).prop_map(str::to_string),
        1 => text(10).prop_map(|t| escape(&t)),
        1 => text(6),
    ];
    let rows = proptest::collection::vec(proptest::collection::vec(field, 0..6), 0..6);
    (any::<bool>(), proptest::collection::vec(ty, 1..6), rows).prop_map(|(history, types, rows)| {
        let mut out = if history { "+".to_string() } else { String::new() };
        out.push_str(&types.join("\t"));
        for row in rows {
            out.push('\n');
            out.push_str(&row.join("\t"));
        }
        out.into_bytes()
    })
}

/// Text as `COPY` prints it in a field.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}
