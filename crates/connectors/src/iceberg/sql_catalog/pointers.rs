//! The SQL catalog's two tables, as Iceberg's JDBC catalog and pyiceberg's `SqlCatalog` define
//! them: `iceberg_tables` (each table's current metadata file, swapped by compare-and-set) and
//! `iceberg_namespace_properties`, in a SQLite file or a Postgres database.

use std::path::PathBuf;

use sluice_core::{Error, ErrorKind, Result};
use tokio::sync::Mutex;

use super::SqlCatalogDatabase;
use crate::postgres::config::{Endpoint, cause, connect};

const TABLES: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS iceberg_tables (catalog_name VARCHAR(255) NOT NULL, \
     table_namespace VARCHAR(255) NOT NULL, table_name VARCHAR(255) NOT NULL, \
     metadata_location VARCHAR(1000), previous_metadata_location VARCHAR(1000), iceberg_type VARCHAR(5), \
     PRIMARY KEY (catalog_name, table_namespace, table_name))",
    "CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (catalog_name VARCHAR(255) NOT NULL, \
     namespace VARCHAR(255) NOT NULL, property_key VARCHAR(255) NOT NULL, property_value VARCHAR(1000), \
     PRIMARY KEY (catalog_name, namespace, property_key))",
];

/// The catalog's database, with the catalog's name (`catalog_name` in both tables).
pub struct Pointers {
    catalog: String,
    database: Database,
    /// The SQLite file has the catalog's tables (made when missing, once): later statements
    /// need no write lock unless they write.
    made: std::sync::atomic::AtomicBool,
    /// Whether `iceberg_tables` has the `iceberg_type` column (the JDBC catalog's V1 tables,
    /// pyiceberg's and Sluice's; V0 catalogs, Trino's among them, lack it), found on first use.
    typed: tokio::sync::OnceCell<bool>,
}

enum Database {
    Sqlite(PathBuf),
    /// The session, opened on first use and again after it breaks.
    Postgres(Box<SqlCatalogDatabase>, Mutex<Option<tokio_postgres::Client>>),
}

/// A statement's parameters and what it returns: rows of text, or how many rows it changed.
enum Answer {
    Rows(Vec<Vec<Option<String>>>),
    Changed(u64),
}

impl Pointers {
    pub fn new(catalog: &str, database: &SqlCatalogDatabase) -> Self {
        let database = match &database.sqlite {
            Some(path) => Database::Sqlite(path.clone()),
            None => Database::Postgres(Box::new(database.clone()), Mutex::new(None)),
        };
        Self {
            catalog: catalog.to_string(),
            database,
            made: std::sync::atomic::AtomicBool::new(false),
            typed: tokio::sync::OnceCell::new(),
        }
    }

    /// Run `sql` (`$1`… for parameters, `$1` the catalog's name) with `params` after the name.
    async fn run(&self, sql: &str, params: &[&str], rows: bool) -> Result<Answer> {
        let mut all: Vec<&str> = vec![&self.catalog];
        all.extend_from_slice(params);
        match &self.database {
            Database::Sqlite(path) => {
                let (path, sql) = (path.clone(), sql.replace('$', "?"));
                let all: Vec<String> = all.iter().map(|s| s.to_string()).collect();
                let make = !self.made.load(std::sync::atomic::Ordering::Relaxed);
                let answer = tokio::task::spawn_blocking(move || sqlite(&path, &sql, &all, rows, make))
                    .await
                    .map_err(|e| Error::new(ErrorKind::Fatal, format!("Iceberg SQL catalog: {e}")))??;
                self.made.store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(answer)
            }
            Database::Postgres(config, session) => {
                let mut session = session.lock().await;
                if session.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
                    let client = connect(Endpoint {
                        host: &config.host,
                        port: config.port,
                        database: &config.database,
                        user: &config.user,
                        password: config.password.as_ref().map(sluice_core::Secret::expose).unwrap_or_default(),
                        sslmode: config.sslmode,
                        sslrootcert: None,
                    })
                    .await?;
                    for create in TABLES {
                        // Two writers creating the tables at once: one of them loses, harmlessly.
                        if let Err(e) = client.batch_execute(create).await {
                            tracing::debug!(error = %cause(&e), "Iceberg SQL catalog: creating its tables");
                        }
                    }
                    *session = Some(client);
                }
                let client = session.as_ref().expect("connected above");
                let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    all.iter().map(|s| s as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
                let failed = |e: tokio_postgres::Error| {
                    let kind = if e.as_db_error().is_some() { ErrorKind::Fatal } else { ErrorKind::Connect };
                    Error::new(kind, format!("Iceberg SQL catalog: {}", cause(&e)))
                };
                if rows {
                    let found = client.query(sql, &params).await.map_err(failed)?;
                    let rows = found.iter().map(|r| (0..r.len()).map(|i| r.get::<_, Option<String>>(i)).collect());
                    Ok(Answer::Rows(rows.collect()))
                } else {
                    Ok(Answer::Changed(client.execute(sql, &params).await.map_err(failed)?))
                }
            }
        }
    }

