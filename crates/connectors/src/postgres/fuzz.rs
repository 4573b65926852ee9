//! Entry points to the pure parsers of the replication stream, for the property tests and the
//! fuzz targets. Only `super::pgoutput`, `super::types` and `super::values` are used, so `fuzz/`
//! can build this file beside those three without the rest of the crate.

/// Decode one `pgoutput` message: its debug text, or why it is refused.
pub fn pgoutput(data: &[u8]) -> Result<String, String> {
    super::pgoutput::decode(data).map(|m| format!("{m:?}"))
}

/// The decoder's value for a column's `text` in a stream change, and the column's type: base
/// type `name` (`int4`, `numeric`, …), or an array of `element` when given (`mood` stands for
/// an enum), with column modifier `typmod`.
pub fn value(
    name: &str,
    element: Option<&str>,
    typmod: i32,
    text: &str,
) -> (serde_json::Value, sluice_core::ColumnType) {
    let base =
        |name: &str, category| super::types::TypeInfo { name: name.to_string(), category, element: None, typmod: -1 };
    let info = match element {
        Some(e) => super::types::TypeInfo {
            element: Some(Box::new(base(e, if e == "mood" { 'E' } else { 'U' }))),
            ..base(name, 'A')
        },
        None => base(name, 'U'),
    };
    let ty = super::types::column_type(&info, typmod);
    (super::values::value(ty, &info, text), ty)
}
