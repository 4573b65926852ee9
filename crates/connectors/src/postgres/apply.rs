//! How one delivery lands in a Postgres table inside the run's transaction: the table created
//! or evolved, rows by `COPY` (binary where the types allow), upserts and deletes through
//! temporary stage tables, and the key a snapshot copy owes added once it is complete.

use bytes::Bytes;
use futures_util::SinkExt;
use sluice_core::{CopyPhase, Delivery, Error, ErrorKind, Result, SyncMode};
use tokio_postgres::Transaction;

use super::target::sql_error;
use crate::sql_table::copy_binary::{self, BinaryRows};
use crate::sql_table::{Dialect, Literals, column_names};

/// Apply one delivery to `schema.name` inside `tx`: the table is created, or given the columns
/// it lacks, first.
pub(super) async fn apply(tx: &Transaction<'_>, schema: &str, name: &str, delivery: &Delivery) -> Result<()> {
    let table = format!("{}.{}", Dialect::Postgres.quote(schema), Dialect::Postgres.quote(name));
    let keys: &[String] = if delivery.mode.keyed() { &delivery.keys } else { &[] };
    let mut existing = existing_columns(tx, schema, name).await?;
    let created = existing.is_empty();
    let mut altered = false;
    // A snapshot copy loads its rows before the table gets its key, as pg_dump does: one index
    // build at the end is cheaper than keeping the index up row by row. The table's comment
    // marks the key as owed, so a restart in the middle of the copy still adds it.
    let defer_key = created && delivery.copy.is_some() && !delivery.keys.is_empty();
    if created {
        // A stream's snapshot brings its source key in replace and append too.
        // A table without a key (a multiset) may hold identical rows: no primary key.
        let key: &[String] = if defer_key || delivery.multiset { &[] } else { &delivery.keys };
        tx.batch_execute(&Dialect::Postgres.create_table(&table, &delivery.schema, key, false))
            .await
            .map_err(sql_error)?;
        if defer_key {
            tx.batch_execute(&format!("COMMENT ON TABLE {table} IS '{KEY_OWED}'")).await.map_err(sql_error)?;
        }
    } else {
        for field in delivery.schema.fields().iter().filter(|f| !existing.iter().any(|(c, _)| c == f.name())) {
            tx.batch_execute(&Dialect::Postgres.add_column(&table, field)).await.map_err(sql_error)?;
            altered = true;
        }
        // A column of integers that now gets fractions (the decoder widened it) becomes
        // double precision, as in the workspace.
        for field in delivery.schema.fields().iter().filter(|f| f.data_type() == &arrow::datatypes::DataType::Float64) {
            if existing.iter().any(|(c, oid)| c == field.name() && INTEGERS.contains(oid)) {
                let column = Dialect::Postgres.quote(field.name());
                tx.batch_execute(&format!(
                    "ALTER TABLE {table} ALTER COLUMN {column} TYPE double precision USING {column}::double precision"
                ))
                .await
                .map_err(sql_error)?;
                altered = true;
            }
        }
    }
    if created || altered {
        existing = existing_columns(tx, schema, name).await?;
    }
    let types = |names: &[String]| -> Vec<Option<u32>> {
        names.iter().map(|n| existing.iter().find(|(c, _)| c == n).map(|(_, oid)| *oid)).collect()
    };
    let columns = column_names(&delivery.schema);
    let column_types = types(&columns);
    match delivery.mode {
        SyncMode::Replace => {
            if !created {
                tx.batch_execute(&format!("TRUNCATE {table}")).await.map_err(sql_error)?;
            }
            copy(tx, &table, &columns, &column_types, &delivery.rows).await?;
        }
        SyncMode::Append => copy(tx, &table, &columns, &column_types, &delivery.rows).await?,
        // A multiset (a table without a key): its rows are copies to append.
        SyncMode::Upsert | SyncMode::Mirror if delivery.multiset => {
            copy(tx, &table, &columns, &column_types, &delivery.rows).await?;
            if delivery.delete_count() > 0 && !created {
                stage_gone(tx, &table, keys, &types(keys), delivery).await?;
                let all: Vec<String> = existing.iter().map(|(c, _)| c.clone()).collect();
                for sql in Dialect::Postgres.delete_counted(&table, "sluice_gone", keys, &all) {
                    tx.batch_execute(&sql).await.map_err(sql_error)?;
                }
            }
        }
        SyncMode::Upsert | SyncMode::Mirror => {
            if created {
                // A table made by this run is empty: every row is an insert.
                copy(tx, &table, &columns, &column_types, &delivery.rows).await?;
            } else if delivery.row_count() > 0 {
                let list = Dialect::Postgres.list(&columns);
                // Dropped first: an earlier delivery of this transaction (another table) made one.
                tx.batch_execute(&format!(
                    "DROP TABLE IF EXISTS pg_temp.sluice_stage; \
                     CREATE TEMP TABLE sluice_stage ON COMMIT DROP AS SELECT {list} FROM {table} WITH NO DATA"
                ))
                .await
                .map_err(sql_error)?;
                copy(tx, "sluice_stage", &columns, &column_types, &delivery.rows).await?;
                if unique_on(tx, schema, name, keys).await? {
                    // One statement, an index probe per row, instead of a join for the updates
                    // and another for the inserts.
                    tx.batch_execute(&Dialect::Postgres.upsert_on_conflict(
                        &table,
                        "sluice_stage",
                        &columns,
                        keys,
                        &delivery.keep,
                    ))
                    .await
                    .map_err(sql_error)?;
                } else {
                    if let Some(update) =
                        Dialect::Postgres.update_from(&table, "sluice_stage", &columns, keys, &delivery.keep)
                    {
                        tx.batch_execute(&update).await.map_err(sql_error)?;
                    }
                    let insert = Dialect::Postgres.insert_missing(&table, "sluice_stage", &columns, keys);
                    tx.batch_execute(&insert).await.map_err(sql_error)?;
                }
            }
            if delivery.delete_count() > 0 && !created {
                stage_gone(tx, &table, keys, &types(keys), delivery).await?;
                tx.batch_execute(&Dialect::Postgres.delete_matching(&table, "sluice_gone", keys))
                    .await
                    .map_err(sql_error)?;
            }
        }
    }
    if delivery.copy == Some(CopyPhase::Complete) && !delivery.keys.is_empty() {
        add_owed_key(tx, &table, &delivery.keys).await?;
    }
    Ok(())
}