    async fn rows(&self, sql: &str, params: &[&str]) -> Result<Vec<Vec<Option<String>>>> {
        match self.run(sql, params, true).await? {
            Answer::Rows(rows) => Ok(rows),
            Answer::Changed(_) => Ok(Vec::new()),
        }
    }

    async fn change(&self, sql: &str, params: &[&str]) -> Result<u64> {
        match self.run(sql, params, false).await? {
            Answer::Changed(n) => Ok(n),
            Answer::Rows(_) => Ok(0),
        }
    }

    /// Whether rows say what they are (`iceberg_type`: a table or a view).
    async fn typed(&self) -> Result<bool> {
        let sql = match self.database {
            Database::Sqlite(_) => {
                "SELECT CAST(count(*) AS TEXT) FROM pragma_table_info('iceberg_tables') \
                 WHERE name = 'iceberg_type' AND $1 IS NOT NULL"
            }
            Database::Postgres(..) => {
                "SELECT CAST(count(*) AS TEXT) FROM information_schema.columns WHERE table_name = 'iceberg_tables' \
                 AND column_name = 'iceberg_type' AND table_schema = ANY (current_schemas(false)) AND $1::text IS NOT NULL"
            }
        };
        let typed = self
            .typed
            .get_or_try_init(|| async {
                let found = self.rows(sql, &[]).await?;
                Ok::<_, Error>(found.first().and_then(|r| r[0].as_deref()) != Some("0"))
            })
            .await?;
        Ok(*typed)
    }

