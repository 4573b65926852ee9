//! The HTTP calls: a statement in the body, or an INSERT in the query string with its rows in
//! the body. ClickHouse answers an error with a non-200 status and `Code: N, …` text.

use sluice_core::{Error, ErrorKind, Result};

use super::ClickhouseConfig;

/// A session to one ClickHouse server.
pub(super) struct Client {
    http: reqwest::Client,
    url: reqwest::Url,
    user: String,
    password: String,
    database: String,
}

impl Client {
    pub(super) fn new(config: &ClickhouseConfig) -> Result<Self> {
        let url = reqwest::Url::parse(&config.url).map_err(|e| Error::config("destination.url", e))?;
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(300))
            .build()
            .map_err(|e| Error::new(ErrorKind::Fatal, "HTTP client").with_source(e))?;
        Ok(Self {
            http,
            url,
            user: config.user.clone(),
            password: config.password.as_ref().map(|p| p.expose().to_string()).unwrap_or_default(),
            database: config.database.clone(),
        })
    }

    /// Run `sql`; its output as text (a SELECT with `FORMAT TSV`, or nothing).
    pub(super) async fn query(&self, sql: &str) -> Result<String> {
        self.send(&[], sql.to_string().into_bytes()).await
    }

    /// `INSERT INTO … FORMAT JSONEachRow` with `rows` (one JSON object per line).
    pub(super) async fn insert(&self, insert: &str, rows: Vec<u8>) -> Result<()> {
        self.send(&[("query", insert)], rows).await.map(drop)
    }

    async fn send(&self, params: &[(&str, &str)], body: Vec<u8>) -> Result<String> {
        let mut url = self.url.clone();
        url.query_pairs_mut().append_pair("database", &self.database).extend_pairs(params);
        let response = self
            .http
            .post(url)
            .basic_auth(&self.user, Some(&self.password))
            .body(body)
            .send()
            .await
            .map_err(|e| Error::new(ErrorKind::Connect, format!("ClickHouse at {}: {e}", self.url)))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| Error::new(ErrorKind::Connect, format!("ClickHouse: {e}")))?;
        if status.is_success() {
            return Ok(text);
        }
        Err(Error::new(kind(status.as_u16(), &text), format!("ClickHouse: {}", text.trim())))
    }
}

/// What an error answer means: a login or grant to fix, a row the server refuses, a busy
/// server, or anything else.
fn kind(status: u16, text: &str) -> ErrorKind {
    let code = text.strip_prefix("Code: ").and_then(|t| t.split(',').next()).and_then(|c| c.trim().parse::<u32>().ok());
    match (status, code) {
        (401 | 403, _) | (_, Some(192 | 193 | 194 | 195 | 497 | 516)) => ErrorKind::Config,
        // Values that do not parse or convert, or do not fit their column.
        (_, Some(6 | 26 | 27 | 38 | 41 | 53 | 69 | 70 | 72 | 117 | 130)) => ErrorKind::Data,
        // Too many parts or queries, memory, timeouts: the server asks to wait.
        (_, Some(159 | 160 | 202 | 209 | 241 | 252)) | (503, _) => ErrorKind::Transient,
        _ => ErrorKind::Fatal,
    }
}

/// A name quoted for ClickHouse: backticks, with backslash and backtick escaped.
pub(super) fn quote(name: &str) -> String {
    format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
}

/// Text quoted as a ClickHouse string literal.
pub(super) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}
