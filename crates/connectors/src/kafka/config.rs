//! Kafka settings: the API's and the YAML's type, a pure `validate`, and the client config.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize, Serializer};
use sluice_core::secret::REDACTED;
use sluice_core::{Error, ErrorKind, Result, Secret};

/// A Kafka source.
#[derive(Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// A named connection (`/api/connections`) that gives the fields left out here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// Topics to read. Give these or `topic_regex`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<String>,
    /// A regular expression over topic names (librdkafka syntax); new matching topics are
    /// picked up as they appear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_regex: Option<String>,
    /// Consumer group; defaults to `sluice-<stream name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Where to start when no position is stored: `oldest` or `newest`.
    #[serde(default)]
    pub start: StartFrom,
    /// TLS: a CA file, and a client certificate and key for mutual TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// SASL authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<SaslConfig>,
    /// Extra librdkafka properties, passed through (for example `session.timeout.ms`). The
    /// values of secret ones ([`is_secret_property`]) are serialized as `***` and kept apart
    /// like the other secrets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", serialize_with = "redacted")]
    pub properties: BTreeMap<String, String>,
    /// How long a partition of the subscribed topics that this member does not hold may go
    /// unread by the whole group before the member leaves the group and joins again; 0 never.
    #[serde(default = "default_rejoin_idle_ms", skip_serializing_if = "is_default_rejoin_idle_ms")]
    pub rejoin_idle_ms: u64,
}

/// Whether a librdkafka property holds a secret: a password or passphrase, a secret, a private
/// key, or the OAUTHBEARER config string (which can carry credentials).
pub fn is_secret_property(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["password", "secret", "passphrase", "private"].iter().any(|w| n.contains(w))
        || ["ssl.key.pem", "ssl_key", "sasl.oauthbearer.config"].contains(&n.as_str())
}

/// librdkafka's refusal of a client config, without the value when the property is a secret
/// (its own message quotes the value).
pub(crate) fn client_config_error(error: rdkafka::error::KafkaError) -> Error {
    use rdkafka::error::KafkaError;
    let message = match &error {
        KafkaError::ClientConfig(_, desc, key, value) if is_secret_property(key) || key == "sasl.password" => {
            let desc = if value.is_empty() { desc.clone() } else { desc.replace(value.as_str(), REDACTED) };
            format!("cannot create the Kafka consumer: {desc} (property {key})")
        }
        _ => return Error::new(sluice_core::ErrorKind::Config, "cannot create the Kafka consumer").with_source(error),
    };
    Error::new(sluice_core::ErrorKind::Config, message)
}

fn redacted<S: Serializer>(properties: &BTreeMap<String, String>, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_map(properties.iter().map(|(k, v)| (k, if is_secret_property(k) { REDACTED } else { v.as_str() })))
}

/// Printed as serialized: without secrets.
impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KafkaConfig({})", serde_json::to_string(self).unwrap_or_default())
    }
}

fn default_rejoin_idle_ms() -> u64 {
    20_000
}

fn is_default_rejoin_idle_ms(ms: &u64) -> bool {
    *ms == default_rejoin_idle_ms()
}

/// Where a stream starts when it has no stored position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StartFrom {
    /// The oldest message still in the topic.
    #[default]
    Oldest,
    /// Only messages produced after the stream starts.
    Newest,
}

/// TLS files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// CA certificate(s) to trust, PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate, PEM (mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// Client private key, PEM (mutual TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

/// SASL settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SaslConfig {
    /// `plain`, `scram-sha-256` or `scram-sha-512`.
    pub mechanism: SaslMechanism,
    /// User name.
    pub username: String,
    /// Password; never serialized back.
    #[serde(default, skip_serializing)]
    pub password: Option<Secret>,
}

/// SASL mechanisms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SaslMechanism {
    /// PLAIN (for example Azure Event Hubs' Kafka endpoint); use it with TLS.
    Plain,
    /// SCRAM-SHA-256.
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    /// SCRAM-SHA-512.
    #[serde(rename = "scram-sha-512")]
    ScramSha512,
}

/// Properties Sluice sets itself; passing them through would break its guarantees.
const MANAGED: [(&str, &str); 9] = [
    ("bootstrap.servers", "use `brokers`"),
    ("group.id", "use `group`"),
    ("enable.auto.commit", "Sluice commits offsets after each durable batch"),
    ("enable.auto.offset.store", "Sluice stores offsets with the rows"),
    ("auto.offset.reset", "use `start`"),
    ("security.protocol", "use `tls` and `sasl`"),
    ("sasl.mechanism", "use `sasl.mechanism`"),
    ("sasl.username", "use `sasl.username`"),
    ("sasl.password", "use `sasl.password`"),
];

