//! Writes into Snowflake tables, one transaction per unit with the stream's position.

use std::collections::HashMap;

use arrow::array::Array;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use sluice_core::schema::{Column, ColumnType, TableSchema, is_json};
use sluice_core::{Delivery, Destination, Error, Result, Stamp, SyncMode};

use super::SnowflakeConfig;
use super::client::{Binding, Client};
use super::stage;
use crate::sql_table::{Dialect, Literals};

/// Where streams keep their positions, in the destination's schema: one row per committed
/// unit, numbered per owner (`seq`); the newest is the position. Rows are only inserted inside
/// a unit's transaction: a unit that dies between BEGIN and COMMIT (kill -9) leaves its
/// transaction open on the server until Snowflake aborts it, and a DELETE or UPDATE of a row it
/// touched would conflict with it. Older rows are pruned outside the transactions.
const POSITIONS: &str = "SLUICE_POSITIONS";

/// Prune the owner's older position rows after a session's first unit and every this many.
const PRUNE_EVERY: u64 = 32;

/// Delivers into Snowflake tables.
pub struct SnowflakeTarget {
    config: SnowflakeConfig,
    client: Option<Client>,
    /// Columns (as Snowflake names them, and their types) of tables seen.
    tables: HashMap<String, Vec<(String, String)>>,
    /// The write failed: the next one first reads the position the table holds, as a COMMIT
    /// whose answer was lost may have landed.
    failed: bool,
    /// `SLUICE_STAGE` exists (made in this session).
    staged: bool,
    /// The account's stage answered with an upload Sluice cannot make: INSERTs from then on.
    unstageable: bool,
    /// The `seq` of each owner's newest position row, as read or committed in this session.
    seqs: HashMap<String, u64>,
}

impl SnowflakeTarget {
    /// A destination for `config` (logs in on use).
    pub fn new(config: SnowflakeConfig) -> Self {
        Self {
            config,
            client: None,
            tables: HashMap::new(),
            failed: false,
            staged: false,
            unstageable: false,
            seqs: HashMap::new(),
        }
    }

    async fn client(&mut self) -> Result<&Client> {
        if self.client.is_none() {
            self.client = Some(Client::login(&self.config).await?);
        }
        Ok(self.client.as_ref().expect("set above"))
    }

