//! The REST catalog's own routes, for what DuckDB's extension does not do (a compaction's
//! `replace` snapshot, expiring snapshots): the prefix from `/v1/config`, a token as the
//! extension gets one, a table's metadata, and a commit with its requirements.

use serde_json::{Value, json};
use sluice_core::{Error, ErrorKind, Result};

use super::IcebergConfig;

/// A logged-in client of one table's catalog.
pub struct Catalog {
    http: reqwest::Client,
    /// `{endpoint}/v1/{prefix}/namespaces/{namespace}/tables/{table}`.
    table_url: reqwest::Url,
    token: Option<String>,
    namespace: Vec<String>,
    table: String,
}

/// A table's metadata as the catalog serves it.
pub struct Loaded {
    /// Where the metadata JSON is (what DuckDB's `iceberg_scan` reads).
    pub location: String,
    /// The table metadata.
    pub metadata: Value,
}

impl Catalog {
    /// Log in as `config` says (a token, OAuth2 client credentials, or none) and find `table`.
    pub async fn connect(config: &IcebergConfig, table: &str) -> Result<Self> {
        let config = &config.rest()?;
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| Error::new(ErrorKind::Fatal, format!("Iceberg catalog: {e}")))?;
        let base = config.endpoint.trim_end_matches('/');
        let token = match (&config.token, &config.client_id, &config.client_secret) {
            (Some(token), _, _) => Some(token.expose().to_string()),
            (None, Some(id), Some(secret)) => {
                let uri = config.oauth2_server_uri.clone().unwrap_or_else(|| format!("{base}/v1/oauth/tokens"));
                let form = [
                    ("grant_type", "client_credentials"),
                    ("client_id", id.as_str()),
                    ("client_secret", secret.expose()),
                    ("scope", "PRINCIPAL_ROLE:ALL"),
                ];
                let body = answer(http.post(&uri).form(&form).send().await, "logging in").await?;
                let token = body["access_token"].as_str().ok_or_else(|| {
                    Error::new(ErrorKind::Config, "Iceberg catalog: the OAuth2 answer has no access_token")
                })?;
                Some(token.to_string())
            }
            _ => None,
        };
        let mut request = http.get(format!("{base}/v1/config"));
        if !config.warehouse.is_empty() {
            request = request.query(&[("warehouse", &config.warehouse)]);
        }
        let settings = answer(with_token(request, token.as_deref()).send().await, "reading /v1/config").await?;
        let prefix = settings["overrides"]["prefix"].as_str().or_else(|| settings["defaults"]["prefix"].as_str());
        let namespace: Vec<String> = config.namespace.split('.').map(str::to_string).collect();
        let mut table_url =
            reqwest::Url::parse(&format!("{base}/v1/")).map_err(|e| Error::config("destination.endpoint", e))?;
        {
            let mut path =
                table_url.path_segments_mut().map_err(|()| Error::config("destination.endpoint", "not a base URL"))?;
            path.pop_if_empty();
            if let Some(prefix) = prefix.filter(|p| !p.is_empty()) {
                path.extend(prefix.split('/'));
            }
            path.extend(["namespaces", &namespace.join("\u{1f}"), "tables", table]);
        }
        Ok(Self { http, table_url, token, namespace, table: table.to_string() })
    }

    /// The table's metadata now; `None` when the catalog has no such table (yet).
    pub async fn load(&self) -> Result<Option<Loaded>> {
        let request = with_token(self.http.get(self.table_url.clone()), self.token.as_deref());
        let response = request.send().await;
        if response.as_ref().is_ok_and(|r| r.status() == reqwest::StatusCode::NOT_FOUND) {
            return Ok(None);
        }
        let body = answer(response, "loading the table").await?;
        let location = body["metadata-location"].as_str().unwrap_or_default().to_string();
        Ok(Some(Loaded { location, metadata: body["metadata"].clone() }))
    }

    /// Commit `updates` to the table if `requirements` still hold; a table that changed
    /// meanwhile is a [`ErrorKind::Transient`] error.
    pub async fn commit(&self, requirements: Vec<Value>, updates: Vec<Value>) -> Result<Value> {
        let body = json!({
            "identifier": {"namespace": self.namespace, "name": self.table},
            "requirements": requirements,
            "updates": updates,
        });
        let request = with_token(self.http.post(self.table_url.clone()), self.token.as_deref()).json(&body);
        answer(request.send().await, "committing").await
    }
}

fn with_token(request: reqwest::RequestBuilder, token: Option<&str>) -> reqwest::RequestBuilder {
    match token {
        Some(token) => request.bearer_auth(token),
        None => request,
    }
}

/// The JSON of a 2xx answer; otherwise an error whose kind says whether to retry.
async fn answer(response: reqwest::Result<reqwest::Response>, what: &str) -> Result<Value> {
    let response = response.map_err(|e| Error::new(ErrorKind::Connect, format!("Iceberg catalog: {what}: {e}")))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if status.is_success() {
        return serde_json::from_str(&text).or_else(|_| Ok(Value::Null));
    }
    let kind = match status.as_u16() {
        401 | 403 => ErrorKind::Config,
        409 | 429 | 500..=599 => ErrorKind::Transient,
        _ => ErrorKind::Fatal,
    };
    let message: String = text.chars().take(500).collect();
    Err(Error::new(kind, format!("Iceberg catalog: {what}: HTTP {status}: {message}")))
}
