//! JSON posted in batches to an HTTP API.
//!
//! Each batch is a JSON array of row objects. Every request carries an `Idempotency-Key` derived
//! from the sync, the run and the batch number, so an API that honours it can drop a batch it
//! already applied. 429 and 5xx answers (and lost connections) are retried with exponential
//! backoff, waiting at least what `Retry-After` asks. Headers are secrets: stored encrypted and
//! never shown back.

use std::collections::BTreeMap;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize, Serializer};
use sha2::{Digest, Sha256};
use sluice_core::secret::REDACTED;
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Secret};

/// The HTTP method for rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    /// POST.
    #[default]
    Post,
    /// PUT.
    Put,
    /// PATCH.
    Patch,
    /// DELETE (for deletes).
    Delete,
}

impl HttpMethod {
    fn as_reqwest(self) -> reqwest::Method {
        match self {
            Self::Post => reqwest::Method::POST,
            Self::Put => reqwest::Method::PUT,
            Self::Patch => reqwest::Method::PATCH,
            Self::Delete => reqwest::Method::DELETE,
        }
    }
}

/// How mirror sends the keys that disappeared: a JSON array of key objects, each with
/// `flag: true`, sent with `method` to `url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteForm {
    /// Where deletes go; the rows' URL by default. A password in it is a secret, as in `url`.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "redacted_opt")]
    pub url: Option<String>,
    /// The method for deletes.
    #[serde(default)]
    pub method: HttpMethod,
    /// The field set to `true` in each deleted key's object.
    #[serde(default = "default_flag")]
    pub flag: String,
}

impl Default for DeleteForm {
    fn default() -> Self {
        Self { url: None, method: HttpMethod::Post, flag: default_flag() }
    }
}

fn default_flag() -> String {
    "_deleted".into()
}

/// An HTTP API destination.
#[derive(Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpApiConfig {
    /// Where rows are sent. A password in it (`https://user:pw@host/…`) is a secret: serialized
    /// as `***`, kept apart like the headers, and left out of logs and errors.
    #[serde(serialize_with = "redacted")]
    pub url: String,
    /// The method for rows.
    #[serde(default)]
    pub method: HttpMethod,
    /// Extra headers (an `Authorization` token, say); encrypted at rest, never shown back.
    #[serde(default, skip_serializing)]
    pub headers: BTreeMap<String, Secret>,
    /// Rows per request.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Retries of one batch after a 429, a 5xx or a lost connection.
    #[serde(default = "default_retries")]
    pub max_retries: u32,
    /// The first backoff; it doubles on each retry (at most 30 s).
    #[serde(default = "default_backoff")]
    pub backoff_ms: u64,
    /// Timeout of one request.
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
    /// How deletes are sent (mirror).
    #[serde(default)]
    pub deletes: DeleteForm,
}

/// Printed as serialized: without secrets.
impl std::fmt::Debug for HttpApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HttpApiConfig({})", serde_json::to_string(self).unwrap_or_default())
    }
}

/// `url` with its password (if any) shown as `***`, for the API, the stored config and logs.
/// The rest of the URL is kept as written.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => match u.password() {
            Some(p) if url.contains(&format!(":{p}@")) => url.replacen(&format!(":{p}@"), &format!(":{REDACTED}@"), 1),
            Some(_) => {
                let _ = u.set_password(Some(REDACTED));
                u.to_string()
            }
            None => url.to_string(),
        },
        // Not a URL (validation says so): whatever sits between `//` and `@` may be credentials.
        Err(_) => match (url.find("://"), url.rfind('@')) {
            (Some(start), Some(at)) if at > start => format!("{}{REDACTED}{}", &url[..start + 3], &url[at..]),
            _ => url.to_string(),
        },
    }
}

/// The password of `url`, as written in it (percent-encoded).
pub fn url_password(url: &str) -> Option<String> {
    reqwest::Url::parse(url).ok()?.password().map(str::to_string)
}

/// `url` with the password `***` replaced by `password`; other URLs unchanged.
pub fn restore_url_password(url: &mut String, password: &str) {
    let placeholder = format!(":{REDACTED}@");
    if reqwest::Url::parse(url).is_ok_and(|u| u.password() == Some(REDACTED)) && url.contains(&placeholder) {
        *url = url.replacen(&placeholder, &format!(":{password}@"), 1);
    }
}

fn redacted<S: Serializer>(url: &str, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&redact_url(url))
}

