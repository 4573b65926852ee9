//! Postgres column types: each source type resolved through domains, and the one table of the
//! column type it gets in Sluice. The snapshot's `COPY` rows and the streamed changes both take
//! their columns' types from here, so a table is the same however its rows arrived.

use std::collections::HashMap;

use sluice_core::ColumnType;
use sluice_core::schema::Scalar;

/// A column type, resolved through domains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TypeInfo {
    /// Base type name (`int4`, `numeric`, `timestamptz`, …).
    pub name: String,
    /// `typcategory`: `A` array, `E` enum, …
    pub category: char,
    /// The element type of an array.
    pub element: Option<Box<TypeInfo>>,
    /// The type modifier a domain carries (for `numeric(p,s)` domains).
    pub typmod: i32,
}

/// Type lookups, cached per OID.
#[derive(Default)]
pub(crate) struct Types {
    known: HashMap<u32, TypeInfo>,
}

impl Types {
    pub async fn get(&mut self, client: &tokio_postgres::Client, oid: u32) -> Result<TypeInfo, tokio_postgres::Error> {
        if let Some(t) = self.known.get(&oid) {
            return Ok(t.clone());
        }
        let info = resolve(client, oid, 0).await?;
        self.known.insert(oid, info.clone());
        Ok(info)
    }
}

async fn resolve(client: &tokio_postgres::Client, oid: u32, depth: u8) -> Result<TypeInfo, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT typname::text, typtype::text, typbasetype, typcategory::text, typelem, typtypmod FROM pg_type WHERE oid = $1",
            &[&oid],
        )
        .await?;
    let (name, kind, base, category, element, typmod): (String, String, u32, String, u32, i32) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4), row.get(5));
    if kind == "d" && depth < 8 {
        let mut info = Box::pin(resolve(client, base, depth + 1)).await?;
        if info.typmod < 0 {
            info.typmod = typmod;
        }
        return Ok(info);
    }
    let category = category.chars().next().unwrap_or('U');
    let element = if category == 'A' && element != 0 && depth < 8 {
        Some(Box::new(Box::pin(resolve(client, element, depth + 1)).await?))
    } else {
        None
    };
    Ok(TypeInfo { name, category, element, typmod })
}

/// The column type of a column of type `info` with column modifier `typmod` (a domain's own
/// modifier when the column has none).
///
/// - `numeric(p,s)` keeps its precision and scale; a scale above the precision, or below zero
///   (PostgreSQL 15 allows both), has no DECIMAL, so such a column is text. An unconstrained
///   `numeric` is DOUBLE.
/// - A one-dimensional array of booleans, integers, floats, text, enums or UUIDs is a list;
///   other arrays are JSON.
/// - Enums, text and every type not named here are VARCHAR.
pub(crate) fn column_type(info: &TypeInfo, typmod: i32) -> ColumnType {
    if info.category == 'A' {
        return array_item(info).map_or(ColumnType::Json, ColumnType::List);
    }
    let typmod = if typmod >= 0 { typmod } else { info.typmod };
    match info.name.as_str() {
        "bool" => ColumnType::Boolean,
        "int2" | "int4" | "int8" | "oid" => ColumnType::Bigint,
        "float4" | "float8" => ColumnType::Double,
        "numeric" if typmod >= 4 => {
            let scale = (typmod - 4) & 0xffff;
            let precision = ((typmod - 4) >> 16) & 0xffff;
            if (1..=38).contains(&precision) && scale <= precision {
                ColumnType::Decimal(precision as u8, scale as u8)
            } else {
                ColumnType::Varchar
            }
        }
        "numeric" => ColumnType::Double,
        "uuid" => ColumnType::Uuid,
        "json" | "jsonb" => ColumnType::Json,
        "date" => ColumnType::Date,
        "timestamp" => ColumnType::Timestamp,
        "timestamptz" => ColumnType::Timestamptz,
        "time" => ColumnType::Time,
        "bytea" => ColumnType::Blob,
        _ => ColumnType::Varchar,
    }
}

/// The columns of `schema.table` with the column type each gets here (dropped and system
/// columns left out), in their order; `None` when the table does not exist. A stream into the
/// table starts its decoder from them.
pub(crate) async fn table_columns(
    client: &tokio_postgres::Client,
    schema: &str,
    table: &str,
) -> Result<Option<Vec<sluice_core::schema::Column>>, tokio_postgres::Error> {
    let name = format!("\"{}\".\"{}\"", schema.replace('"', "\"\""), table.replace('"', "\"\""));
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, a.atttypmod FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&name],
        )
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut types = Types::default();
    let mut columns = Vec::with_capacity(rows.len());
    for row in rows {
        let (column, oid, typmod): (String, u32, i32) = (row.get(0), row.get(1), row.get(2));
        let info = types.get(client, oid).await?;
        columns.push(sluice_core::schema::Column { name: column, ty: column_type(&info, typmod) });
    }
    Ok(Some(columns))
}

/// The list item type of an array whose elements are booleans, integers, floats, text, enums
/// or UUIDs.
fn array_item(info: &TypeInfo) -> Option<Scalar> {
    let element = info.element.as_ref()?;
    if element.category == 'E' {
        return Some(Scalar::Varchar);
    }
    Some(match element.name.as_str() {
        "bool" => Scalar::Boolean,
        "int2" | "int4" | "int8" | "oid" => Scalar::Bigint,
        "float4" | "float8" => Scalar::Double,
        "text" | "varchar" | "bpchar" | "name" | "citext" | "uuid" => Scalar::Varchar,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(name: &str, category: char) -> TypeInfo {
        TypeInfo { name: name.into(), category, element: None, typmod: -1 }
    }

    fn array(element: TypeInfo) -> TypeInfo {
        TypeInfo { element: Some(Box::new(element)), ..base("_x", 'A') }
    }

    #[test]
    fn numeric_columns_without_a_decimal_type_are_text() {
        let numeric = base("numeric", 'N');
        let typmod = |p: i32, s: i32| ((p << 16) | (s & 0x7ff)) + 4;
        assert_eq!(column_type(&numeric, typmod(10, 2)), ColumnType::Decimal(10, 2));
        assert_eq!(column_type(&numeric, typmod(38, 38)), ColumnType::Decimal(38, 38));
        // PostgreSQL 15: numeric(3,5) holds 0.00123; numeric(5,-2) holds 12300.
        assert_eq!(column_type(&numeric, typmod(3, 5)), ColumnType::Varchar);
        assert_eq!(column_type(&numeric, typmod(5, -2)), ColumnType::Varchar);
        assert_eq!(column_type(&numeric, -1), ColumnType::Double);
        // A domain over numeric(12,2) carries the modifier itself.
        assert_eq!(column_type(&TypeInfo { typmod: typmod(12, 2), ..numeric }, -1), ColumnType::Decimal(12, 2));
    }

    #[test]
    fn arrays_of_scalars_are_lists_and_others_json() {
        assert_eq!(column_type(&array(base("int4", 'N')), -1), ColumnType::List(Scalar::Bigint));
        assert_eq!(column_type(&array(base("mood", 'E')), -1), ColumnType::List(Scalar::Varchar));
        assert_eq!(column_type(&array(base("jsonb", 'U')), -1), ColumnType::Json);
        assert_eq!(column_type(&array(base("numeric", 'N')), -1), ColumnType::Json);
        assert_eq!(column_type(&base("mood", 'E'), -1), ColumnType::Varchar);
        assert_eq!(column_type(&base("timestamptz", 'D'), -1), ColumnType::Timestamptz);
    }
}
