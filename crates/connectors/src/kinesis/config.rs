//! Kinesis settings: the API's and the YAML's type, a pure `validate`, and the client.

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::config::{Credentials, Region};
use serde::{Deserialize, Serialize};
use sluice_core::{Error, ErrorKind, Result, Secret};

/// A Kinesis source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KinesisConfig {
    /// A named connection (`/api/connections`) that gives the fields left out here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// The data stream's name, or its ARN (`arn:aws:kinesis:REGION:ACCOUNT:stream/NAME`).
    pub stream: String,
    /// AWS region; defaults to the provider chain's (`AWS_REGION`, profile), or the ARN's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Endpoint URL, for an emulator or a VPC endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// An access key pair; without it the default provider chain is used (environment,
    /// profile, SSO, container or instance role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<KinesisCredentials>,
    /// Where to start when no checkpoint is stored.
    #[serde(default)]
    pub start: KinesisStart,
    /// Least time between two GetRecords calls on one shard, ms (AWS allows 5 per second).
    #[serde(default = "default_poll_ms")]
    pub poll_interval_ms: u64,
    /// Records per GetRecords call (at most 10000).
    #[serde(default = "default_max_records")]
    pub max_records: i32,
}

fn default_poll_ms() -> u64 {
    200
}

fn default_max_records() -> i32 {
    10_000
}

/// An access key pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KinesisCredentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key; never serialized back.
    #[serde(default, skip_serializing)]
    pub secret_access_key: Option<Secret>,
    /// Session token, for temporary credentials; never serialized back.
    #[serde(default, skip_serializing)]
    pub session_token: Option<Secret>,
}

/// Where a shard with no checkpoint starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KinesisStart {
    /// The oldest record still retained (TRIM_HORIZON).
    #[default]
    Oldest,
    /// Only records put after the stream starts (LATEST).
    Latest,
    /// Records from this time on (AT_TIMESTAMP), RFC 3339.
    AtTimestamp(String),
}

impl KinesisStart {
    /// The timestamp of `AtTimestamp`, parsed.
    pub fn timestamp(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        match self {
            Self::AtTimestamp(t) => chrono::DateTime::parse_from_rfc3339(t).ok().map(|t| t.to_utc()),
            _ => None,
        }
    }
}

impl KinesisConfig {
    /// Check every field; pure. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        let name = self.stream_name();
        let name_ok = !name.is_empty()
            && name.len() <= 128
            && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !name_ok {
            return Err(Error::config("source.stream", "a stream name (1-128 of a-z, A-Z, 0-9, _ . -) or its ARN"));
        }
        if self.stream.starts_with("arn:") && self.arn_region().is_none() {
            return Err(Error::config("source.stream", "an ARN looks like arn:aws:kinesis:REGION:ACCOUNT:stream/NAME"));
        }
        if let Some(r) = &self.region
            && (r.is_empty() || !r.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        {
            return Err(Error::config("source.region", format!("'{r}' is not a region name")));
        }
        if let Some(e) = &self.endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            return Err(Error::config("source.endpoint", "must start with http:// or https://"));
        }
        if let Some(c) = &self.credentials {
            if c.access_key_id.is_empty() {
                return Err(Error::config("source.credentials.access_key_id", "must not be empty"));
            }
            if c.secret_access_key.as_ref().is_none_or(|s| s.expose().is_empty()) {
                return Err(Error::config("source.credentials.secret_access_key", "is required with credentials"));
            }
        }
        if matches!(self.start, KinesisStart::AtTimestamp(_)) && self.start.timestamp().is_none() {
            return Err(Error::config(
                "source.start.at_timestamp",
                "must be an RFC 3339 time, e.g. 2026-01-31T12:00:00Z",
            ));
        }
        if !(1..=60_000).contains(&self.poll_interval_ms) {
            return Err(Error::config("source.poll_interval_ms", "must be between 1 and 60000"));
        }
        if !(1..=10_000).contains(&self.max_records) {
            return Err(Error::config("source.max_records", "must be between 1 and 10000"));
        }
        Ok(())
    }

    /// The stream's name, also when given as an ARN.
    pub fn stream_name(&self) -> &str {
        match self.stream.strip_prefix("arn:") {
            Some(_) => self.stream.rsplit_once("stream/").map_or("", |(_, n)| n),
            None => &self.stream,
        }
    }

    /// The stream's ARN, when given as one.
    pub fn stream_arn(&self) -> Option<&str> {
        self.stream.starts_with("arn:").then_some(self.stream.as_str())
    }

    fn arn_region(&self) -> Option<&str> {
        let mut parts = self.stream.split(':');
        let region = parts.nth(3)?;
        (!region.is_empty() && parts.next().is_some() && self.stream.contains(":stream/")).then_some(region)
    }

    /// A client: the explicit key pair or the default chain, the region, the endpoint.
    pub async fn client(&self) -> Result<Client> {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(region) = self.region.clone().or_else(|| self.arn_region().map(str::to_string)) {
            loader = loader.region(Region::new(region));
        }
        if let Some(c) = &self.credentials {
            let secret = c.secret_access_key.as_ref().map(|s| s.expose().to_string()).unwrap_or_default();
            let token = c.session_token.as_ref().map(|s| s.expose().to_string());
            loader = loader.credentials_provider(Credentials::new(&c.access_key_id, secret, token, None, "sluice"));
        }
        if let Some(e) = &self.endpoint {
            loader = loader.endpoint_url(e);
        }
        // The readers retry with their own backoff and count throttling; SDK retries would
        // hide it.
        loader = loader.retry_config(aws_config::retry::RetryConfig::disabled());
        let shared = loader.load().await;
        if shared.region().is_none() {
            return Err(Error::config("source.region", "not set, and no default region (AWS_REGION, profile) found"));
        }
        if shared.credentials_provider().is_none() {
            return Err(Error::new(ErrorKind::Config, "no AWS credentials: set source.credentials or AWS_* variables"));
        }
        Ok(Client::new(&shared))
    }
}

/// Test connection for an AWS account: list its Kinesis streams with `config` (a Kinesis
/// source's JSON).
pub async fn test_account(config: serde_json::Value) -> Result<String> {
    let config: KinesisConfig =
        serde_json::from_value(config).map_err(|e| Error::new(ErrorKind::Config, format!("connection: {e}")))?;
    let listed = config.client().await?.list_streams().send().await.map_err(|e| {
        Error::new(
            ErrorKind::Connect,
            format!("Kinesis ListStreams failed: {}", aws_sdk_kinesis::error::DisplayErrorContext(&e)),
        )
    })?;
    Ok(format!("logged in; {} Kinesis stream(s)", listed.stream_names().len()))
}

/// The data stream `config` names, as Kinesis describes it.
pub async fn probe(config: &KinesisConfig) -> Result<String> {
    let mut request = config.client().await?.describe_stream_summary();
    request = match config.stream_arn() {
        Some(arn) => request.stream_arn(arn),
        None => request.stream_name(config.stream_name()),
    };
    let summary = request.send().await.map_err(|e| {
        Error::new(
            ErrorKind::Connect,
            format!("DescribeStreamSummary failed: {}", aws_sdk_kinesis::error::DisplayErrorContext(&e)),
        )
    })?;
    let s = summary.stream_description_summary();
    Ok(format!(
        "stream {} is {}, {} open shard(s)",
        config.stream_name(),
        s.map(|s| s.stream_status().as_str().to_string()).unwrap_or_default(),
        s.map_or(0, |s| s.open_shard_count())
    ))
}
