//! A stream's custom SQL blocks (`destination.custom_sql`), run in the unit's transaction in
//! place of Sluice's own insert or merge (`sql_table::custom` plans them).

use bytes::BytesMut;
use sluice_core::Result;
use sluice_core::transform::CustomSql;
use sluice_core::{Delivery, Error};
use tokio_postgres::Transaction;
use tokio_postgres::types::{Format, IsNull, ToSql, Type, to_sql_checked};

use super::target::sql_error;
use crate::sql_table::Dialect;
use crate::sql_table::custom::plan;

/// Statements sent at once before their answers are awaited (one round trip per chunk).
const PIPELINE: usize = 256;

/// A value sent as text: the server parses it as whatever type the statement wants there
/// (bigint, uuid, jsonb, timestamptz…), as it would a literal, but it is never SQL.
#[derive(Debug)]
struct Text<'a>(Option<&'a str>);

impl ToSql for Text<'_> {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self.0 {
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

/// Run every block over the deliveries.
pub(super) async fn run(tx: &Transaction<'_>, custom: &CustomSql, deliveries: &[Delivery]) -> Result<()> {
    for run in plan(custom, deliveries, Dialect::Postgres)? {
        let failed = |e| {
            let e = sql_error(e);
            Error::new(e.kind(), format!("custom SQL block `{}`: {e}", run.block.key))
        };
        let statement = tx.prepare(&run.sql).await.map_err(failed)?;
        for chunk in run.rows.chunks(PIPELINE) {
            let runs = chunk.iter().map(|row| {
                let texts: Vec<Text<'_>> = row.iter().map(|v| Text(v.as_deref())).collect();
                let statement = &statement;
                async move {
                    let refs: Vec<&(dyn ToSql + Sync)> = texts.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
                    tx.execute(statement, &refs).await
                }
            });
            futures_util::future::try_join_all(runs).await.map_err(failed)?;
        }
    }
    Ok(())
}