    fn forget_on_error<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.client = None;
            self.tables.clear();
            // A COMMIT whose answer was lost may have used the next number: read it again.
            self.seqs.clear();
        }
        result
    }

    /// The table's name in SQL, qualified by database and schema.
    fn qualified(&self, table: &str) -> String {
        let c = &self.config;
        format!("{}.{}.{}", quote(&c.database), quote(&c.schema), c.name(table))
    }

    async fn columns(&mut self, table: &str) -> Result<Vec<(String, String)>> {
        if let Some(columns) = self.tables.get(table) {
            return Ok(columns.clone());
        }
        let name = self.config.fold(table);
        let sql = format!(
            "SELECT column_name, data_type FROM {}.information_schema.columns \
             WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
            quote(&self.config.database)
        );
        let binds = [vec![Some(self.config.schema.clone())], vec![Some(name)]];
        let rows = self.client().await?.query(&sql, &binds).await?;
        let columns: Vec<(String, String)> = rows
            .into_iter()
            .filter_map(|r| Some((r.first()?.clone()?, r.get(1)?.clone().unwrap_or_default())))
            .collect();
        if !columns.is_empty() {
            self.tables.insert(table.to_string(), columns.clone());
        }
        Ok(columns)
    }

    /// Which of `schema`'s columns the table holds as semi-structured (VARIANT, OBJECT, ARRAY:
    /// loaded through [`stage::variant`]): decided by the table, so a column made as text
    /// before stays text.
    async fn variants(&mut self, table: &str, schema: &Schema) -> Result<Vec<bool>> {
        let existing = self.columns(table).await?;
        Ok(schema
            .fields()
            .iter()
            .map(|f| {
                let name = self.config.fold(f.name());
                existing.iter().any(|(n, ty)| {
                    n.eq_ignore_ascii_case(&name)
                        && ["VARIANT", "OBJECT", "ARRAY"].contains(&ty.to_uppercase().as_str())
                })
            })
            .collect())
    }

    /// Create the table, or add the columns it lacks (DDL commits on its own in Snowflake, so
    /// this runs before the unit's transaction; each step is idempotent).
    async fn ensure(&mut self, table: &str, schema: &Schema) -> Result<()> {
        let existing = self.columns(table).await?;
        let qualified = self.qualified(table);
        let mut statements = Vec::new();
        if existing.is_empty() {
            let defs: Vec<String> =
                schema.fields().iter().map(|f| format!("{} {}", self.config.name(f.name()), sql_type(f))).collect();
            statements.push(format!("CREATE TABLE IF NOT EXISTS {qualified} ({})", defs.join(", ")));
        } else {
            for field in schema.fields() {
                if !existing.iter().any(|(n, _)| n.eq_ignore_ascii_case(&self.config.fold(field.name()))) {
                    let ty = sql_type(field);
                    statements
                        .push(format!("ALTER TABLE {qualified} ADD COLUMN {} {ty}", self.config.name(field.name())));
                }
            }
        }
        for sql in &statements {
            self.client().await?.query(sql, &[]).await?;
        }
        if !statements.is_empty() {
            self.tables.remove(table);
        }
        Ok(())
    }

    /// Everything in one transaction, committed, or rolled back when `commit` is false (a probe).
    async fn write_all(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>, commit: bool) -> Result<()> {
        if let Some(stamp) = stamp.filter(|_| self.failed)
            && self.read_stamp(&stamp.owner).await?.as_deref() == Some(stamp.checkpoint.as_str())
        {
            // The unit's COMMIT landed before: writing it again would repeat its rows.
            self.failed = false;
            return Ok(());
        }
        let tables: Vec<String> =
            deliveries.iter().map(|d| d.table.clone().unwrap_or_else(|| self.config.table.clone())).collect();
        for (table, delivery) in tables.iter().zip(deliveries) {
            self.ensure(table, &delivery.schema).await?;
        }
        let seq = match stamp {
            Some(stamp) => Some(self.next_seq(&stamp.owner).await?),
            None => None,
        };
        let mut statements: Vec<(String, Vec<Binding>)> = Vec::new();
        for (i, (table, delivery)) in tables.iter().zip(deliveries).enumerate() {
            let big = self.config.copy_rows > 0
                && (delivery.row_count() + delivery.delete_count()) as u64 >= self.config.copy_rows
                && !(delivery.mode.keyed() && delivery.keys.is_empty());
            let variants = self.variants(table, &delivery.schema).await?;
            let owner = stamp.map(|s| s.owner.as_str());
            let staged = if big { self.stage(table, delivery, (owner, i), &variants).await? } else { None };
            match staged {
                Some(loads) => statements.extend(loads.into_iter().map(|sql| (sql, Vec::new()))),
                None => statements.extend(self.statements(table, delivery, &variants)?),
            }
        }
        let positions = self.qualified(POSITIONS);
        if let (Some(stamp), Some(seq)) = (stamp, seq) {
            statements.push((
                format!(
                    "INSERT INTO {positions} (\"owner\", \"checkpoint\", \"seq\", \"written_at\") \
                     VALUES (?, ?, ?, CURRENT_TIMESTAMP())"
                ),
                vec![
                    vec![Some(stamp.owner.clone())],
                    vec![Some(stamp.checkpoint.clone())],
                    vec![Some(seq.to_string())],
                ],
            ));
        }
        let client = self.client().await?;
        client.query("BEGIN", &[]).await?;
        for (sql, binds) in &statements {
            if let Err(e) = client.query(sql, binds).await {
                let _ = client.query("ROLLBACK", &[]).await;
                return Err(e);
            }
        }
        if commit && stamp.is_some() {
            sluice_core::crash::point("snowflake.commit");
        }
        client.query(if commit { "COMMIT" } else { "ROLLBACK" }, &[]).await?;
        if let (Some(stamp), Some(seq), true) = (stamp, seq, commit) {
            let first = self.seqs.insert(stamp.owner.clone(), seq).is_none();
            if first || seq % PRUNE_EVERY == 0 {
                self.prune(&stamp.owner, seq).await;
            }
        }
        Ok(())
    }

    /// The positions table, made or given the `seq` column it lacks (a table of an older
    /// Sluice); DDL, so before the unit's transaction.
    async fn ensure_positions(&mut self) -> Result<()> {
        let positions = self.qualified(POSITIONS);
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {positions} (\"owner\" VARCHAR, \"checkpoint\" VARCHAR, \
             \"seq\" NUMBER(38,0), \"written_at\" TIMESTAMP_TZ)"
        );
        self.client().await?.query(&sql, &[]).await?;
        if !self.columns(POSITIONS).await?.iter().any(|(name, _)| name == "seq") {
            let sql = format!("ALTER TABLE {positions} ADD COLUMN \"seq\" NUMBER(38,0)");
            self.client().await?.query(&sql, &[]).await?;
            self.tables.remove(POSITIONS);
        }
        Ok(())
    }

    /// The number of `owner`'s next position row: one past the newest committed.
    async fn next_seq(&mut self, owner: &str) -> Result<u64> {
        if let Some(seq) = self.seqs.get(owner) {
            return Ok(seq + 1);
        }
        self.ensure_positions().await?;
        let sql = format!("SELECT MAX(\"seq\") FROM {} WHERE \"owner\" = ?", self.qualified(POSITIONS));
        let rows = self.client().await?.query(&sql, &[vec![Some(owner.to_string())]]).await?;
        let newest = rows.into_iter().next().and_then(|r| r.into_iter().next().flatten());
        // NUMBER comes back as text, possibly as `12.0` or `1.2e1`, from some servers.
        let newest = match newest {
            None => 0,
            Some(n) => n.parse::<f64>().map_err(|_| {
                Error::new(
                    sluice_core::ErrorKind::Fatal,
                    format!("Snowflake: {POSITIONS}.seq holds {n:?}, not a number"),
                )
            })? as u64,
        };
        Ok(newest + 1)
    }

    /// Remove `owner`'s position rows older than `seq`, in a statement of its own. A failure
    /// only leaves rows for the next prune.
    async fn prune(&mut self, owner: &str, seq: u64) {
        // A row of an older Sluice has no `seq`: it is older than any row numbered since.
        let sql = format!(
            "DELETE FROM {} WHERE \"owner\" = ? AND (\"seq\" < ? OR \"seq\" IS NULL)",
            self.qualified(POSITIONS)
        );
        let binds = [vec![Some(owner.to_string())], vec![Some(seq.to_string())]];
        if let Some(client) = &self.client
            && let Err(e) = client.query(&sql, &binds).await
        {
            tracing::warn!(owner, error = %e, "Pruning old Snowflake position rows failed; the next prune retries.");
        }
    }

    /// Put `delivery` (the `n`th of the write) into the stage as one Parquet file in a folder of
    /// its own (and, keyed, make its landing table: DDL, so before the transaction); the
    /// statements that load it. `None`: this account's stage takes no upload Sluice can make
    /// (S3 or Azure credentials, client-side encryption), so the rows go as INSERTs.
    async fn stage(
        &mut self,
        table: &str,
        delivery: &Delivery,
        (owner, n): (Option<&str>, usize),
        variants: &[bool],
    ) -> Result<Option<Vec<String>>> {
        if self.unstageable {
            return Ok(None);
        }
        let bytes = stage::parquet(delivery, |n| self.config.fold(n))?;
        let schema = format!("{}.{}", quote(&self.config.database), quote(&self.config.schema));
        // A random folder of fixed length, so no folder's name begins another's (a stage path
        // is a name prefix), and a trailing slash.
        let reference = format!("@{schema}.{}/{:016x}/", stage::STAGE, rand::random::<u64>());
        if !self.staged {
            let sql =
                format!("CREATE STAGE IF NOT EXISTS {schema}.{} ENCRYPTION = (TYPE = 'SNOWFLAKE_SSE')", stage::STAGE);
            self.client().await?.query(&sql, &[]).await?;
            self.staged = true;
        }
        let file = format!("{n}.parquet");
        // A landing table of the delivery's own, every column nullable (a delete's mark row has
        // only its keys) and JSON as the text it is staged as, emptied again inside the
        // transaction.
        // Named by the writing stream too, so two streams into one table never share one.
        let writer = owner.map(|o| format!("{o}_")).unwrap_or_default();
        let landing = self.qualified(&format!("{table}__sluice_landing_{writer}{n}"));
        let mut columns: Vec<String> = delivery
            .schema
            .fields()
            .iter()
            .map(|f| format!("{} {}", self.config.name(f.name()), column_type(f.data_type())))
            .collect();
        columns.push(format!("{} BOOLEAN", self.config.name(stage::DELETED)));
        let make_landing = format!("CREATE OR REPLACE TABLE {landing} ({})", columns.join(", "));
        let client = self.client().await?;
        let put = format!("PUT 'file:///sluice/{file}' {reference} AUTO_COMPRESS = FALSE OVERWRITE = TRUE");
        let answer = client.put(&put).await?;
        if !client.upload(&answer, &file, bytes).await? {
            tracing::warn!(table, "This Snowflake account's stage takes no upload Sluice makes; loading with INSERTs.");
            self.unstageable = true;
            return Ok(None);
        }
        if delivery.mode.keyed() || variants.contains(&true) {
            client.query(&make_landing, &[]).await?;
        }
        let name = |c: &str| self.config.name(c);
        Ok(Some(stage::statements(delivery, &reference, &self.qualified(table), &landing, name, variants)))
    }

    /// The statements of one delivery: replace empties the table; keyed modes delete the keys
    /// they write or remove; rows are inserted with one array binding per column.
    fn statements(&self, table: &str, delivery: &Delivery, variants: &[bool]) -> Result<Vec<(String, Vec<Binding>)>> {
        let qualified = self.qualified(table);
        let mut out = Vec::new();
        if delivery.mode == SyncMode::Replace {
            out.push((format!("DELETE FROM {qualified}"), Vec::new()));
        }
        if !delivery.keep.is_empty() {
            return self.statements_keeping(&qualified, delivery, variants);
        }
        if delivery.mode.keyed() && !delivery.keys.is_empty() {
            let condition: Vec<String> = delivery.keys.iter().map(|k| format!("{} = ?", self.config.name(k))).collect();
            let delete = format!("DELETE FROM {qualified} WHERE {}", condition.join(" AND "));
            for batch in delivery.rows.iter().chain(&delivery.deletes).filter(|b| b.num_rows() > 0) {
                let keys = batch
                    .project(&delivery.keys.iter().filter_map(|k| batch.schema().index_of(k).ok()).collect::<Vec<_>>())
                    .map_err(|e| Error::new(sluice_core::ErrorKind::Fatal, "keys").with_source(e))?;
                out.push((delete.clone(), bindings(&keys)?));
            }
        }
        for batch in delivery.rows.iter().filter(|b| b.num_rows() > 0) {
            let names: Vec<String> = batch.schema().fields().iter().map(|f| self.config.name(f.name())).collect();
            let marks = vec!["?"; names.len()].join(", ");
            let names = names.join(", ");
            let variant = |f: &Field| delivery.schema.index_of(f.name()).is_ok_and(|i| variants[i]);
            let insert = if batch.schema().fields().iter().any(|f| variant(f)) {
                // A VARIANT takes its value through a function, which VALUES cannot call.
                let select: Vec<String> = (batch.schema().fields().iter().enumerate())
                    .map(|(i, f)| {
                        let column = format!("column{}", i + 1);
                        if variant(f) { stage::variant(&column, is_json(f)) } else { column }
                    })
                    .collect();
                format!("INSERT INTO {qualified} ({names}) SELECT {} FROM VALUES ({marks})", select.join(", "))
            } else {
                format!("INSERT INTO {qualified} ({names}) VALUES ({marks})")
            };
            out.push((insert, bindings(batch)?));
        }
        Ok(out)
    }

    /// The statements of a delivery whose rows lack the columns in `keep`: the rows of keys
    /// the table has are updated but those columns; the others are inserted (NULL in them).
    fn statements_keeping(
        &self,
        qualified: &str,
        delivery: &Delivery,
        variants: &[bool],
    ) -> Result<Vec<(String, Vec<Binding>)>> {
        let fault = |e: arrow::error::ArrowError| Error::new(sluice_core::ErrorKind::Fatal, "keep").with_source(e);
        let name = |c: &str| self.config.name(c);
        let schema = &delivery.schema;
        let keys: Vec<usize> = delivery.keys.iter().filter_map(|k| schema.index_of(k).ok()).collect();
        let sets: Vec<usize> = (0..schema.fields().len())
            .filter(|i| !keys.contains(i) && !delivery.keep.contains(schema.field(*i).name()))
            .collect();
        let value = |i: usize, column: String| {
            if variants[i] { stage::variant(&column, is_json(schema.field(i))) } else { column }
        };
        let mut out = Vec::new();
        for batch in delivery.rows.iter().filter(|b| b.num_rows() > 0) {
            if !sets.is_empty() {
                // `SELECT … FROM VALUES` binds them, so a VARIANT takes its value through a function.
                let assigned: Vec<String> = sets
                    .iter()
                    .enumerate()
                    .map(|(n, i)| {
                        format!("{} = {}", name(schema.field(*i).name()), value(*i, format!("v.column{}", n + 1)))
                    })
                    .collect();
                let on: Vec<String> = keys
                    .iter()
                    .enumerate()
                    .map(|(n, i)| format!("t.{} = v.column{}", name(schema.field(*i).name()), sets.len() + n + 1))
                    .collect();
                let marks = vec!["?"; sets.len() + keys.len()].join(", ");
                let update = format!(
                    "UPDATE {qualified} AS t SET {} FROM (SELECT * FROM VALUES ({marks})) AS v WHERE {}",
                    assigned.join(", "),
                    on.join(" AND ")
                );
                let order: Vec<usize> = sets.iter().chain(&keys).copied().collect();
                out.push((update, bindings(&batch.project(&order).map_err(fault)?)?));
            }
            let names: Vec<String> = schema.fields().iter().map(|f| name(f.name())).collect();
            let select: Vec<String> = (0..names.len()).map(|i| value(i, format!("v.column{}", i + 1))).collect();
            let missing: Vec<String> = keys.iter().map(|i| format!("t.{} = v.column{}", names[*i], i + 1)).collect();
            let insert = format!(
                "INSERT INTO {qualified} ({}) SELECT {} FROM (SELECT * FROM VALUES ({})) AS v \
                 WHERE NOT EXISTS (SELECT 1 FROM {qualified} AS t WHERE {})",
                names.join(", "),
                select.join(", "),
                vec!["?"; names.len()].join(", "),
                missing.join(" AND ")
            );
            out.push((insert, bindings(batch)?));
        }
        Ok(out)
    }

    async fn read_stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let columns = self.columns(POSITIONS).await?;
        if columns.is_empty() {
            return Ok(None);
        }
        // The newest row; a table of an older Sluice, without `seq`, holds one row per owner.
        let order =
            if columns.iter().any(|(name, _)| name == "seq") { "ORDER BY \"seq\" DESC NULLS LAST LIMIT 1" } else { "" };
        let sql = format!("SELECT \"checkpoint\" FROM {} WHERE \"owner\" = ? {order}", self.qualified(POSITIONS));
        let rows = self.client().await?.query(&sql, &[vec![Some(owner.to_string())]]).await?;
        Ok(rows.into_iter().next().and_then(|r| r.into_iter().next().flatten()))
    }
}

