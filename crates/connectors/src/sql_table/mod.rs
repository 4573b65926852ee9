//! What the three SQL table destinations (Postgres, MySQL/MariaDB, SQLite) share: how Arrow
//! types map to column types, how values are written as SQL literals, and the statements that
//! create, upsert, delete and replace. Each technology's `target.rs` only connects, loads rows
//! and runs these in a transaction. `copy_binary`: Postgres's binary `COPY` rows.

pub(crate) mod copy_binary;
pub(crate) mod custom;
mod values;

use arrow::datatypes::{DataType, Field, Schema};

pub(crate) use values::{Literals, binary};

/// The SQL flavour of a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

impl Dialect {
    /// Quote an identifier.
    pub(crate) fn quote(self, ident: &str) -> String {
        match self {
            Self::MySql => format!("`{}`", ident.replace('`', "``")),
            _ => format!("\"{}\"", ident.replace('"', "\"\"")),
        }
    }

    /// The column type a result column gets in a table Sluice creates.
    pub(crate) fn column_type(self, field: &Field, is_key: bool) -> String {
        use DataType as T;
        let ty = field.data_type();
        match self {
            Self::Postgres => match ty {
                T::Boolean => "BOOLEAN".into(),
                T::Int8 | T::Int16 | T::UInt8 => "SMALLINT".into(),
                T::Int32 | T::UInt16 => "INTEGER".into(),
                T::Int64 | T::UInt32 => "BIGINT".into(),
                T::UInt64 => "NUMERIC(20,0)".into(),
                T::Float16 | T::Float32 => "REAL".into(),
                T::Float64 => "DOUBLE PRECISION".into(),
                T::Decimal128(p, s) | T::Decimal256(p, s) => format!("NUMERIC({p},{s})"),
                T::Date32 | T::Date64 => "DATE".into(),
                T::Timestamp(_, Some(_)) => "TIMESTAMPTZ".into(),
                T::Timestamp(_, None) => "TIMESTAMP".into(),
                T::Time32(_) | T::Time64(_) => "TIME".into(),
                T::Binary | T::LargeBinary | T::BinaryView | T::FixedSizeBinary(_) => "BYTEA".into(),
                _ => "TEXT".into(),
            },
            Self::MySql => match ty {
                T::Boolean => "BOOLEAN".into(),
                T::Int8 => "TINYINT".into(),
                T::Int16 | T::UInt8 => "SMALLINT".into(),
                T::Int32 | T::UInt16 => "INT".into(),
                T::Int64 | T::UInt32 => "BIGINT".into(),
                T::UInt64 => "BIGINT UNSIGNED".into(),
                T::Float16 | T::Float32 => "FLOAT".into(),
                T::Float64 => "DOUBLE".into(),
                // MariaDB's DECIMAL holds at most 65 digits, 38 after the point.
                T::Decimal128(p, s) | T::Decimal256(p, s) => {
                    format!("DECIMAL({},{})", (*p).min(65), (*s).clamp(0, 38))
                }
                T::Date32 | T::Date64 => "DATE".into(),
                // DATETIME, not TIMESTAMP (which ends in 2038); values are written in UTC.
                T::Timestamp(_, _) => "DATETIME(6)".into(),
                T::Time32(_) | T::Time64(_) => "TIME(6)".into(),
                T::Binary | T::LargeBinary | T::BinaryView | T::FixedSizeBinary(_) => {
                    if is_key {
                        "VARBINARY(255)".into()
                    } else {
                        "LONGBLOB".into()
                    }
                }
                // A key must have a bounded length to be indexed.
                _ if is_key => "VARCHAR(255)".into(),
                _ => "LONGTEXT".into(),
            },
            Self::Sqlite => match ty {
                T::Boolean
                | T::Int8
                | T::Int16
                | T::Int32
                | T::Int64
                | T::UInt8
                | T::UInt16
                | T::UInt32
                | T::UInt64 => "INTEGER".into(),
                T::Float16 | T::Float32 | T::Float64 => "REAL".into(),
                // Decimals stay exact as text: SQLite has no decimal type and REAL would round.
                T::Binary | T::LargeBinary | T::BinaryView | T::FixedSizeBinary(_) => "BLOB".into(),
                _ => "TEXT".into(),
            },
        }
    }

