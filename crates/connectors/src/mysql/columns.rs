//! What a MySQL or MariaDB table already has: its columns, with the column type each gets in a
//! stream's decoder, so a value that does not fit goes to the ledger instead of failing the
//! write, and a column of integers that gets fractions is widened as in the workspace.

use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use sluice_core::Result;
use sluice_core::schema::{Column, ColumnType};

use super::target::sql_error;

/// A column as `information_schema.columns` describes it.
pub(super) struct Existing {
    pub name: String,
    /// `data_type`, lower case (`int`, `varchar`, `decimal`, …).
    pub data_type: String,
    /// `column_type`, lower case (`tinyint(1)`, `bigint(20) unsigned`, `decimal(12,2)`, …).
    pub column_type: String,
    pub precision: Option<u64>,
    pub scale: Option<u64>,
    /// Nullable, outside every index, no `extra` (auto_increment, generated): a column that
    /// `MODIFY COLUMN … DOUBLE` can widen without dropping what else its definition says.
    pub plain: bool,
}

impl Existing {
    /// Whether the column holds whole numbers only.
    pub fn is_integer(&self) -> bool {
        matches!(self.data_type.as_str(), "tinyint" | "smallint" | "mediumint" | "int" | "bigint") && !self.is_boolean()
    }

    fn is_boolean(&self) -> bool {
        self.column_type.starts_with("tinyint(1)") || self.data_type == "boolean"
    }

    /// The type the decoder fits values to.
    pub fn column_type(&self) -> ColumnType {
        if self.is_boolean() {
            return ColumnType::Boolean;
        }
        match self.data_type.as_str() {
            // An unsigned BIGINT holds values past BIGINT's: as a DECIMAL(20,0) they fit.
            "bigint" if self.column_type.contains("unsigned") => ColumnType::Decimal(20, 0),
            "tinyint" | "smallint" | "mediumint" | "int" | "bigint" | "year" => ColumnType::Bigint,
            "float" | "double" | "real" => ColumnType::Double,
            "decimal" | "numeric" => match (self.precision, self.scale) {
                (Some(p @ 1..=38), Some(s)) if s <= p => ColumnType::Decimal(p as u8, s as u8),
                _ => ColumnType::Varchar,
            },
            "date" => ColumnType::Date,
            // DATETIME(6) holds UTC written by Sluice; TIMESTAMP is converted from the session's
            // zone, which Sluice sets to UTC.
            "datetime" | "timestamp" => ColumnType::Timestamptz,
            "json" => ColumnType::Json,
            "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => ColumnType::Blob,
            // Text, enums, sets, TIME (which can exceed a day) and anything else take text.
            _ => ColumnType::Varchar,
        }
    }
}

/// The columns of `table` in the connection's database, in their order; empty when it does
/// not exist.
pub(super) async fn existing(conn: &mut Conn, table: &str) -> Result<Vec<Existing>> {
    type Row = (String, String, String, Option<u64>, Option<u64>, i64);
    let rows: Vec<Row> = conn
        .exec(
            "SELECT column_name, LOWER(data_type), LOWER(column_type), numeric_precision, numeric_scale, \
             is_nullable = 'YES' AND column_key = '' AND extra = '' \
             AND (column_default IS NULL OR column_default = 'NULL') \
             AND column_comment = '' FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
            (table,),
        )
        .await
        .map_err(sql_error)?;
    Ok(rows
        .into_iter()
        .map(|(name, data_type, column_type, precision, scale, plain)| Existing {
            name,
            data_type,
            column_type,
            precision,
            scale,
            plain: plain != 0,
        })
        .collect())
}

/// The decoder's columns for an existing table; `None` when it does not exist.
pub(super) fn decoder_columns(existing: &[Existing]) -> Option<Vec<Column>> {
    (!existing.is_empty())
        .then(|| existing.iter().map(|c| Column { name: c.name.clone(), ty: c.column_type() }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(data_type: &str, column_type: &str, precision: Option<u64>, scale: Option<u64>) -> Existing {
        Existing {
            name: "c".into(),
            data_type: data_type.into(),
            column_type: column_type.into(),
            precision,
            scale,
            plain: true,
        }
    }

    #[test]
    fn each_mysql_type_gets_the_decoder_type_its_values_fit() {
        assert_eq!(column("tinyint", "tinyint(1)", Some(3), Some(0)).column_type(), ColumnType::Boolean);
        assert_eq!(column("int", "int(11)", Some(10), Some(0)).column_type(), ColumnType::Bigint);
        assert!(column("int", "int(11)", Some(10), Some(0)).is_integer());
        assert!(!column("tinyint", "tinyint(1)", Some(3), Some(0)).is_integer());
        assert_eq!(
            column("bigint", "bigint(20) unsigned", Some(20), Some(0)).column_type(),
            ColumnType::Decimal(20, 0)
        );
        assert_eq!(column("decimal", "decimal(12,2)", Some(12), Some(2)).column_type(), ColumnType::Decimal(12, 2));
        assert_eq!(column("decimal", "decimal(65,2)", Some(65), Some(2)).column_type(), ColumnType::Varchar);
        assert_eq!(column("double", "double", Some(22), None).column_type(), ColumnType::Double);
        assert_eq!(column("datetime", "datetime(6)", None, None).column_type(), ColumnType::Timestamptz);
        assert_eq!(column("longtext", "longtext", None, None).column_type(), ColumnType::Varchar);
        assert_eq!(column("enum", "enum('a','b')", None, None).column_type(), ColumnType::Varchar);
        assert_eq!(column("varbinary", "varbinary(16)", None, None).column_type(), ColumnType::Blob);
    }
}