/// The key columns of the delivery's deletes in the temporary table `sluice_gone`.
async fn stage_gone(
    tx: &Transaction<'_>,
    table: &str,
    keys: &[String],
    types: &[Option<u32>],
    delivery: &Delivery,
) -> Result<()> {
    let list = Dialect::Postgres.list(keys);
    tx.batch_execute(&format!(
        "DROP TABLE IF EXISTS pg_temp.sluice_gone; \
         CREATE TEMP TABLE sluice_gone ON COMMIT DROP AS SELECT {list} FROM {table} WITH NO DATA"
    ))
    .await
    .map_err(sql_error)?;
    copy(tx, "sluice_gone", keys, types, &delivery.deletes).await
}

/// The comment a table carries while its snapshot copy loads without the key.
const KEY_OWED: &str = "sluice: the primary key is added when the snapshot copy completes";

/// Give the table the key its copy was loaded without, when the comment says it is owed (a
/// table the user made keeps what it has).
async fn add_owed_key(tx: &Transaction<'_>, table: &str, keys: &[String]) -> Result<()> {
    let owed: bool = tx
        .query_one("SELECT obj_description(to_regclass($1), 'pg_class') IS NOT DISTINCT FROM $2", &[&table, &KEY_OWED])
        .await
        .map_err(sql_error)?
        .get(0);
    if !owed {
        return Ok(());
    }
    let list = Dialect::Postgres.list(keys);
    tx.batch_execute(&format!("ALTER TABLE {table} ADD PRIMARY KEY ({list}); COMMENT ON TABLE {table} IS NULL"))
        .await
        .map_err(sql_error)
}

/// The table's columns with their type OIDs; empty when it does not exist. The same columns
/// `information_schema.columns` lists (tables, views, foreign and partitioned tables, where
/// the user holds a privilege), read from the catalog directly, which is much cheaper.
/// `int2`, `int4` and `int8`.
const INTEGERS: [u32; 3] = [21, 23, 20];