fn redacted_opt<S: Serializer>(url: &Option<String>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match url {
        Some(url) => s.serialize_some(&redact_url(url)),
        None => s.serialize_none(),
    }
}

fn default_batch() -> usize {
    500
}

fn default_retries() -> u32 {
    5
}

fn default_backoff() -> u64 {
    500
}

fn default_timeout() -> u64 {
    30_000
}

impl HttpApiConfig {
    /// No stamp: the workspace keeps the position (at least once); columns not sent are kept
    /// by the API.
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        sluice_core::Capabilities { stamps: false, ..Default::default() }
    }

    /// Check the fields; pure.
    pub fn validate(&self) -> Result<()> {
        for (field, url) in
            [("destination.url", Some(&self.url)), ("destination.deletes.url", self.deletes.url.as_ref())]
        {
            if let Some(url) = url {
                let parsed = reqwest::Url::parse(url).map_err(|e| Error::config(field, e))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(Error::config(field, "must be an http:// or https:// URL"));
                }
                if parsed.password() == Some(REDACTED) {
                    return Err(Error::config(
                        field,
                        format!("the password '{REDACTED}' stands for a stored one and none is stored; give it"),
                    ));
                }
            }
        }
        if self.method == HttpMethod::Delete {
            return Err(Error::config("destination.method", "rows are sent with POST, PUT or PATCH"));
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return Err(Error::config("destination.batch_size", "must be between 1 and 100000"));
        }
        if self.max_retries > 20 {
            return Err(Error::config("destination.max_retries", "at most 20"));
        }
        if !(1..=600_000).contains(&self.timeout_ms) {
            return Err(Error::config("destination.timeout_ms", "must be between 1 and 600000"));
        }
        if self.deletes.flag.is_empty() {
            return Err(Error::config("destination.deletes.flag", "must not be empty"));
        }
        for name in self.headers.keys() {
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(Error::config(&format!("destination.headers.{name}"), "not a valid header name"));
            }
        }
        Ok(())
    }
}

/// Sends rows to an HTTP API.
pub struct HttpApiTarget {
    config: HttpApiConfig,
    client: reqwest::Client,
}

impl HttpApiTarget {
    /// A destination for `config`.
    pub fn new(config: HttpApiConfig) -> Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.timeout_ms))
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::new(ErrorKind::Fatal, "cannot build the HTTP client").with_source(e))?;
        Ok(Self { config, client })
    }

    /// Send one JSON array, retrying 429, 5xx and lost connections.
    async fn send(&self, method: HttpMethod, url: &str, key: &str, batch_no: usize, body: Vec<u8>) -> Result<()> {
        let mut attempt = 0u32;
        loop {
            let mut request = self
                .client
                .request(method.as_reqwest(), url)
                .header("content-type", "application/json")
                .header("idempotency-key", key)
                .body(body.clone());
            for (name, value) in &self.config.headers {
                request = request.header(name.as_str(), value.expose());
            }
            let (retry, wait, problem) = match request.send().await {
                Ok(response) if response.status().is_success() => return Ok(()),
                Ok(response) => {
                    let status = response.status();
                    let after = retry_after(response.headers());
                    let text: String = response.text().await.unwrap_or_default().chars().take(300).collect();
                    let retry = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
                    (retry, after, format!("answered {status}: {text}"))
                }
                // The error's own text would name the URL, password included.
                Err(e) => {
                    (e.is_connect() || e.is_timeout() || e.is_request(), None, format!("failed: {}", e.without_url()))
                }
            };
            let shown = redact_url(url);
            if !retry || attempt >= self.config.max_retries {
                let tries = if retry { format!(" after {attempt} retries") } else { String::new() };
                // A server that is down or busy may come back (a stream waits, `reconnecting`);
                // one that refused the rows will not.
                let kind = if retry { ErrorKind::Connect } else { ErrorKind::Fatal };
                return Err(Error::new(kind, format!("HTTP API: batch {batch_no} to {shown} {problem}{tries}")));
            }
            let backoff = Duration::from_millis(self.config.backoff_ms.saturating_mul(1 << attempt.min(16)))
                .min(Duration::from_secs(30));
            let wait = wait.map_or(backoff, |w| w.max(backoff).min(Duration::from_secs(300)));
            tracing::warn!(
                url = %shown,
                batch = batch_no,
                attempt,
                wait_ms = wait.as_millis() as u64,
                "HTTP API {problem}; retrying."
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

/// `Retry-After` in seconds or as an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    (when.with_timezone(&chrono::Utc) - chrono::Utc::now()).to_std().ok()
}

/// The idempotency key of one batch: the same sync, run and batch always give the same key.
pub fn idempotency_key(sync: &str, run_id: &str, batch_no: usize) -> String {
    let digest = Sha256::digest(format!("{sync}\0{run_id}\0{batch_no}"));
    hex::encode(&digest[..16])
}

/// The rows of `batches` as one batch (with `flag: true` added when asked), to be sent
/// `size` rows at a time: only one request body exists at a time.
fn request_rows(batches: &[RecordBatch], flag: Option<&str>) -> Result<Option<RecordBatch>> {
    let Some(first) = batches.first() else { return Ok(None) };
    let all = arrow::compute::concat_batches(&first.schema(), batches).map_err(json_error)?;
    let Some(flag) = flag else { return Ok(Some(all)) };
    let mut fields: Vec<arrow::datatypes::Field> = all.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(arrow::datatypes::Field::new(flag, arrow::datatypes::DataType::Boolean, false));
    let mut columns = all.columns().to_vec();
    columns.push(std::sync::Arc::new(arrow::array::BooleanArray::from(vec![true; all.num_rows()])));
    RecordBatch::try_new(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)), columns)
        .map(Some)
        .map_err(json_error)
}