impl KafkaConfig {
    /// Check every field; pure. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.brokers.is_empty() {
            return Err(Error::config("source.brokers", "give at least one broker, host:port"));
        }
        for b in &self.brokers {
            let ok = b.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(Error::config("source.brokers", format!("'{b}' is not host:port")));
            }
        }
        match (self.topics.is_empty(), &self.topic_regex) {
            (true, None) => return Err(Error::config("source.topics", "give topics or topic_regex")),
            (false, Some(_)) => {
                return Err(Error::config("source.topic_regex", "give topics or topic_regex, not both"));
            }
            (_, Some(r)) if r.is_empty() => return Err(Error::config("source.topic_regex", "must not be empty")),
            _ => {}
        }
        if self.topics.iter().any(|t| t.is_empty() || t.starts_with('^')) {
            return Err(Error::config("source.topics", "names must be non-empty; use topic_regex for patterns"));
        }
        if let Some(sasl) = &self.sasl {
            if sasl.username.is_empty() {
                return Err(Error::config("source.sasl.username", "must not be empty"));
            }
            if sasl.password.as_ref().is_none_or(|p| p.expose().is_empty()) {
                return Err(Error::config("source.sasl.password", "is required with sasl"));
            }
        }
        if let Some(tls) = &self.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            return Err(Error::config("source.tls", "cert_file and key_file go together"));
        }
        if self.rejoin_idle_ms != 0 && !(1_000..=3_600_000).contains(&self.rejoin_idle_ms) {
            return Err(Error::config("source.rejoin_idle_ms", "0 (never), or between 1000 and 3600000"));
        }
        for (key, value) in &self.properties {
            if let Some((_, instead)) = MANAGED.iter().find(|(k, _)| k == key) {
                return Err(Error::config(&format!("source.properties.{key}"), format!("set by Sluice; {instead}")));
            }
            if is_secret_property(key) && value == REDACTED {
                return Err(Error::config(
                    &format!("source.properties.{key}"),
                    format!("'{REDACTED}' stands for a stored secret and none is stored; give the value"),
                ));
            }
        }
        Ok(())
    }

    /// The consumer group of `stream`.
    pub fn group_id(&self, stream: &str) -> String {
        self.group.clone().unwrap_or_else(|| format!("sluice-{stream}"))
    }

    /// The librdkafka client config for `stream`'s consumer.
    pub fn client_config(&self, stream: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", self.brokers.join(","))
            .set("group.id", self.group_id(stream))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", if self.start == StartFrom::Oldest { "earliest" } else { "latest" });
        let protocol = match (self.tls.is_some(), self.sasl.is_some()) {
            (false, false) => "plaintext",
            (true, false) => "ssl",
            (false, true) => "sasl_plaintext",
            (true, true) => "sasl_ssl",
        };
        c.set("security.protocol", protocol);
        if let Some(tls) = &self.tls {
            let files = [
                ("ssl.ca.location", &tls.ca_file),
                ("ssl.certificate.location", &tls.cert_file),
                ("ssl.key.location", &tls.key_file),
            ];
            for (key, file) in files {
                if let Some(f) = file {
                    c.set(key, f.display().to_string());
                }
            }
        }
        if let Some(sasl) = &self.sasl {
            let mechanism = match sasl.mechanism {
                SaslMechanism::Plain => "PLAIN",
                SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
                SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            };
            c.set("sasl.mechanism", mechanism).set("sasl.username", &sasl.username);
            if let Some(p) = &sasl.password {
                c.set("sasl.password", p.expose());
            }
        }
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        // librdkafka drops debug lines below the client's log level, which otherwise follows the
        // `log` crate (unused here); asking for `debug` contexts means wanting to see them.
        if self.properties.contains_key("debug") {
            c.set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
        }
        c
    }
}

/// Test connection for a cluster: read its metadata with `config` (a Kafka source's JSON).
pub async fn test_cluster(config: serde_json::Value) -> Result<String> {
    let config: KafkaConfig =
        serde_json::from_value(config).map_err(|e| Error::new(ErrorKind::Config, format!("connection: {e}")))?;
    probe(&config).await
}

/// The cluster's brokers and topics as `config` sees them; the topics it names that the
/// cluster lacks are an error.
pub async fn probe(config: &KafkaConfig) -> Result<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client: BaseConsumer = config.client_config("connection-test").create().map_err(client_config_error)?;
    let wanted = config.topics.clone();
    tokio::task::spawn_blocking(move || {
        let metadata = client
            .fetch_metadata(None, std::time::Duration::from_secs(10))
            .map_err(|e| Error::new(ErrorKind::Connect, format!("the brokers did not answer: {e}")))?;
        let topics: Vec<&str> = metadata.topics().iter().map(|t| t.name()).collect();
        let missing: Vec<&String> = wanted.iter().filter(|w| !topics.contains(&w.as_str())).collect();
        if !missing.is_empty() {
            return Err(Error::new(ErrorKind::Config, format!("the cluster has no topic {missing:?}")));
        }
        Ok(format!("{} broker(s), {} topic(s)", metadata.brokers().len(), topics.len()))
    })
    .await
    .map_err(|e| Error::new(ErrorKind::Fatal, format!("the metadata request failed: {e}")))?
}
