//! The REST catalog Sluice serves in front of a SQL catalog, for DuckDB's extension (and the
//! compaction's client): the routes of the Iceberg REST specification that a writer uses
//! (config, namespaces, tables: list, create, load, commit, drop), on 127.0.0.1 only, behind a
//! random bearer token. One front per catalog in a process, on a thread of its own; commits
//! through one front take turns, and writers in other processes are kept apart by the
//! compare-and-set on `metadata_location`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use sluice_core::{Error, ErrorKind, Result};

use super::IcebergSqlCatalog;
use super::metadata::{self, Refusal};
use super::pointers::Pointers;
use crate::files::S3Config;
use crate::iceberg::store::Store;

/// A running front: where DuckDB finds it, and the token it asks for.
#[derive(Clone)]
pub struct Front {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The bearer token.
    pub token: String,
}

/// The fronts started in this process, by what they serve.
static FRONTS: LazyLock<Mutex<HashMap<String, Front>>> = LazyLock::new(Mutex::default);

/// The tokens of the fronts started in this process, for redacting messages.
pub fn tokens() -> Vec<String> {
    let fronts = FRONTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    fronts.values().map(|f| f.token.clone()).collect()
}

/// The front of the catalog `config` names (the database, the location, the catalog's name and
/// the S3 account of its files), started on first use.
pub fn serve(config: &IcebergSqlCatalog, warehouse: &str, s3: Option<&S3Config>) -> Result<Front> {
    let password = config.database.password.as_ref().map(sluice_core::Secret::expose).unwrap_or_default();
    let s3_secret = s3.and_then(|s| s.secret_access_key.as_ref()).map(sluice_core::Secret::expose).unwrap_or_default();
    let key = format!("{}|{password}|{warehouse}|{}|{s3_secret}", json!(config), json!(s3));
    let mut fronts = FRONTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(front) = fronts.get(&key) {
        return Ok(front.clone());
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| Error::new(ErrorKind::Fatal, format!("Iceberg SQL catalog: no local port: {e}")))?;
    let port = listener.local_addr().map_err(|e| Error::new(ErrorKind::Fatal, e.to_string()))?.port();
    let front =
        Front { endpoint: format!("http://127.0.0.1:{port}"), token: format!("{:032x}", rand::random::<u128>()) };
    let state = Arc::new(Catalog {
        pointers: Pointers::new(warehouse, &config.database),
        root: config.location.trim_end_matches('/').to_string(),
        prefix: warehouse.to_string(),
        token: front.token.clone(),
        s3: s3.cloned(),
        stores: Mutex::default(),
        commits: tokio::sync::Mutex::new(()),
    });
    let described = config.describe();
    std::thread::Builder::new()
        .name("iceberg-sql-catalog".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => return tracing::error!(error = %e, "Iceberg SQL catalog: no runtime"),
            };
            runtime.block_on(async move {
                let served = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => axum::serve(listener, routes(state)).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = served {
                    tracing::error!(error = %e, catalog = %described, "Iceberg SQL catalog: the front stopped");
                }
            });
        })
        .map_err(|e| Error::new(ErrorKind::Fatal, format!("Iceberg SQL catalog: {e}")))?;
    tracing::info!(catalog = %config.describe(), endpoint = %front.endpoint, "Iceberg SQL catalog: REST front started.");
    fronts.insert(key, front.clone());
    Ok(front)
}

struct Catalog {
    pointers: Pointers,
    /// Where new tables go.
    root: String,
    /// The REST prefix: the catalog's name.
    prefix: String,
    token: String,
    s3: Option<S3Config>,
    /// The S3 stores in use, by bucket: one client each, kept.
    stores: Mutex<HashMap<String, Store>>,
    /// Commits and creates through this front, one at a time.
    commits: tokio::sync::Mutex<()>,
}

type Shared = State<Arc<Catalog>>;

