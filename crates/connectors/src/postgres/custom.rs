//! A stream's custom SQL blocks (`destination.custom_sql`), run in the unit's transaction in
//! place of Sluice's own insert or merge. The deliveries carry every change of the unit in
//! source order, with its op in [`OP_COLUMN`] (`delivery::changes`). Inserts and updates run
//! block by block, parents first; deletes run after them, children first, so a foreign key
//! from a child to its parent holds at every statement.

use arrow::array::{Array, AsArray};
use bytes::BytesMut;
use sluice_core::transform::{Block, CustomSql, Param};
use sluice_core::{Delivery, Result};
use tokio_postgres::Transaction;
use tokio_postgres::types::{Format, IsNull, ToSql, Type, to_sql_checked};

use super::target::sql_error;
use crate::delivery::OP_COLUMN;
use crate::sql_table::{Dialect, Literals};

/// Statements sent at once before their answers are awaited (one round trip per chunk).
const PIPELINE: usize = 256;

/// Run every block over the deliveries.
pub(super) async fn run(tx: &Transaction<'_>, custom: &CustomSql, deliveries: &[Delivery]) -> Result<()> {
    for block in custom.blocks() {
        run_block(tx, block, deliveries, false).await?;
    }
    for block in custom.blocks().iter().rev() {
        run_block(tx, block, deliveries, true).await?;
    }
    Ok(())
}

/// A value sent as text: the server parses it as whatever type the statement wants there
/// (bigint, uuid, jsonb, timestamptz…), as it would a literal, but it is never SQL.
#[derive(Debug)]
struct Text(Option<String>);

impl ToSql for Text {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match &self.0 {
            Some(text) => {
                out.extend_from_slice(text.as_bytes());
                Ok(IsNull::No)
            }
            None => Ok(IsNull::Yes),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _: &Type) -> Format {
        Format::Text
    }

    to_sql_checked!();
}

/// The block's statement for each change of its table: the deletes, or everything else.
async fn run_block(tx: &Transaction<'_>, block: &Block, deliveries: &[Delivery], deletes: bool) -> Result<()> {
    let (sql, params) = block.render(true);
    let mut statement = None;
    let ours = deliveries.iter().filter(|d| d.table.as_deref().is_some_and(|t| t.eq_ignore_ascii_case(&block.key)));
    for batch in ours.flat_map(|d| d.rows.iter()) {
        let Some(ops) = batch.column_by_name(OP_COLUMN).map(|c| c.as_string::<i32>().clone()) else { continue };
        let rows: Vec<usize> = (0..batch.num_rows()).filter(|&r| (ops.value(r) == "d") == deletes).collect();
        if rows.is_empty() {
            continue;
        }
        let schema = batch.schema();
        let columns: Vec<Option<usize>> = params
            .iter()
            .map(|p| match p {
                Param::Column(name) => schema.fields().iter().position(|f| f.name().eq_ignore_ascii_case(name)),
                Param::Op => schema.index_of(OP_COLUMN).ok(),
            })
            .collect();
        let mut values: Vec<Vec<Text>> = Vec::with_capacity(rows.len());
        let mut wanted = rows.iter().peekable();
        Literals::new(batch, Dialect::Postgres)?.for_each_row(|row, cells| {
            if wanted.peek() != Some(&&row) {
                return Ok(());
            }
            wanted.next();
            values.push(
                columns
                    .iter()
                    .map(|c| {
                        Text(c.and_then(|i| {
                            let (array, format) = &cells[i];
                            (!array.is_null(row)).then(|| format.value(row).to_string())
                        }))
                    })
                    .collect(),
            );
            Ok(())
        })?;
        let statement = match &statement {
            Some(s) => s,
            None => statement.insert(tx.prepare(&sql).await.map_err(|e| block_error(block, e))?),
        };
        for chunk in values.chunks(PIPELINE) {
            let runs = chunk.iter().map(|row| {
                let refs: Vec<&(dyn ToSql + Sync)> = row.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                async move { tx.execute(statement, &refs).await }
            });
            futures_util::future::try_join_all(runs).await.map_err(|e| block_error(block, e))?;
        }
    }
    Ok(())
}

fn block_error(block: &Block, e: tokio_postgres::Error) -> sluice_core::Error {
    let e = sql_error(e);
    sluice_core::Error::new(e.kind(), format!("custom SQL block `{}`: {}", block.key, e))
}