async fn existing_columns(tx: &Transaction<'_>, schema: &str, table: &str) -> Result<Vec<(String, u32)>> {
    let rows = tx
        .query(
            "SELECT a.attname::text, a.atttypid FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'v', 'f', 'p') \
               AND a.attnum > 0 AND NOT a.attisdropped \
               AND (pg_catalog.pg_has_role(c.relowner, 'USAGE') \
                    OR pg_catalog.has_column_privilege(c.oid, a.attnum, 'SELECT, INSERT, UPDATE, REFERENCES'))",
            &[&schema, &table],
        )
        .await
        .map_err(sql_error)?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Whether the table has a unique index whose columns are exactly `keys` (immediate, valid,
/// without predicate or expressions): then `INSERT … ON CONFLICT (keys)` can upsert.
async fn unique_on(tx: &Transaction<'_>, schema: &str, table: &str, keys: &[String]) -> Result<bool> {
    if keys.is_empty() {
        return Ok(false);
    }
    let mut sorted = keys.to_vec();
    sorted.sort();
    let row = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
             JOIN pg_catalog.pg_class c ON c.oid = i.indrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND i.indisunique AND i.indimmediate AND i.indisvalid \
               AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnatts = cardinality($3::text[]) \
               AND ARRAY(SELECT a.attname::text COLLATE \"C\" FROM pg_catalog.pg_attribute a \
                         WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) ORDER BY 1) = $3::text[])",
            &[&schema, &table, &sorted],
        )
        .await
        .map_err(sql_error)?;
    Ok(row.get(0))
}

/// `COPY` batches into `table`, in messages of about half a megabyte. A blocking thread
/// renders the rows while the previous message travels, so rendering and Postgres's own work
/// overlap. Binary rows where every column's type (`types`, the OIDs of `columns`) takes the
/// Arrow values as they are, else text.
async fn copy(
    tx: &Transaction<'_>,
    table: &str,
    columns: &[String],
    types: &[Option<u32>],
    batches: &[arrow::record_batch::RecordBatch],
) -> Result<()> {
    const CHUNK: usize = 512 << 10;
    const SLICE: usize = 4_096;
    let binary = batches.first().and_then(|first| {
        let schema = first.schema();
        let same = batches.iter().all(|b| {
            b.schema().fields().iter().map(|f| f.data_type()).eq(schema.fields().iter().map(|f| f.data_type()))
        });
        if same { BinaryRows::new(&schema, types, batches) } else { None }
    });
    let list = Dialect::Postgres.list(columns);
    let statement = match binary {
        Some(_) => format!("COPY {table} ({list}) FROM STDIN (FORMAT binary)"),
        None => format!("COPY {table} ({list}) FROM STDIN"),
    };
    let sink = tx.copy_in::<_, Bytes>(&statement).await.map_err(sql_error)?;
    futures_util::pin_mut!(sink);
    let (chunks, mut rendered) = tokio::sync::mpsc::channel::<Result<Bytes>>(2);
    let batches = batches.to_vec();
    let renderer = tokio::task::spawn_blocking(move || {
        // Slices keep one message near CHUNK bytes whatever the batch size.
        let slices = batches.iter().flat_map(|batch| {
            (0..batch.num_rows()).step_by(SLICE).map(|start| batch.slice(start, SLICE.min(batch.num_rows() - start)))
        });
        match binary {
            Some(rows) => {
                let mut out = Vec::with_capacity(CHUNK + (CHUNK >> 2));
                out.extend_from_slice(copy_binary::HEADER);
                for slice in slices {
                    if let Err(e) = rows.write(&slice, &mut out) {
                        let _ = chunks.blocking_send(Err(e));
                        return;
                    }
                    if out.len() >= CHUNK {
                        let full = std::mem::replace(&mut out, Vec::with_capacity(CHUNK + (CHUNK >> 2)));
                        if chunks.blocking_send(Ok(Bytes::from(full))).is_err() {
                            return;
                        }
                    }
                }
                out.extend_from_slice(copy_binary::TRAILER);
                let _ = chunks.blocking_send(Ok(Bytes::from(out)));
            }
            None => {
                let mut text = String::with_capacity(CHUNK + (CHUNK >> 2));
                for slice in slices {
                    if let Err(e) = Literals::new(&slice, Dialect::Postgres).and_then(|l| l.write_copy(&mut text)) {
                        let _ = chunks.blocking_send(Err(e));
                        return;
                    }
                    if text.len() >= CHUNK {
                        let full = std::mem::replace(&mut text, String::with_capacity(CHUNK + (CHUNK >> 2)));
                        if chunks.blocking_send(Ok(Bytes::from(full))).is_err() {
                            return;
                        }
                    }
                }
                if !text.is_empty() {
                    let _ = chunks.blocking_send(Ok(Bytes::from(text)));
                }
            }
        }
    });
    while let Some(chunk) = rendered.recv().await {
        sink.send(chunk?).await.map_err(sql_error)?;
    }
    renderer.await.map_err(|e| Error::new(ErrorKind::Fatal, "COPY rendering panicked").with_source(e))?;
    sink.finish().await.map_err(sql_error)?;
    Ok(())
}