fn routes(state: Arc<Catalog>) -> Router {
    Router::new()
        .route("/v1/config", get(config))
        .route("/v1/{prefix}/namespaces", get(namespaces).post(create_namespace))
        .route("/v1/{prefix}/namespaces/{namespace}", get(namespace))
        .route("/v1/{prefix}/namespaces/{namespace}/tables", get(tables).post(create_table))
        .route("/v1/{prefix}/namespaces/{namespace}/tables/{table}", get(load).post(commit).delete(drop_table))
        .fallback(|| async {
            refuse(Refusal { status: 404, kind: "NotFoundException", message: "no such route".into() })
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

async fn authorize(State(catalog): Shared, request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use sha2::Digest;
    let given =
        request.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    // Digests compared, so the time taken says nothing about the token.
    if given.map(|g| sha2::Sha256::digest(g.as_bytes())) != Some(sha2::Sha256::digest(catalog.token.as_bytes())) {
        return refuse(Refusal {
            status: 401,
            kind: "NotAuthorizedException",
            message: "a bearer token is needed".into(),
        });
    }
    next.run(request).await
}

fn refuse(refusal: Refusal) -> Response {
    let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::BAD_REQUEST);
    let body = json!({"error": {"message": refusal.message, "type": refusal.kind, "code": refusal.status}});
    (status, Json(body)).into_response()
}

/// A Sluice error as the REST error model: the database or the files out of reach are a 503.
fn failed(e: Error) -> Response {
    tracing::warn!(error = %e, "Iceberg SQL catalog: a request failed");
    let status = if matches!(e.kind(), ErrorKind::Connect | ErrorKind::Transient) { 503 } else { 500 };
    refuse(Refusal { status, kind: "ServiceFailureException", message: e.message().to_string() })
}

fn missing(what: &str) -> Response {
    let kind = if what.starts_with("namespace") { "NoSuchNamespaceException" } else { "NoSuchTableException" };
    refuse(Refusal { status: 404, kind, message: format!("{what} does not exist") })
}

/// `a\u{1f}b` (the REST path's levels) as `a.b` (the SQL catalog's).
fn dotted(namespace: &str) -> String {
    namespace.split('\u{1f}').collect::<Vec<_>>().join(".")
}

fn levels(namespace: &str) -> Vec<&str> {
    namespace.split('.').collect()
}

fn wrong_prefix(catalog: &Catalog, prefix: &str) -> Option<Response> {
    (prefix != catalog.prefix).then(|| missing(&format!("namespace of warehouse '{prefix}'")))
}

async fn config(State(catalog): Shared) -> Response {
    Json(json!({"defaults": {}, "overrides": {"prefix": catalog.prefix}})).into_response()
}

async fn namespaces(
    State(catalog): Shared,
    Path(prefix): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(wrong) = wrong_prefix(&catalog, &prefix) {
        return wrong;
    }
    let parent = q.get("parent").map(|p| dotted(p));
    match catalog.pointers.namespaces().await {
        Ok(all) => {
            let mut shown: Vec<Vec<&str>> = all
                .iter()
                .filter(|n| match &parent {
                    Some(p) => {
                        n.strip_prefix(p.as_str()).and_then(|r| r.strip_prefix('.')).is_some_and(|r| !r.contains('.'))
                    }
                    None => !n.contains('.'),
                })
                .map(|n| levels(n))
                .collect();
            shown.sort();
            Json(json!({"namespaces": shown})).into_response()
        }
        Err(e) => failed(e),
    }
}

async fn create_namespace(State(catalog): Shared, Path(prefix): Path<String>, Json(body): Json<Value>) -> Response {
    if let Some(wrong) = wrong_prefix(&catalog, &prefix) {
        return wrong;
    }
    let names: Vec<&str> = body["namespace"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if names.is_empty() || names.iter().any(|n| n.is_empty() || n.contains('.')) {
        return refuse(Refusal::bad("namespace: a list of names without dots"));
    }
    let properties: Vec<(String, String)> = body["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_string)))
        .collect();
    let _turn = catalog.commits.lock().await;
    match catalog.pointers.create_namespace(&names.join("."), &properties).await {
        Ok(true) => Json(json!({"namespace": names, "properties": body["properties"].clone()})).into_response(),
        Ok(false) => {
            refuse(Refusal { status: 409, kind: "AlreadyExistsException", message: "the namespace exists".into() })
        }
        Err(e) => failed(e),
    }
}

async fn namespace(State(catalog): Shared, Path((prefix, namespace)): Path<(String, String)>) -> Response {
    if let Some(wrong) = wrong_prefix(&catalog, &prefix) {
        return wrong;
    }
    let namespace = dotted(&namespace);
    match catalog.pointers.namespace_exists(&namespace).await {
        Ok(false) => missing(&format!("namespace {namespace}")),
        Ok(true) => match catalog.pointers.namespace_properties(&namespace).await {
            Ok(properties) => {
                let properties: serde_json::Map<String, Value> =
                    properties.into_iter().map(|(k, v)| (k, json!(v))).collect();
                Json(json!({"namespace": levels(&namespace), "properties": properties})).into_response()
            }
            Err(e) => failed(e),
        },
        Err(e) => failed(e),
    }
}

async fn tables(State(catalog): Shared, Path((prefix, namespace)): Path<(String, String)>) -> Response {
    if let Some(wrong) = wrong_prefix(&catalog, &prefix) {
        return wrong;
    }
    let namespace = dotted(&namespace);
    match catalog.pointers.namespace_exists(&namespace).await {
        Ok(false) => return missing(&format!("namespace {namespace}")),
        Err(e) => return failed(e),
        Ok(true) => {}
    }
    match catalog.pointers.tables(&namespace).await {
        Ok(names) => {
            let identifiers: Vec<Value> =
                names.iter().map(|t| json!({"namespace": levels(&namespace), "name": t})).collect();
            Json(json!({"identifiers": identifiers})).into_response()
        }
        Err(e) => failed(e),
    }
}

impl Catalog {
    fn store(&self, location: &str) -> Result<Store> {
        // Only S3 clients are kept; any other location is checked (and refused) each time.
        let Some(rest) = location.strip_prefix("s3://") else { return Store::for_files(location, self.s3.as_ref()) };
        let bucket = rest.split('/').next().unwrap_or_default();
        let mut stores = self.stores.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(store) = stores.get(bucket) {
            return Ok(store.clone());
        }
        let store = Store::for_files(location, self.s3.as_ref())?;
        stores.insert(bucket.to_string(), store.clone());
        Ok(store)
    }

    /// The table's metadata file and its content; `None` when there is no such table.
    async fn current(&self, namespace: &str, table: &str) -> Result<Option<(String, Value)>> {
        let Some(location) = self.pointers.location(namespace, table).await? else { return Ok(None) };
        let bytes = self.store(&location)?.get(&location).await?.ok_or_else(|| {
            Error::new(ErrorKind::Fatal, format!("Iceberg SQL catalog: {location} (the table's metadata) is missing"))
        })?;
        let metadata = serde_json::from_slice(&bytes)
            .map_err(|e| Error::new(ErrorKind::Fatal, format!("Iceberg SQL catalog: {location}: {e}")))?;
        Ok(Some((location, metadata)))
    }

    /// Write a metadata file of version `version` under the table's location.
    async fn write(&self, metadata: &Value, version: u64) -> Result<String> {
        let table = metadata["location"].as_str().unwrap_or_default();
        let path = format!("{table}/metadata/{version:05}-{}.metadata.json", uuid());
        let bytes = serde_json::to_vec(metadata).map_err(|e| Error::new(ErrorKind::Fatal, e.to_string()))?;
        self.store(&path)?.put(&path, bytes).await?;
        Ok(path)
    }
}

fn loaded(location: &str, metadata: Value) -> Response {
    Json(json!({"metadata-location": location, "metadata": metadata, "config": {}})).into_response()
}

async fn create_table(
    State(catalog): Shared,
    Path((prefix, namespace)): Path<(String, String)>,
    Json(request): Json<Value>,
) -> Response {
    if let Some(wrong) = wrong_prefix(&catalog, &prefix) {
        return wrong;
    }
    let namespace = dotted(&namespace);
    let Some(name) = request["name"].as_str().filter(|n| !n.is_empty()) else {
        return refuse(Refusal::bad("the request has no table name"));
    };
    if request["stage-create"].as_bool() == Some(true) {
        return refuse(Refusal::bad("staged creates are not supported: attach with STAGE_CREATE_TABLES false"));
    }
    let _turn = catalog.commits.lock().await;
    match catalog.pointers.namespace_exists(&namespace).await {
        Ok(false) => return missing(&format!("namespace {namespace}")),
        Err(e) => return failed(e),
        Ok(true) => {}
    }
    match catalog.pointers.location(&namespace, name).await {
        Ok(Some(_)) => {
            return refuse(Refusal {
                status: 409,
                kind: "AlreadyExistsException",
                message: format!("table {name} exists"),
            });
        }
        Err(e) => return failed(e),
        Ok(None) => {}
    }
    let location = match request["location"].as_str() {
        Some(l) if !l.is_empty() => l.trim_end_matches('/').to_string(),
        _ => format!("{}/{}/{name}", catalog.root, namespace.replace('.', "/")),
    };
    let now = chrono::Utc::now().timestamp_millis();
    let metadata = match metadata::new_table(&request, &location, &uuid(), now) {
        Ok(m) => m,
        Err(refusal) => return refuse(refusal),
    };
    let path = match catalog.write(&metadata, 0).await {
        Ok(path) => path,
        Err(e) => return failed(e),
    };
    match catalog.pointers.create(&namespace, name, &path).await {
        Ok(true) => loaded(&path, metadata),
        Ok(false) => {
            // Another writer made the table first: this metadata file is nobody's.
            if let Ok(store) = catalog.store(&path) {
                let _ = store.delete(&path).await;
            }
            refuse(Refusal { status: 409, kind: "AlreadyExistsException", message: format!("table {name} exists") })
        }
        Err(e) => failed(e),
    }
}

async fn load(State(catalog): Shared, Path((prefix, namespace, table)): Path<(String, String, String)>) -> Response {
    if let Some(wrong) = wrong_prefix(&catalog, &prefix) {
        return wrong;
    }
    match catalog.current(&dotted(&namespace), &table).await {
        Ok(Some((location, metadata))) => loaded(&location, metadata),
        Ok(None) => missing(&format!("table {table}")),
        Err(e) => failed(e),
    }
}

async fn commit(
    State(catalog): Shared,
    Path((prefix, namespace, table)): Path<(String, String, String)>,
    Json(request): Json<Value>,
) -> Response {
    if let Some(wrong) = wrong_prefix(&catalog, &prefix) {
        return wrong;
    }
    let namespace = dotted(&namespace);
    let _turn = catalog.commits.lock().await;
    let (old, mut metadata) = match catalog.current(&namespace, &table).await {
        Ok(Some(current)) => current,
        Ok(None) => return missing(&format!("table {table}")),
        Err(e) => return failed(e),
    };
    tracing::debug!(table = %table, request = %request, "Iceberg SQL catalog: commit");
    let requirements = request["requirements"].as_array().cloned().unwrap_or_default();
    let updates = request["updates"].as_array().cloned().unwrap_or_default();
    let now = chrono::Utc::now().timestamp_millis();
    if let Err(refusal) =
        metadata::check(&metadata, &requirements).and_then(|()| metadata::apply(&mut metadata, &updates, &old, now))
    {
        return refuse(refusal);
    }
    let path = match catalog.write(&metadata, version(&old) + 1).await {
        Ok(path) => path,
        Err(e) => return failed(e),
    };
    let swapped = match catalog.pointers.swap(&namespace, &table, &old, &path).await {
        // A test's fault point, counting only commits of rows (not of tables or properties).
        Ok(true)
            if updates.iter().any(|u| u["action"] == "add-snapshot")
                && sluice_core::crash::lose("iceberg-sql.swap") =>
        {
            Err(Error::new(ErrorKind::Connect, "the database's answer to the swap was lost (SLUICE_LOSE_AT)"))
        }
        swapped => swapped,
    };
    // A failed swap may have committed (the database's answer lost): the pointer says.
    let swapped = match swapped {
        Err(e) => match reread(&catalog, &namespace, &table).await {
            Some(now) if now == path => Ok(true),
            _ => Err(e),
        },
        swapped => swapped,
    };
    match swapped {
        Ok(true) => Json(json!({"metadata-location": path, "metadata": metadata})).into_response(),
        Ok(false) => {
            if let Ok(store) = catalog.store(&path) {
                let _ = store.delete(&path).await;
            }
            refuse(Refusal::conflict("another writer committed to the table first"))
        }
        // The swap was sent and its outcome is not known (the pointer could not be read, or
        // still names the old file while the swap may be under way): the REST spec's answer
        // for that is a 5xx other than 503 (`CommitStateUnknownException`), on which a client
        // must not remove the commit's files; the new metadata file stays.
        Err(e) => {
            tracing::warn!(error = %e, "Iceberg SQL catalog: whether a commit landed is not known");
            refuse(Refusal {
                status: 500,
                kind: "CommitStateUnknownException",
                message: format!("whether the commit landed is not known: {}", e.message()),
            })
        }
    }
}

/// The table's metadata location, read again after a swap whose answer failed, trying for a
/// few seconds; `None`: it could not be read.
async fn reread(catalog: &Catalog, namespace: &str, table: &str) -> Option<String> {
    for wait in [0u64, 200, 1000, 3000] {
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        if let Ok(location) = catalog.pointers.location(namespace, table).await {
            return location;
        }
    }
    None
}

async fn drop_table(
    State(catalog): Shared,
    Path((prefix, namespace, table)): Path<(String, String, String)>,
) -> Response {
    if let Some(wrong) = wrong_prefix(&catalog, &prefix) {
        return wrong;
    }
    let _turn = catalog.commits.lock().await;
    match catalog.pointers.drop(&dotted(&namespace), &table).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => missing(&format!("table {table}")),
        Err(e) => failed(e),
    }
}

/// The version of a metadata file named `<version>-<uuid>.metadata.json`; 0 for other names.
fn version(location: &str) -> u64 {
    let name = location.rsplit('/').next().unwrap_or_default();
    name.split('-').next().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A random (version 4) UUID.
fn uuid() -> String {
    let mut bytes = rand::random::<[u8; 16]>();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_versions_and_uuids() {
        assert_eq!(version("file:///w/t/metadata/00012-ab-cd.metadata.json"), 12);
        assert_eq!(version("s3://b/w/t/metadata/v3.metadata.json"), 0);
        let id = uuid();
        assert_eq!((id.len(), &id[14..15]), (36, "4"));
        assert_eq!(dotted("a\u{1f}b"), "a.b");
    }

    /// The front over a real SQLite file: no token, no answer; a table made, committed to, and
    /// a commit that read an older snapshot refused with 409, the table unchanged; another
    /// writer that moved the catalog row meanwhile makes the commit a 409 too.
    #[tokio::test]
    async fn commits_are_compare_and_set_and_the_token_is_required() {
        let dir = std::env::temp_dir().join(format!("sluice-sqlcat-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let config: IcebergSqlCatalog = serde_json::from_value(json!({"sqlite": dir.join("c.db"),
            "location": format!("file://{}/w", dir.display())}))
        .unwrap();
        let front = serve(&config, "lake", None).unwrap();
        let http = reqwest::Client::new();
        let url = |path: &str| format!("{}/v1{path}", front.endpoint);
        assert_eq!(http.get(url("/config")).send().await.unwrap().status(), 401);
        let send = |request: reqwest::RequestBuilder| {
            let token = front.token.clone();
            async move {
                let r = request.bearer_auth(token).send().await.unwrap();
                (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
            }
        };
        assert_eq!(send(http.get(url("/config"))).await.1["overrides"]["prefix"], "lake");
        let ns = json!({"namespace": ["bronze"]});
        assert_eq!(send(http.post(url("/lake/namespaces")).json(&ns)).await.0, 200);
        assert_eq!(send(http.post(url("/lake/namespaces")).json(&ns)).await.0, 409);
        let schema = json!({"type": "struct", "fields": [{"id": 1, "name": "id", "required": false, "type": "long"}]});
        let (status, made) =
            send(http.post(url("/lake/namespaces/bronze/tables")).json(&json!({"name": "t", "schema": schema}))).await;
        assert_eq!(status, 200, "{made}");
        let table = url("/lake/namespaces/bronze/tables/t");
        let snapshot = |id: i64, sequence: i64| {
            json!({"action": "add-snapshot", "snapshot": {"snapshot-id": id, "sequence-number": sequence,
                "timestamp-ms": 1, "manifest-list": "file:///x.avro", "summary": {"operation": "append"}}})
        };
        let main =
            |id: i64| json!({"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": id});
        let at = |id: Value| json!({"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": id});
        let first = json!({"requirements": [at(Value::Null)], "updates": [snapshot(1, 1), main(1)]});
        let (status, committed) = send(http.post(&table).json(&first)).await;
        assert_eq!((status, committed["metadata"]["current-snapshot-id"].clone()), (200, json!(1)), "{committed}");
        // The same commit again: it read a table without snapshots, and there is one now.
        assert_eq!(send(http.post(&table).json(&first)).await.0, 409);
        // Another writer of the catalog moves the row between this front's read and its swap.
        let pointers = Pointers::new("lake", &config.database);
        let now = pointers.location("bronze", "t").await.unwrap().unwrap();
        assert!(pointers.swap("bronze", "t", &now, &now.replace("00001", "00009")).await.unwrap());
        assert!(!pointers.swap("bronze", "t", &now, "elsewhere").await.unwrap(), "a stale swap must fail");
        assert_eq!(send(http.get(&table)).await.0, 500, "the row points at a file that is not there");
        assert!(pointers.swap("bronze", "t", &now.replace("00001", "00009"), &now).await.unwrap());
        let (status, loaded) = send(http.get(&table)).await;
        assert_eq!((status, loaded["metadata-location"].as_str()), (200, Some(now.as_str())));
        let second = json!({"requirements": [at(json!(1))], "updates": [snapshot(2, 2), main(2)]});
        assert_eq!(send(http.post(&table).json(&second)).await.0, 200);
        let listed = send(http.get(url("/lake/namespaces/bronze/tables"))).await.1;
        assert_eq!(listed["identifiers"], json!([{"namespace": ["bronze"], "name": "t"}]));
        assert_eq!(send(http.get(url("/other/namespaces/bronze/tables/t"))).await.0, 404);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
