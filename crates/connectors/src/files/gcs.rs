//! A minimal Google Cloud Storage client on the JSON API: one-request media upload, download
//! and delete. `object_store`'s GCS backend uploads through the XML API, which the
//! fake-gcs-server emulator does not take; the JSON API is what both GCS and the emulator speak.
//!
//! A media upload replaces the whole object at once, so a reader sees the old object or the new
//! one. Failures that may pass (lost connections, 408, 429, 5xx) are retried a few times here and
//! then returned as [`ErrorKind::Connect`], so the caller's own retries take over.

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::{Deserialize, Serialize};
use sluice_core::{Error, ErrorKind, Result, Secret};

/// The JSON API of Google Cloud Storage itself.
const DEFAULT_ENDPOINT: &str = "https://storage.googleapis.com";
/// Where an access token is read from when the config has none.
const TOKEN_ENV: &str = "GOOGLE_OAUTH_ACCESS_TOKEN";
/// Tries per operation, and the wait before the first retry (doubled each time).
const ATTEMPTS: u32 = 4;
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Time allowed for a request beyond what its body needs at 1 MiB/s.
const BASE_TIMEOUT: Duration = Duration::from_secs(60);
/// A download's whole time: its size is not known in advance.
const GET_TIMEOUT: Duration = Duration::from_secs(600);

/// A Google Cloud Storage endpoint and credentials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GcsConfig {
    /// The JSON API's base URL; https://storage.googleapis.com when absent (fake-gcs-server:
    /// http://127.0.0.1:PORT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// An OAuth 2 access token (`gcloud auth print-access-token`); never serialized back.
    /// Without it, the GOOGLE_OAUTH_ACCESS_TOKEN environment variable, else no Authorization
    /// header (emulators).
    #[serde(default, skip_serializing)]
    pub token: Option<Secret>,
}

/// One bucket, through the JSON API.
#[derive(Debug)]
pub struct GcsClient {
    http: reqwest::Client,
    /// The endpoint without a trailing `/`.
    endpoint: String,
    bucket: String,
    token: Option<Secret>,
}

impl GcsClient {
    /// A client of `bucket` at `config`'s endpoint. Checks the endpoint and the bucket name;
    /// makes no request.
    pub fn new(config: &GcsConfig, bucket: &str) -> Result<Self> {
        let endpoint = endpoint(config.endpoint.as_deref())?;
        check_bucket(bucket)?;
        let token = config.token.clone().or_else(env_token);
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::new(ErrorKind::Fatal, "GCS: cannot build the HTTP client").with_source(e))?;
        Ok(Self { http, endpoint, bucket: bucket.to_string(), token })
    }

    /// Upload `bytes` as `name`, replacing the object if it exists (one media upload; GCS takes
    /// objects up to 5 TiB that way).
    pub async fn put(&self, name: &str, bytes: Bytes) -> Result<()> {
        check_name(name)?;
        let url = upload_url(&self.endpoint, &self.bucket, name);
        let timeout = BASE_TIMEOUT + Duration::from_secs(bytes.len() as u64 >> 20);
        let (url, bytes) = (&url, &bytes);
        self.retry("upload", name, move || async move {
            let request = self
                .request(Method::POST, url, timeout)
                .header(CONTENT_TYPE, "application/octet-stream")
                .body(bytes.clone());
            let response = request.send().await.map_err(|e| self.network("upload", name, e))?;
            match self.check("upload", name, response).await? {
                Some(_) => Ok(()),
                None => Err(Error::new(
                    ErrorKind::Config,
                    format!("GCS: cannot upload {}: the bucket does not exist", self.shown(name)),
                )),
            }
        })
        .await
    }

    /// The object's bytes; `None` when it does not exist (404, which is also what a missing
    /// bucket answers).
    pub async fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        check_name(name)?;
        let url = format!("{}?alt=media", object_url(&self.endpoint, &self.bucket, name));
        let url = &url;
        self.retry("download", name, move || async move {
            let response = self
                .request(Method::GET, url, GET_TIMEOUT)
                .send()
                .await
                .map_err(|e| self.network("download", name, e))?;
            match self.check("download", name, response).await? {
                Some(response) => {
                    let body = response.bytes().await.map_err(|e| self.network("download", name, e))?;
                    Ok(Some(body.to_vec()))
                }
                None => Ok(None),
            }
        })
        .await
    }

    /// Delete the object; a missing object is fine.
    pub async fn delete(&self, name: &str) -> Result<()> {
        check_name(name)?;
        let url = object_url(&self.endpoint, &self.bucket, name);
        let url = &url;
        self.retry("delete", name, move || async move {
            let response = self
                .request(Method::DELETE, url, BASE_TIMEOUT)
                .send()
                .await
                .map_err(|e| self.network("delete", name, e))?;
            self.check("delete", name, response).await.map(|_| ())
        })
        .await
    }

    fn request(&self, method: Method, url: &str, timeout: Duration) -> RequestBuilder {
        let request = self.http.request(method, url).timeout(timeout);
        match &self.token {
            Some(token) => request.header(AUTHORIZATION, format!("Bearer {}", token.expose())),
            None => request,
        }
    }

    /// The response when it succeeded, `None` on 404, else the error its status means.
    async fn check(&self, op: &str, name: &str, response: Response) -> Result<Option<Response>> {
        let status = response.status();
        if status.is_success() {
            return Ok(Some(response));
        }
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let body = response.text().await.unwrap_or_default();
        Err(Error::new(
            status_kind(status),
            format!("GCS: cannot {op} {}: {status}: {}", self.shown(name), server_message(&body)),
        ))
    }

    fn network(&self, op: &str, name: &str, e: reqwest::Error) -> Error {
        let what = if e.is_timeout() { "timed out" } else { "request failed" };
        Error::new(ErrorKind::Connect, format!("GCS: cannot {op} {}: {what}", self.shown(name))).with_source(e)
    }

    fn shown(&self, name: &str) -> String {
        format!("gs://{}/{name}", self.bucket)
    }

    /// Run `attempt` until it succeeds, fails for good, or has been tried [`ATTEMPTS`] times.
    async fn retry<T, F, Fut>(&self, op: &str, name: &str, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut wait = FIRST_BACKOFF;
        let mut tries = 1;
        loop {
            match attempt().await {
                Err(e) if e.is_retryable() && tries < ATTEMPTS => {
                    tracing::warn!(object = %self.shown(name), op, attempt = tries, error = %e, "GCS request failed; retrying.");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    tries += 1;
                }
                outcome => return outcome,
            }
        }
    }
}

