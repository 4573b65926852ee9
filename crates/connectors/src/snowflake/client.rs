//! A session over Snowflake's driver protocol: log in, run statements with bind variables, and
//! read small results (JSON rowsets, or Arrow IPC streams in base64) as text.

use arrow::array::Array;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use base64::Engine;
use serde_json::{Value, json};
use sluice_core::{Error, ErrorKind, Result};

use super::SnowflakeConfig;

/// A logged-in session.
pub(super) struct Client {
    http: reqwest::Client,
    url: reqwest::Url,
    token: String,
}

/// One bind variable's values, one per run of the statement (an array binding runs it once
/// per value), as text: Snowflake converts text to the column's type.
pub(super) type Binding = Vec<Option<String>>;

impl Client {
    /// Log in with the config's user and password, or its private key (a signed JWT).
    pub(super) async fn login(config: &SnowflakeConfig) -> Result<Self> {
        let url = reqwest::Url::parse(&config.url).map_err(|e| Error::config("destination.url", e))?;
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(300))
            .build()
            .map_err(|e| Error::new(ErrorKind::Fatal, "HTTP client").with_source(e))?;
        let mut login = url.join("/session/v1/login-request").map_err(|e| Error::config("destination.url", e))?;
        {
            let mut q = login.query_pairs_mut();
            q.append_pair("databaseName", &config.database).append_pair("schemaName", &config.schema);
            if let Some(w) = &config.warehouse {
                q.append_pair("warehouse", w);
            }
            if let Some(r) = &config.role {
                q.append_pair("roleName", r);
            }
        }
        let mut body = json!({"data": {
            "ACCOUNT_NAME": config.account(),
            "LOGIN_NAME": config.user,
            "CLIENT_APP_ID": "sluice",
            "CLIENT_APP_VERSION": env!("CARGO_PKG_VERSION"),
            "SESSION_PARAMETERS": {"TIMEZONE": "UTC"},
        }});
        if let Some(key) = &config.private_key {
            let now = chrono::Utc::now().timestamp();
            let token = super::keypair::KeyPair::from_pem(key.expose())?.token(&config.account(), &config.user, now)?;
            body["data"]["AUTHENTICATOR"] = json!("SNOWFLAKE_JWT");
            body["data"]["TOKEN"] = json!(token);
        } else {
            body["data"]["PASSWORD"] =
                json!(config.password.as_ref().map(|p| p.expose().to_string()).unwrap_or_default());
        }
        let answer = post(&http, login, None, &body).await?;
        let token = answer["data"]["token"]
            .as_str()
            .ok_or_else(|| Error::new(ErrorKind::Config, "Snowflake: the login answer has no token"))?
            .to_string();
        Ok(Self { http, url, token })
    }

    /// Run `sql` with `bindings` (`?` in order); the result's rows as text.
    pub(super) async fn query(&self, sql: &str, bindings: &[Binding]) -> Result<Vec<Vec<Option<String>>>> {
        let mut body = json!({"sqlText": sql, "asyncExec": false});
        if !bindings.is_empty() {
            let many = bindings.iter().any(|b| b.len() != 1);
            let mut map = serde_json::Map::new();
            for (i, values) in bindings.iter().enumerate() {
                let value = if many { json!(values) } else { json!(values[0]) };
                map.insert((i + 1).to_string(), json!({"type": "TEXT", "value": value}));
            }
            body["bindings"] = Value::Object(map);
        }
        let mut url = self.url.join("/queries/v1/query-request").map_err(|e| Error::config("destination.url", e))?;
        url.query_pairs_mut().append_pair("requestId", &uuid());
        let answer = post(&self.http, url, Some(&self.token), &body).await?;
        rows(&answer["data"])
    }
}

impl Client {
    /// Run a `PUT`: its answer says where the file goes (`stageInfo`).
    pub(super) async fn put(&self, sql: &str) -> Result<Value> {
        let body = json!({"sqlText": sql, "asyncExec": false});
        let mut url = self.url.join("/queries/v1/query-request").map_err(|e| Error::config("destination.url", e))?;
        url.query_pairs_mut().append_pair("requestId", &uuid());
        let mut answer = post(&self.http, url, Some(&self.token), &body).await?;
        Ok(answer["data"].take())
    }