/// Each column's values as text, one array binding per column.
fn bindings(batch: &RecordBatch) -> Result<Vec<Binding>> {
    let mut columns: Vec<Binding> = vec![Vec::with_capacity(batch.num_rows()); batch.num_columns()];
    // Instants as `…+00:00` text (the SQLite dialect's form), which TIMESTAMP_TZ parses.
    Literals::new(batch, Dialect::Sqlite)?.for_each_row(|row, cells| {
        for (i, (array, format)) in cells.iter().enumerate() {
            columns[i].push((!array.is_null(row)).then(|| format.value(row).to_string()));
        }
        Ok(())
    })?;
    Ok(columns)
}

/// A Snowflake identifier that keeps its case.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The Snowflake type of an Arrow column: JSON text is VARIANT.
fn sql_type(field: &Field) -> String {
    if is_json(field) { "VARIANT".into() } else { column_type(field.data_type()) }
}

/// The Snowflake type of an Arrow type.
fn column_type(ty: &DataType) -> String {
    match ty {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => "NUMBER(38,0)".into(),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => "NUMBER(38,0)".into(),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => "FLOAT".into(),
        DataType::Timestamp(_, Some(_)) => "TIMESTAMP_TZ".into(),
        DataType::Timestamp(_, None) => "TIMESTAMP_NTZ".into(),
        DataType::Date32 | DataType::Date64 => "DATE".into(),
        DataType::Decimal128(p, s) => format!("NUMBER({p},{s})"),
        _ => "VARCHAR".into(),
    }
}