    /// ` AND <tables, not views>` when rows say which they are.
    async fn tables_only(&self) -> Result<&'static str> {
        Ok(if self.typed().await? { " AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)" } else { "" })
    }

    /// Whether the namespace has properties or tables.
    pub async fn namespace_exists(&self, namespace: &str) -> Result<bool> {
        let found = self
            .rows(
                "SELECT namespace FROM iceberg_namespace_properties WHERE catalog_name = $1 AND namespace = $2 \
                 UNION SELECT table_namespace FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2",
                &[namespace],
            )
            .await?;
        Ok(!found.is_empty())
    }

    /// Every namespace of the catalog.
    pub async fn namespaces(&self) -> Result<Vec<String>> {
        let found = self
            .rows(
                "SELECT namespace FROM iceberg_namespace_properties WHERE catalog_name = $1 \
                 UNION SELECT table_namespace FROM iceberg_tables WHERE catalog_name = $1",
                &[],
            )
            .await?;
        Ok(found.into_iter().filter_map(|mut r| r.pop().flatten()).collect())
    }

    /// A namespace's properties.
    pub async fn namespace_properties(&self, namespace: &str) -> Result<Vec<(String, String)>> {
        let found = self
            .rows(
                "SELECT property_key, property_value FROM iceberg_namespace_properties \
                 WHERE catalog_name = $1 AND namespace = $2",
                &[namespace],
            )
            .await?;
        Ok(found.into_iter().map(|r| (r[0].clone().unwrap_or_default(), r[1].clone().unwrap_or_default())).collect())
    }

    /// Make the namespace (its `exists` property, as the JDBC catalog writes it, and `properties`);
    /// false when it was there already.
    pub async fn create_namespace(&self, namespace: &str, properties: &[(String, String)]) -> Result<bool> {
        if self.namespace_exists(namespace).await? {
            return Ok(false);
        }
        let mut all = vec![("exists".to_string(), "true".to_string())];
        all.extend(properties.iter().filter(|(k, _)| k != "exists").cloned());
        for (key, value) in all {
            self.change(
                "INSERT INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                &[namespace, &key, &value],
            )
            .await?;
        }
        Ok(true)
    }

    /// The tables of a namespace.
    pub async fn tables(&self, namespace: &str) -> Result<Vec<String>> {
        let sql = format!(
            "SELECT table_name FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2{} \
             ORDER BY table_name",
            self.tables_only().await?
        );
        let found = self.rows(&sql, &[namespace]).await?;
        Ok(found.into_iter().filter_map(|mut r| r.pop().flatten()).collect())
    }

    /// Where the table's current metadata file is; `None` when there is no such table.
    pub async fn location(&self, namespace: &str, table: &str) -> Result<Option<String>> {
        let sql = format!(
            "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2 \
             AND table_name = $3{}",
            self.tables_only().await?
        );
        let found = self.rows(&sql, &[namespace, table]).await?;
        Ok(found.into_iter().next().and_then(|mut r| r.pop().flatten()))
    }

    /// Record a new table; false when one of that name exists.
    pub async fn create(&self, namespace: &str, table: &str, location: &str) -> Result<bool> {
        let (column, value) = if self.typed().await? { (", iceberg_type", ", 'TABLE'") } else { ("", "") };
        let sql = format!(
            "INSERT INTO iceberg_tables (catalog_name, table_namespace, table_name, metadata_location, \
             previous_metadata_location{column}) VALUES ($1, $2, $3, $4, NULL{value}) ON CONFLICT DO NOTHING"
        );
        let changed = self.change(&sql, &[namespace, table, location]).await?;
        Ok(changed == 1)
    }

    /// Point the table at `new` if it still points at `old` (the commit); false when another
    /// writer moved it first.
    pub async fn swap(&self, namespace: &str, table: &str, old: &str, new: &str) -> Result<bool> {
        let changed = self
            .change(
                "UPDATE iceberg_tables SET metadata_location = $5, previous_metadata_location = $4 \
                 WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3 AND metadata_location = $4",
                &[namespace, table, old, new],
            )
            .await?;
        Ok(changed == 1)
    }

    /// Forget the table (its files stay); false when there was none.
    pub async fn drop(&self, namespace: &str, table: &str) -> Result<bool> {
        let sql = format!(
            "DELETE FROM iceberg_tables WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3{}",
            self.tables_only().await?
        );
        let changed = self.change(&sql, &[namespace, table]).await?;
        Ok(changed == 1)
    }
}

/// One statement on the SQLite file (made, with the catalog's tables, when missing and `make`).
fn sqlite(path: &PathBuf, sql: &str, params: &[String], rows: bool, make: bool) -> Result<Answer> {
    let failed = |e: rusqlite::Error| {
        let busy = matches!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        );
        let kind = if busy { ErrorKind::Transient } else { ErrorKind::Fatal };
        Error::new(kind, format!("Iceberg SQL catalog {}: {e}", path.display()))
    };
    let conn = rusqlite::Connection::open(path).map_err(failed)?;
    conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(failed)?;
    for create in TABLES.iter().filter(|_| make) {
        conn.execute_batch(create).map_err(failed)?;
    }
    let mut statement = conn.prepare(sql).map_err(failed)?;
    let params = rusqlite::params_from_iter(params.iter());
    if !rows {
        return statement.execute(params).map(|n| Answer::Changed(n as u64)).map_err(failed);
    }
    let columns = statement.column_count();
    let found = statement
        .query_map(params, |row| {
            (0..columns).map(|i| row.get::<_, Option<String>>(i)).collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(failed)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(failed)?;
    Ok(Answer::Rows(found))
}