    /// Upload `bytes` as `file` where a `PUT`'s answer says: a presigned URL (how Snowflake on
    /// GCS, and fakesnow, take uploads) or a local folder (`LOCAL_FS`). `false`: the answer
    /// asks for an upload that is not built (S3 or Azure stages, which need the cloud's own
    /// client with the answer's temporary credentials, or client-side encryption).
    pub(super) async fn upload(&self, answer: &Value, file: &str, bytes: Vec<u8>) -> Result<bool> {
        let info = &answer["stageInfo"];
        let kind = info["locationType"].as_str().unwrap_or("none");
        let encrypted = answer["encryptionMaterial"].is_object()
            || answer["encryptionMaterial"].as_array().is_some_and(|m| m.iter().any(Value::is_object));
        if encrypted {
            return Ok(false);
        }
        match (kind, info["presignedUrl"].as_str()) {
            (_, Some(presigned)) => {
                let response = self
                    .http
                    .put(presigned)
                    .header("Content-Type", "application/octet-stream")
                    .body(bytes)
                    .send()
                    .await
                    .map_err(|e| Error::new(ErrorKind::Connect, format!("Snowflake: uploading {file}: {e}")))?;
                if !response.status().is_success() {
                    return Err(Error::new(
                        ErrorKind::Transient,
                        format!("Snowflake: uploading {file} answered {}", response.status()),
                    ));
                }
                Ok(true)
            }
            ("LOCAL_FS", None) => {
                let dir = std::path::Path::new(info["location"].as_str().unwrap_or_default());
                std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(dir.join(file), bytes))
                    .map(|()| true)
                    .map_err(|e| Error::new(ErrorKind::Fatal, format!("Snowflake: writing {file} to the stage: {e}")))
            }
            _ => Ok(false),
        }
    }
}

async fn post(http: &reqwest::Client, url: reqwest::Url, token: Option<&str>, body: &Value) -> Result<Value> {
    let mut request = http.post(url.clone()).header("Accept", "application/snowflake").json(body);
    if let Some(token) = token {
        request = request.header("Authorization", format!("Snowflake Token=\"{token}\""));
    }
    let response =
        request.send().await.map_err(|e| Error::new(ErrorKind::Connect, format!("Snowflake at {url}: {e}")))?;
    let status = response.status();
    let answer: Value = response
        .json()
        .await
        .map_err(|e| Error::new(ErrorKind::Connect, format!("Snowflake answered {status} without JSON: {e}")))?;
    if answer["success"].as_bool() == Some(true) {
        return Ok(answer);
    }
    let code = answer["code"].as_str().unwrap_or_default().to_string();
    let message = answer["message"].as_str().unwrap_or("no message");
    Err(Error::new(kind(status.as_u16(), &code), format!("Snowflake: {message} (code {code})")))
}

/// What an error means: a login to fix, a value Snowflake refuses, a busy service, or else.
fn kind(status: u16, code: &str) -> ErrorKind {
    match (status, code) {
        (401 | 403, _) | (_, "390100" | "390101" | "390144" | "390102" | "002003" | "003001") => ErrorKind::Config,
        (_, "100038" | "100035" | "100040" | "100069" | "100071" | "100116" | "002023") => ErrorKind::Data,
        (429 | 502 | 503 | 504, _) | (_, "000625" | "390114") => ErrorKind::Transient,
        _ => ErrorKind::Fatal,
    }
}

/// A result's rows as text: a JSON rowset, or an Arrow IPC stream in base64.
fn rows(data: &Value) -> Result<Vec<Vec<Option<String>>>> {
    if let Some(rowset) = data["rowset"].as_array() {
        return Ok(rowset
            .iter()
            .map(|r| r.as_array().into_iter().flatten().map(|v| v.as_str().map(str::to_string)).collect())
            .collect());
    }
    let Some(encoded) = data["rowsetBase64"].as_str().filter(|s| !s.is_empty()) else { return Ok(Vec::new()) };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| Error::new(ErrorKind::Fatal, "Snowflake: a result that is not base64").with_source(e))?;
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| Error::new(ErrorKind::Fatal, "Snowflake: an unreadable Arrow result").with_source(e))?;
    let options = FormatOptions::default();
    let mut out = Vec::new();
    for batch in reader {
        let batch =
            batch.map_err(|e| Error::new(ErrorKind::Fatal, "Snowflake: an unreadable Arrow result").with_source(e))?;
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::new(ErrorKind::Fatal, "Snowflake: an unreadable Arrow result").with_source(e))?;
        for row in 0..batch.num_rows() {
            out.push(
                batch
                    .columns()
                    .iter()
                    .zip(&formatters)
                    .map(|(c, f)| (!c.is_null(row)).then(|| f.value(row).to_string()))
                    .collect(),
            );
        }
    }
    Ok(out)
}

/// A request id: random, in the form of a UUID.
fn uuid() -> String {
    let a: u128 = rand::random();
    let h = format!("{a:032x}");
    format!("{}-{}-4{}-a{}-{}", &h[..8], &h[8..12], &h[13..16], &h[17..20], &h[20..32])
}
