//! Test connection: everything CDC needs, checked before anything is created, each failure in
//! words a person can act on.

use serde::Serialize;
use sluice_core::Result;

use super::PostgresConfig;
use super::config::cause;

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// What was found, and for a failure what to do.
    pub message: String,
}

fn check(name: &'static str, ok: bool, message: String) -> Check {
    Check { name, ok, message }
}

/// Run every check; a failed connection skips the rest.
pub async fn test_connection(config: &PostgresConfig, stream: &str) -> Result<Vec<Check>> {
    let client = match config.connect().await {
        Ok(c) => c,
        Err(e) => {
            let message = format!(
                "{e}. Check source.host, source.port, source.user and source.password, and that pg_hba.conf \
                 admits this client"
            );
            return Ok(vec![check("connect", false, message)]);
        }
    };
    let mut out = vec![check("connect", true, format!("connected to {} as {}", config.database, config.user))];
    let one = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await }
    };
    match one("SELECT current_setting('wal_level')").await {
        Ok(row) => {
            let level: String = row.get(0);
            let ok = level == "logical";
            let message = if ok {
                "wal_level is logical".to_string()
            } else {
                format!("wal_level is '{level}': set wal_level = logical in postgresql.conf and restart the server")
            };
            out.push(check("wal_level", ok, message));
        }
        Err(e) => out.push(check("wal_level", false, cause(&e))),
    }
    match one("SELECT rolreplication, rolsuper, current_user::text FROM pg_roles WHERE rolname = current_user").await {
        Ok(row) => {
            let (replication, superuser, user): (bool, bool, String) = (row.get(0), row.get(1), row.get(2));
            let ok = replication || superuser;
            let message = if ok {
                format!("{user} may replicate")
            } else {
                format!(
                    "user '{user}' has neither REPLICATION nor superuser: run ALTER ROLE \"{user}\" WITH REPLICATION"
                )
            };
            out.push(check("replication_privilege", ok, message));
        }
        Err(e) => out.push(check("replication_privilege", false, cause(&e))),
    }
    let slot = PostgresConfig::slot_name(stream);
    let capacity = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::int, (SELECT count(*)::int FROM pg_replication_slots), \
             EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1), \
             current_setting('max_wal_senders')::int, (SELECT count(*)::int FROM pg_stat_replication)",
            &[&slot],
        )
        .await;
    match capacity {
        Ok(row) => {
            let (slots, used, ours, senders, busy): (i32, i32, bool, i32, i32) =
                (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            let slot_ok = ours || used < slots;
            let message = if slot_ok {
                format!("{used} of {slots} replication slots in use")
            } else {
                format!(
                    "all {slots} replication slots are in use: drop an unused one (SELECT pg_drop_replication_slot('name')) \
                     or raise max_replication_slots"
                )
            };
            out.push(check("free_replication_slot", slot_ok, message));
            let sender_ok = busy < senders;
            let message = if sender_ok {
                format!("{busy} of {senders} WAL senders busy")
            } else {
                format!("all {senders} WAL senders are busy: raise max_wal_senders and restart the server")
            };
            out.push(check("free_wal_sender", sender_ok, message));
        }
        Err(e) => out.push(check("free_replication_slot", false, cause(&e))),
    }
    match tables(&client, config).await {
        Ok(found) if found.is_empty() => {
            out.push(check("tables", false, "no tables found: check source.tables or source.schema".into()));
        }
        Ok(found) => {
            let missing: Vec<&String> = config.tables.iter().filter(|t| !found.iter().any(|f| &f.0 == *t)).collect();
            let unkeyed: Vec<&String> = found.iter().filter(|(_, keyed)| !keyed).map(|(t, _)| t).collect();
            let message = if !missing.is_empty() {
                format!("tables not found: {}", join(&missing))
            } else if !unkeyed.is_empty() {
                let first = unkeyed[0];
                format!(
                    "tables without a primary key or REPLICA IDENTITY FULL: {}; add a primary key, or run ALTER TABLE {first} \
                     REPLICA IDENTITY FULL",
                    join(&unkeyed)
                )
            } else {
                format!("{} tables, each with a primary key or REPLICA IDENTITY FULL", found.len())
            };
            out.push(check("tables", missing.is_empty() && unkeyed.is_empty(), message));
        }
        Err(e) => out.push(check("tables", false, cause(&e))),
    }
    Ok(out)
}

fn join(items: &[&String]) -> String {
    items.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

/// The source's tables as `schema.table`, each with whether it can be keyed (a primary key, or
/// REPLICA IDENTITY FULL).
pub(crate) async fn tables(
    client: &tokio_postgres::Client,
    config: &PostgresConfig,
) -> std::result::Result<Vec<(String, bool)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT n.nspname || '.' || c.relname, \
             c.relreplident = 'f' OR EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'p') AND (n.nspname || '.' || c.relname = ANY($1) OR n.nspname = $2) \
             ORDER BY 1",
            &[&config.tables, &config.schema.clone().unwrap_or_default()],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}