/// One request body: the rows as a JSON array of objects, NULLs written out (an API must see a
/// field that became NULL, not a field left out).
fn json_body(rows: &RecordBatch) -> Result<Vec<u8>> {
    let mut writer = arrow::json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow::json::writer::JsonArray>(Vec::new());
    writer.write(rows).map_err(json_error)?;
    writer.finish().map_err(json_error)?;
    Ok(writer.into_inner())
}

fn json_error(e: arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, "cannot render rows as JSON").with_source(e)
}

#[async_trait]
impl Destination for HttpApiTarget {
    async fn check(&mut self) -> Result<()> {
        // Nothing can be sent without side effects; the URL was checked by `validate`.
        Ok(())
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        let size = self.config.batch_size;
        let mut batch_no = 0usize;
        let url = self.config.deletes.url.clone().unwrap_or_else(|| self.config.url.clone());
        let flag = self.config.deletes.flag.clone();
        // Columns the rows lack (`keep`) are left out: the API keeps what it has for them.
        let rows: Vec<RecordBatch> = delivery
            .rows
            .iter()
            .map(|b| {
                let sent: Vec<usize> =
                    (0..b.num_columns()).filter(|i| !delivery.keep.contains(b.schema().field(*i).name())).collect();
                b.project(&sent).map_err(|e| Error::new(ErrorKind::Fatal, format!("http: {e}")))
            })
            .collect::<Result<_>>()?;
        let sends = [
            (request_rows(&rows, None)?, self.config.method, self.config.url.clone()),
            (request_rows(&delivery.deletes, Some(&flag))?, self.config.deletes.method, url),
        ];
        for (rows, method, url) in sends {
            let Some(rows) = rows else { continue };
            let mut start = 0;
            while start < rows.num_rows() {
                let len = size.min(rows.num_rows() - start);
                batch_no += 1;
                let key = idempotency_key(&delivery.sync, &delivery.run_id, batch_no);
                self.send(method, &url, &key, batch_no, json_body(&rows.slice(start, len))?).await?;
                start += len;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_password_is_redacted_and_restored_as_written() {
        let url = "https://etl:p%40ss-w0rd@api.example.com:8443/v1/rows?x=1";
        let shown = redact_url(url);
        assert_eq!(shown, "https://etl:***@api.example.com:8443/v1/rows?x=1");
        assert_eq!(url_password(url).as_deref(), Some("p%40ss-w0rd"));
        let mut back = shown.clone();
        restore_url_password(&mut back, "p%40ss-w0rd");
        assert_eq!(back, url);
        // No password, or a URL that does not parse: nothing to hide, or everything before `@`.
        assert_eq!(redact_url("http://etl@h/x"), "http://etl@h/x");
        assert_eq!(redact_url("http://a:b@[::1/x"), "http://***@[::1/x");
        // A real password is not a placeholder.
        let mut other = url.to_string();
        restore_url_password(&mut other, "zzz");
        assert_eq!(other, url);
    }
}