    /// `CREATE TABLE` for a result, keyed when keys are given.
    pub(crate) fn create_table(self, table: &str, schema: &Schema, keys: &[String], if_missing: bool) -> String {
        let mut columns: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| {
                let is_key = keys.iter().any(|k| k == f.name());
                let not_null = if is_key { " NOT NULL" } else { "" };
                format!("{} {}{not_null}", self.quote(f.name()), self.column_type(f, is_key))
            })
            .collect();
        if !keys.is_empty() {
            columns.push(format!("PRIMARY KEY ({})", self.list(keys)));
        }
        let guard = if if_missing { "IF NOT EXISTS " } else { "" };
        format!("CREATE TABLE {guard}{table} ({})", columns.join(", "))
    }

    /// `ALTER TABLE … ADD COLUMN` for a result column the table lacks.
    pub(crate) fn add_column(self, table: &str, field: &Field) -> String {
        format!("ALTER TABLE {table} ADD COLUMN {} {}", self.quote(field.name()), self.column_type(field, false))
    }

    /// A quoted column list.
    pub(crate) fn list(self, names: &[String]) -> String {
        names.iter().map(|n| self.quote(n)).collect::<Vec<_>>().join(", ")
    }

    fn key_match(self, left: &str, right: &str, keys: &[String]) -> String {
        keys.iter().map(|k| format!("{left}.{q} = {right}.{q}", q = self.quote(k))).collect::<Vec<_>>().join(" AND ")
    }

    /// Update the rows of `table` whose key is in `stage`, but for the columns in `keep` (see
    /// [`sluice_core::Delivery::keep`]); `None` when there is nothing to set.
    pub(crate) fn update_from(
        self,
        table: &str,
        stage: &str,
        columns: &[String],
        keys: &[String],
        keep: &[String],
    ) -> Option<String> {
        let values = set_columns(columns, keys, keep);
        if values.is_empty() {
            return None;
        }
        let matching = self.key_match("t", "s", keys);
        Some(match self {
            Self::MySql => {
                let sets = values.iter().map(|c| format!("t.{q} = s.{q}", q = self.quote(c))).collect::<Vec<_>>();
                format!("UPDATE {table} t JOIN {stage} s ON {matching} SET {}", sets.join(", "))
            }
            _ => {
                let sets = values.iter().map(|c| format!("{q} = s.{q}", q = self.quote(c))).collect::<Vec<_>>();
                format!("UPDATE {table} AS t SET {} FROM {stage} AS s WHERE {matching}", sets.join(", "))
            }
        })
    }

    /// Insert the rows of `stage` whose key is not yet in `table`.
    pub(crate) fn insert_missing(self, table: &str, stage: &str, columns: &[String], keys: &[String]) -> String {
        let list = self.list(columns);
        let picks = columns.iter().map(|c| format!("s.{}", self.quote(c))).collect::<Vec<_>>().join(", ");
        format!(
            "INSERT INTO {table} ({list}) SELECT {picks} FROM {stage} s WHERE NOT EXISTS \
             (SELECT 1 FROM {table} t WHERE {})",
            self.key_match("t", "s", keys)
        )
    }

    /// Postgres: insert the rows of `stage`, and where the key is already in `table` update the
    /// row instead (but the columns in `keep`), in one statement. Needs a unique index on
    /// exactly the key columns; the same rows result as `update_from` then `insert_missing` (a
    /// stage holds each key once).
    pub(crate) fn upsert_on_conflict(
        self,
        table: &str,
        stage: &str,
        columns: &[String],
        keys: &[String],
        keep: &[String],
    ) -> String {
        let list = self.list(columns);
        let sets: Vec<String> = set_columns(columns, keys, keep)
            .into_iter()
            .map(|c| format!("{q} = excluded.{q}", q = self.quote(c)))
            .collect();
        let action = if sets.is_empty() { "NOTHING".to_string() } else { format!("UPDATE SET {}", sets.join(", ")) };
        format!("INSERT INTO {table} ({list}) SELECT {list} FROM {stage} ON CONFLICT ({}) DO {action}", self.list(keys))
    }

    /// `left.k` and `right.k` equal for every key column, NULLs equal.
    fn same(self, left: &str, right: &str, keys: &[String]) -> String {
        let op = if self == Self::MySql { "<=>" } else { "IS NOT DISTINCT FROM" };
        keys.iter().map(|k| format!("{left}.{q} {op} {right}.{q}", q = self.quote(k))).collect::<Vec<_>>().join(" AND ")
    }

    /// A multiset's deletes (see [`sluice_core::Delivery::multiset`]): each row of `gone` (the
    /// key columns) removes one row of `table` that matches it on every key column, NULLs
    /// equal. The matching rows are set aside, numbered per distinct row, all removed, and
    /// those numbered beyond the count deleted put back. `columns` are the table's.
    pub(crate) fn delete_counted(self, table: &str, gone: &str, keys: &[String], columns: &[String]) -> Vec<String> {
        let temp = |name: &str| match self {
            Self::Postgres => format!("CREATE TEMP TABLE {name} ON COMMIT DROP AS"),
            Self::MySql => format!("CREATE TEMPORARY TABLE {name} AS"),
            Self::Sqlite => format!("CREATE TEMP TABLE {name} AS"),
        };
        let gone_before = match self {
            Self::Postgres => "DROP TABLE IF EXISTS pg_temp.sluice_counts, pg_temp.sluice_matched",
            Self::MySql => "DROP TEMPORARY TABLE IF EXISTS sluice_counts, sluice_matched",
            Self::Sqlite => "DROP TABLE IF EXISTS temp.sluice_counts",
        };
        let (keys_list, cols) = (self.list(keys), self.list(columns));
        // Names no column of the table has (the aliases are ones no table is given).
        let fresh = |base: &str| {
            let mut name = base.to_string();
            while columns.iter().any(|c| c.eq_ignore_ascii_case(&name)) {
                name.push('_');
            }
            self.quote(&name)
        };
        let (n, rn) = (fresh("sluice_n"), fresh("sluice_rn"));
        let picked: Vec<String> = columns.iter().map(|c| format!("sluice_t.{}", self.quote(c))).collect();
        let partition: Vec<String> = keys.iter().map(|k| format!("sluice_t.{}", self.quote(k))).collect();
        let delete = match self {
            Self::MySql => format!(
                "DELETE sluice_t FROM {table} sluice_t JOIN sluice_counts sluice_g ON {}",
                self.same("sluice_t", "sluice_g", keys)
            ),
            _ => format!(
                "DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM sluice_counts sluice_g WHERE {})",
                self.same(table, "sluice_g", keys)
            ),
        };
        let mut out = vec![gone_before.to_string()];
        if self == Self::Sqlite {
            out.push("DROP TABLE IF EXISTS temp.sluice_matched".into());
        }
        out.extend([
            format!("{} SELECT {keys_list}, count(*) AS {n} FROM {gone} GROUP BY {keys_list}", temp("sluice_counts")),
            format!(
                "{} SELECT {}, row_number() OVER (PARTITION BY {}) AS {rn} FROM {table} sluice_t \
                 WHERE EXISTS (SELECT 1 FROM sluice_counts sluice_g WHERE {})",
                temp("sluice_matched"),
                picked.join(", "),
                partition.join(", "),
                self.same("sluice_t", "sluice_g", keys)
            ),
            delete,
            format!(
                "INSERT INTO {table} ({cols}) SELECT {cols} FROM sluice_matched sluice_m \
                 WHERE sluice_m.{rn} > (SELECT sluice_g.{n} FROM sluice_counts sluice_g WHERE {})",
                self.same("sluice_m", "sluice_g", keys)
            ),
        ]);
        out
    }

    /// Delete the rows of `table` whose key is in `stage`.
    pub(crate) fn delete_matching(self, table: &str, stage: &str, keys: &[String]) -> String {
        match self {
            Self::MySql => format!("DELETE t FROM {table} t JOIN {stage} s ON {}", self.key_match("t", "s", keys)),
            _ => format!(
                "DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM {stage} s WHERE {})",
                self.key_match(table, "s", keys)
            ),
        }
    }
}

/// The columns an update sets: neither a key nor one to keep.
fn set_columns<'a>(columns: &'a [String], keys: &[String], keep: &[String]) -> Vec<&'a String> {
    columns.iter().filter(|c| !keys.contains(c) && !keep.contains(c)).collect()
}

/// Column names of a schema, in order.
pub(crate) fn column_names(schema: &Schema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}