/// The token in GOOGLE_OAUTH_ACCESS_TOKEN, when set and not blank.
fn env_token() -> Option<Secret> {
    let token = std::env::var(TOKEN_ENV).ok()?;
    let token = token.trim();
    (!token.is_empty()).then(|| Secret::new(token))
}

/// What a failed status means: retry later (408, 429, 5xx), fix the config (401, 403: the
/// token or its permissions), or give up (other 4xx).
fn status_kind(status: StatusCode) -> ErrorKind {
    match status.as_u16() {
        408 | 429 => ErrorKind::Connect,
        401 | 403 => ErrorKind::Config,
        _ if status.is_server_error() => ErrorKind::Connect,
        _ => ErrorKind::Fatal,
    }
}

/// The `error.message` of a JSON API error body, else the body itself, shortened.
fn server_message(body: &str) -> String {
    #[derive(Deserialize)]
    struct Envelope {
        error: Detail,
    }
    #[derive(Deserialize)]
    struct Detail {
        message: String,
    }
    let message = match serde_json::from_str::<Envelope>(body) {
        Ok(envelope) => envelope.error.message,
        Err(_) => body.trim().to_string(),
    };
    match message.char_indices().nth(500) {
        Some((end, _)) => format!("{}…", &message[..end]),
        None if message.is_empty() => "(no message)".to_string(),
        None => message,
    }
}

/// The endpoint without a trailing `/`, checked.
fn endpoint(configured: Option<&str>) -> Result<String> {
    let raw = configured.map(str::trim).unwrap_or(DEFAULT_ENDPOINT);
    let url = reqwest::Url::parse(raw).map_err(|e| Error::config("destination.gcs.endpoint", e))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(Error::config("destination.gcs.endpoint", format!("{raw:?} is not an http(s) URL")));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Error::config("destination.gcs.endpoint", "takes no query or fragment"));
    }
    Ok(raw.trim_end_matches('/').to_string())
}

/// GCS bucket names: 3 to 63 characters (222 with dots), lowercase letters, digits, `-`, `_`
/// and `.`, starting and ending with a letter or digit.
fn check_bucket(bucket: &str) -> Result<()> {
    let max = if bucket.contains('.') { 222 } else { 63 };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok = (3..=max).contains(&bucket.len())
        && bucket.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
        && edge(bucket.chars().next())
        && edge(bucket.chars().last());
    if ok {
        Ok(())
    } else {
        Err(Error::config("destination.location", format!("{bucket:?} is not a valid GCS bucket name")))
    }
}

/// GCS object names: 1 to 1024 bytes of UTF-8, no carriage return or line feed, not `.` or `..`.
fn check_name(name: &str) -> Result<()> {
    let problem = if name.is_empty() {
        "is empty"
    } else if name.len() > 1024 {
        "is longer than 1024 bytes"
    } else if name.contains(['\r', '\n']) {
        "holds a line break"
    } else if name == "." || name == ".." {
        "is not a valid object name"
    } else {
        return Ok(());
    };
    Err(Error::new(ErrorKind::Config, format!("GCS: the object name {name:?} {problem}")))
}

/// Percent-encode everything but RFC 3986's unreserved characters, so a name is one path
/// segment (`/` becomes `%2F`) or one query value (`+`, `&`, `=` and `#` are escaped).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// The media upload of `name` into `bucket`.
fn upload_url(endpoint: &str, bucket: &str, name: &str) -> String {
    format!("{endpoint}/upload/storage/v1/b/{}/o?uploadType=media&name={}", encode(bucket), encode(name))
}

