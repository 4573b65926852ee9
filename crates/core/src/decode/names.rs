//! Which field names can name a column.

/// Longest column name, in bytes, flattened parents included; a longer field goes to the
/// ledger. Every later write compares names, so one huge name would slow the table for good.
pub const MAX_NAME_BYTES: usize = 255;

/// Why a field cannot name a column, if it cannot.
pub(super) fn bad_name(key: &str, path: &str) -> Option<String> {
    if key.contains('\0') {
        return Some("field name contains a NUL character, which no column name can hold".into());
    }
    (path.len() > MAX_NAME_BYTES)
        .then(|| format!("field name is {} bytes long; column names are at most {MAX_NAME_BYTES}", path.len()))
}

/// A name cut to at most [`MAX_NAME_BYTES`] on a character boundary, for the ledger.
pub(super) fn truncated(name: &str) -> &str {
    let mut end = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}