/// The column type Sluice reads back from a Snowflake type, for a stream that resumes.
fn column_of(ty: &str) -> ColumnType {
    let upper = ty.to_uppercase();
    match upper.as_str() {
        "BOOLEAN" => ColumnType::Boolean,
        "FLOAT" | "DOUBLE" | "REAL" => ColumnType::Double,
        "DATE" => ColumnType::Date,
        "VARIANT" | "OBJECT" | "ARRAY" => ColumnType::Json,
        t if t.starts_with("TIMESTAMP") => ColumnType::Timestamptz,
        t if t.starts_with("NUMBER") || t == "INTEGER" || t == "BIGINT" => ColumnType::Bigint,
        _ => ColumnType::Varchar,
    }
}

#[async_trait]
impl Destination for SnowflakeTarget {
    async fn check(&mut self) -> Result<()> {
        let result = async { self.client().await?.query("SELECT 1", &[]).await.map(drop) }.await;
        self.forget_on_error(result)
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        self.write(std::slice::from_ref(delivery), None).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let result = self.write_all(deliveries, stamp, true).await;
        self.failed = result.is_err();
        self.forget_on_error(result)
    }

    async fn probe(&mut self, deliveries: &[Delivery]) -> Option<Result<()>> {
        let result = self.write_all(deliveries, None, false).await;
        Some(self.forget_on_error(result))
    }

    async fn stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let result = self.read_stamp(owner).await;
        self.forget_on_error(result)
    }

    async fn table_schema(&mut self, table: &str) -> Result<Option<TableSchema>> {
        let result = self.columns(table).await;
        let columns = self.forget_on_error(result)?;
        if columns.is_empty() {
            return Ok(None);
        }
        Ok(Some(TableSchema::existing(
            columns.into_iter().map(|(name, ty)| Column { ty: column_of(&ty), name }).collect(),
        )))
    }
}