/// The object resource of `name` in `bucket`.
fn object_url(endpoint: &str, bucket: &str, name: &str) -> String {
    format!("{endpoint}/storage/v1/b/{}/o/{}", encode(bucket), encode(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_encoded_segment() {
        assert_eq!(encode("plain-name_1.parquet~"), "plain-name_1.parquet~");
        assert_eq!(encode("dir/sub/a.csv"), "dir%2Fsub%2Fa.csv");
        assert_eq!(encode("a b+c?d#e&f=g%h"), "a%20b%2Bc%3Fd%23e%26f%3Dg%25h");
        assert_eq!(encode("é/ü"), "%C3%A9%2F%C3%BC");
        assert_eq!(encode("date=2026-11-30/hour=07"), "date%3D2026-11-30%2Fhour%3D07");
    }

    #[test]
    fn urls_put_the_name_in_the_query_or_the_path() {
        let endpoint = "http://127.0.0.1:4443";
        assert_eq!(
            upload_url(endpoint, "etl", "orders/2026/a b.parquet"),
            "http://127.0.0.1:4443/upload/storage/v1/b/etl/o?uploadType=media&name=orders%2F2026%2Fa%20b.parquet"
        );
        assert_eq!(
            object_url(endpoint, "etl", "orders/x+y.csv"),
            "http://127.0.0.1:4443/storage/v1/b/etl/o/orders%2Fx%2By.csv"
        );
        // Every character of the encoded forms is one a URL parser keeps as it is.
        let url = reqwest::Url::parse(&object_url(endpoint, "etl", "a/é ?#%")).unwrap();
        assert_eq!(url.path(), "/storage/v1/b/etl/o/a%2F%C3%A9%20%3F%23%25");
        assert_eq!(url.query(), None);
        let url = reqwest::Url::parse(&upload_url(endpoint, "etl", "k=v&x/y")).unwrap();
        let pairs: Vec<(String, String)> = url.query_pairs().map(|(k, v)| (k.into(), v.into())).collect();
        assert_eq!(pairs, [("uploadType".into(), "media".into()), ("name".into(), "k=v&x/y".into())]);
    }

    #[test]
    fn endpoints_are_checked_and_trimmed() {
        assert_eq!(endpoint(None).unwrap(), "https://storage.googleapis.com");
        assert_eq!(endpoint(Some("http://127.0.0.1:4443/")).unwrap(), "http://127.0.0.1:4443");
        assert_eq!(endpoint(Some(" https://gcs.example/base ")).unwrap(), "https://gcs.example/base");
        for bad in ["127.0.0.1:4443", "ftp://host", "http://host/?x=1", "not a url"] {
            assert_eq!(endpoint(Some(bad)).unwrap_err().kind(), ErrorKind::Config, "{bad}");
        }
    }

    #[test]
    fn bucket_and_object_names_are_checked() {
        for good in ["etl", "my-bucket_1", "a.b.c", "0ab"] {
            check_bucket(good).unwrap();
        }
        for bad in ["", "ab", "Etl", "-etl", "etl-", "e/tl", "e tl", &"x".repeat(64)] {
            assert!(check_bucket(bad).is_err(), "{bad:?}");
        }
        check_name("a/b/c.parquet").unwrap();
        for bad in ["", ".", "..", "a\nb", &"x".repeat(1025)] {
            assert_eq!(check_name(bad).unwrap_err().kind(), ErrorKind::Config, "{bad:?}");
        }
    }

    #[test]
    fn statuses_map_to_kinds() {
        for (status, kind) in [
            (400, ErrorKind::Fatal),
            (401, ErrorKind::Config),
            (403, ErrorKind::Config),
            (408, ErrorKind::Connect),
            (409, ErrorKind::Fatal),
            (429, ErrorKind::Connect),
            (500, ErrorKind::Connect),
            (503, ErrorKind::Connect),
        ] {
            assert_eq!(status_kind(StatusCode::from_u16(status).unwrap()), kind, "{status}");
        }
    }

    #[test]
    fn server_messages_are_read_from_json_errors() {
        let body = r#"{"error":{"code":403,"message":"sa@x does not have storage.objects.create access","errors":[]}}"#;
        assert_eq!(server_message(body), "sa@x does not have storage.objects.create access");
        assert_eq!(server_message("Not Found\n"), "Not Found");
        assert_eq!(server_message(""), "(no message)");
        assert_eq!(server_message(&"é".repeat(600)).chars().count(), 501);
    }

    #[test]
    fn the_token_is_read_but_never_written() {
        let config: GcsConfig =
            serde_json::from_value(serde_json::json!({"endpoint": "http://127.0.0.1:1", "token": "ya29.secret"}))
                .unwrap();
        assert_eq!(config.token.as_ref().map(Secret::expose), Some("ya29.secret"));
        let shown = serde_json::to_string(&config).unwrap();
        assert_eq!(shown, r#"{"endpoint":"http://127.0.0.1:1"}"#);
        assert!(!format!("{config:?}").contains("ya29"));
        let unknown = serde_json::from_value::<GcsConfig>(serde_json::json!({"project": "p"}));
        assert!(unknown.is_err());
        let client = GcsClient::new(&config, "etl").unwrap();
        assert!(!format!("{client:?}").contains("ya29"));
    }
}
