//! Named connections: a Postgres or MySQL server, a Kafka cluster or an AWS account, defined
//! once and named by streams and syncs (`"source": {"type": "postgres", "connection": "prod",
//! "tables": [...]}`).
//!
//! A connection gives the fields it holds to each config that names it, at the JSON level,
//! before the config is read into its type ([`fill`]): those fields are the connection's, and a
//! config that sets one to another value is refused, naming the field (it names another
//! connection, or one without that field, instead). What is stored with a stream or sync is
//! its config without them ([`strip`]), so a changed connection (a rotated password, another
//! host) reaches every user when it is filled in again.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sluice_core::secret::{keep, restore};
use sluice_core::{Error, ErrorKind, Result, Secret};

use crate::kafka::{SaslConfig, TlsConfig};
use crate::postgres::{Check, SslMode};

/// A named connection. The `kind` field picks the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ConnectionConfig {
    /// A PostgreSQL server, for Postgres sources and destinations.
    Postgres(ServerConnection),
    /// A MySQL or MariaDB server, for MySQL destinations.
    Mysql(ServerConnection),
    /// A Kafka cluster, for Kafka sources.
    Kafka(KafkaConnection),
    /// An AWS account, for Kinesis sources and `s3://` file locations.
    Aws(AwsConnection),
}

/// A database server and the login to use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerConnection {
    /// Unique name, which streams and syncs give as `connection`. Letters, digits, `_` and `-`.
    pub name: String,
    /// Host name or address.
    pub host: String,
    /// Port; the kind's usual one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Database, when every user of the connection uses the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// User.
    pub user: String,
    /// Password; never serialized back.
    #[serde(default, skip_serializing)]
    pub password: Option<Secret>,
    /// Postgres: `disable`, `prefer`, `require`, `verify-ca` or `verify-full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sslmode: Option<SslMode>,
    /// Postgres: the CA certificate (PEM) for `verify-ca` and `verify-full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sslrootcert: Option<PathBuf>,
}

/// A Kafka cluster: its brokers and how to log in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaConnection {
    /// Unique name, which streams give as `connection`.
    pub name: String,
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// TLS files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// SASL authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<SaslConfig>,
}

/// An AWS account: a region, an endpoint (an emulator, a VPC endpoint) and an access key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AwsConnection {
    /// Unique name, which streams and syncs give as `connection`.
    pub name: String,
    /// Region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Endpoint URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Access key id; without it the default provider chain is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    /// Secret access key; never serialized back.
    #[serde(default, skip_serializing)]
    pub secret_access_key: Option<Secret>,
    /// Session token, for temporary credentials; never serialized back.
    #[serde(default, skip_serializing)]
    pub session_token: Option<Secret>,
}

impl ConnectionConfig {
    /// The connection's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Postgres(c) | Self::Mysql(c) => &c.name,
            Self::Kafka(c) => &c.name,
            Self::Aws(c) => &c.name,
        }
    }

    /// The kind: `postgres`, `mysql`, `kafka` or `aws`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "postgres",
            Self::Mysql(_) => "mysql",
            Self::Kafka(_) => "kafka",
            Self::Aws(_) => "aws",
        }
    }

    /// Check every field; pure. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        let name = self.name();
        if name.is_empty()
            || name.len() > 64
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(Error::config("name", "must be 1-64 letters, digits, '_' or '-'"));
        }
        match self {
            Self::Postgres(c) | Self::Mysql(c) if c.host.trim().is_empty() => {
                Err(Error::config("host", "must not be empty"))
            }
            Self::Mysql(c) if c.sslmode.is_some() || c.sslrootcert.is_some() => {
                Err(Error::config("sslmode", "is a Postgres setting; a MySQL connection has none"))
            }
            Self::Kafka(c) if c.brokers.is_empty() => Err(Error::config("brokers", "must name at least one broker")),
            _ => Ok(()),
        }
    }

    /// The secrets, by field path, to keep apart from the stored config.
    pub fn secrets(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        match self {
            Self::Postgres(c) | Self::Mysql(c) => keep(&mut out, "password", c.password.as_ref()),
            Self::Kafka(c) => keep(&mut out, "sasl.password", c.sasl.as_ref().and_then(|s| s.password.as_ref())),
            Self::Aws(c) => {
                keep(&mut out, "secret_access_key", c.secret_access_key.as_ref());
                keep(&mut out, "session_token", c.session_token.as_ref());
            }
        }
        out
    }

    /// Put back the stored secrets a config read from storage (or sent without them) lacks.
    pub fn restore_secrets(&mut self, secrets: &BTreeMap<String, String>) {
        match self {
            Self::Postgres(c) | Self::Mysql(c) => restore(&mut c.password, secrets, "password"),
            Self::Kafka(c) => {
                if let Some(sasl) = c.sasl.as_mut() {
                    restore(&mut sasl.password, secrets, "sasl.password");
                }
            }
            Self::Aws(c) => {
                restore(&mut c.secret_access_key, secrets, "secret_access_key");
                restore(&mut c.session_token, secrets, "session_token");
            }
        }
    }

    /// The fields this connection gives to `target`, a source (`place` "source", tagged by
    /// `type`) or a destination ("destination", tagged by `kind`), secrets in clear; an error
    /// when the two do not go together.
    fn provides(&self, place: &str, target: &Map<String, Value>) -> Result<Map<String, Value>> {
        let tag = if place == "source" { "type" } else { "kind" };
        let user = target.get(tag).and_then(Value::as_str).unwrap_or_default();
        let secret = |s: &Option<Secret>| s.as_ref().map(|s| Value::String(s.expose().to_string()));
        let mut out = Map::new();
        let mut put = |key: &str, value: Option<Value>| {
            if let Some(v) = value.filter(|v| !v.is_null()) {
                out.insert(key.to_string(), v);
            }
        };
        match (self, user) {
            // Fields with a default are always given (the default when the connection has
            // none): a config read into its type holds them, so one the connection did not
            // give would be stored as the user's own and clash with a later change.
            (Self::Postgres(c), "postgres") | (Self::Mysql(c), "mysql") => {
                let postgres = user == "postgres";
                put("host", Some(json!(c.host)));
                put("port", Some(json!(c.port.unwrap_or(if postgres { 5432 } else { 3306 }))));
                put("database", c.database.as_ref().map(|d| json!(d)));
                put("user", Some(json!(c.user)));
                put("password", secret(&c.password));
                if postgres {
                    put("sslmode", Some(json!(c.sslmode.unwrap_or_default())));
                    put("sslrootcert", c.sslrootcert.as_ref().map(|p| json!(p)));
                }
            }
            (Self::Kafka(c), "kafka") if place == "source" => {
                put("brokers", Some(json!(c.brokers)));
                put("tls", c.tls.as_ref().map(|t| json!(t)));
                if let Some(sasl) = &c.sasl {
                    let mut v = json!(sasl);
                    if let Some(p) = secret(&sasl.password) {
                        v["password"] = p;
                    }
                    put("sasl", Some(v));
                }
            }
            (Self::Aws(c), "kinesis") if place == "source" => {
                refuse_own_endpoint(target.get("endpoint"), place, self.name())?;
                put("region", c.region.as_ref().map(|r| json!(r)));
                put("endpoint", c.endpoint.as_ref().map(|e| json!(e)));
                if let Some(id) = &c.access_key_id {
                    let mut credentials = json!({ "access_key_id": id });
                    if let Some(s) = secret(&c.secret_access_key) {
                        credentials["secret_access_key"] = s;
                    }
                    if let Some(s) = secret(&c.session_token) {
                        credentials["session_token"] = s;
                    }
                    put("credentials", Some(credentials));
                }
            }
            (Self::Aws(c), "files") if place == "destination" => {
                let location = target.get("location").and_then(Value::as_str).unwrap_or_default();
                if !location.starts_with("s3://") {
                    return Err(Error::config(
                        "destination.connection",
                        format!("an aws connection serves s3:// locations, not '{location}'"),
                    ));
                }
                refuse_own_endpoint(target.get("s3").and_then(|s| s.get("endpoint")), place, self.name())?;
                let mut s3 = Map::new();
                for (key, value) in [
                    ("endpoint", c.endpoint.as_ref().map(|e| json!(e))),
                    ("region", Some(json!(c.region.clone().unwrap_or_else(crate::files::default_region)))),
                    ("access_key_id", c.access_key_id.as_ref().map(|a| json!(a))),
                    ("secret_access_key", secret(&c.secret_access_key)),
                ] {
                    if let Some(v) = value {
                        s3.insert(key.into(), v);
                    }
                }
                put("s3", Some(Value::Object(s3)));
            }
            _ => {
                let what = if user.is_empty() { format!("this {place}") } else { format!("a {user} {place}") };
                return Err(Error::config(
                    &format!("{place}.connection"),
                    format!(
                        "'{}' is a {} connection, which {what} cannot use (postgres: Postgres sources and \
                         destinations; mysql: MySQL destinations; kafka: Kafka sources; aws: Kinesis sources \
                         and files destinations)",
                        self.name(),
                        self.kind()
                    ),
                ));
            }
        }
        Ok(out)
    }
}

/// An AWS connection's credentials go only where it says: a config that names it cannot send
/// them to an endpoint of its own.
fn refuse_own_endpoint(endpoint: Option<&Value>, place: &str, connection: &str) -> Result<()> {
    match endpoint {
        Some(v) if !v.is_null() => Err(Error::config(
            &format!("{place}.connection"),
            format!("connection '{connection}' holds credentials, so the endpoint is its own; set it there"),
        )),
        _ => Ok(()),
    }
}

/// The places of a stream or sync config that may name a connection.
const PLACES: [&str; 2] = ["source", "destination"];

/// The connections `config` (a stream's or a sync's JSON) names.
pub fn named_in(config: &Value) -> Vec<String> {
    PLACES.iter().filter_map(|p| config.get(p)?.get("connection")?.as_str().map(str::to_string)).collect()
}

/// Fill in what each connection `config` names gives; `lookup` finds a connection by name.
/// An unknown name, a connection of another kind, or a field set to another value than the
/// connection's is an error naming the field.
pub fn fill(config: &mut Value, lookup: impl Fn(&str) -> Option<ConnectionConfig>) -> Result<()> {
    for place in PLACES {
        let Some(Value::Object(target)) = config.get_mut(place) else { continue };
        let Some(name) = target.get("connection") else { continue };
        let Some(name) = name.as_str() else {
            return Err(Error::config(&format!("{place}.connection"), "must be a connection's name"));
        };
        let connection = lookup(name).ok_or_else(|| {
            Error::config(&format!("{place}.connection"), format!("there is no connection named '{name}'"))
        })?;
        let given = connection.provides(place, target)?;
        merge(target, given, place, connection.name())?;
    }
    Ok(())
}

/// Take out of `config` (serialized) and its `secrets` what the connections it names give, so
/// that what is stored is the config's own part.
pub fn strip(
    config: &mut Value,
    secrets: &mut BTreeMap<String, String>,
    lookup: impl Fn(&str) -> Option<ConnectionConfig>,
) {
    for place in PLACES {
        let Some(Value::Object(target)) = config.get_mut(place) else { continue };
        let Some(connection) = target.get("connection").and_then(Value::as_str).and_then(&lookup) else { continue };
        let Ok(given) = connection.provides(place, target) else { continue };
        for (path, _) in leaves(place, &Value::Object(given.clone())) {
            secrets.remove(&path);
        }
        remove_given(target, &given);
    }
}

fn merge(target: &mut Map<String, Value>, given: Map<String, Value>, path: &str, connection: &str) -> Result<()> {
    for (key, value) in given {
        let at = format!("{path}.{key}");
        match (target.get_mut(&key), value) {
            (None, value) => {
                target.insert(key, value);
            }
            (Some(Value::Object(mine)), Value::Object(theirs)) => merge(mine, theirs, &at, connection)?,
            (Some(mine), theirs) if *mine == theirs => {}
            (Some(_), _) => {
                return Err(Error::config(
                    &at,
                    format!(
                        "connection '{connection}' gives this field; leave it out, or name a connection without it"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn remove_given(target: &mut Map<String, Value>, given: &Map<String, Value>) {
    for (key, value) in given {
        let gone = match (target.get_mut(key), value) {
            (Some(Value::Object(mine)), Value::Object(theirs)) => {
                remove_given(mine, theirs);
                mine.is_empty()
            }
            (Some(_), _) => true,
            (None, _) => false,
        };
        if gone {
            target.remove(key);
        }
    }
}

/// Every leaf of `value` with its dotted path under `prefix`.
fn leaves(prefix: &str, value: &Value) -> Vec<(String, Value)> {
    match value {
        Value::Object(map) => map.iter().flat_map(|(k, v)| leaves(&format!("{prefix}.{k}"), v)).collect(),
        other => vec![(prefix.to_string(), other.clone())],
    }
}

/// Test a connection: log in, and say what was found.
pub async fn test_connection(connection: &ConnectionConfig) -> Vec<Check> {
    // The consumer's own config, filled from the connection, and the consumer's own check.
    let probe = |place: &str, user: Value| -> Result<Value> {
        let mut wrapped = Value::Object(Map::from_iter([(place.to_string(), user)]));
        fill(&mut wrapped, |_| Some(connection.clone()))?;
        let mut config = wrapped[place].take();
        // A source's own type reads it, without the enum's tag.
        if place == "source"
            && let Some(fields) = config.as_object_mut()
        {
            fields.remove("type");
        }
        Ok(config)
    };
    let result: Result<String> = async {
        match connection {
            ConnectionConfig::Postgres(_) | ConnectionConfig::Mysql(_) => {
                let kind = connection.kind();
                let mut config = probe(
                    "destination",
                    json!({ "kind": kind, "connection": connection.name(), "table": "sluice_test" }),
                )?;
                // A connection without a database logs in to one every user may open.
                let database = if kind == "postgres" { "postgres" } else { "information_schema" };
                if let Some(fields) = config.as_object_mut() {
                    fields.entry("database").or_insert(json!(database));
                }
                let destination: crate::DestinationConfig = serde_json::from_value(config)
                    .map_err(|e| Error::new(ErrorKind::Config, format!("connection: {e}")))?;
                crate::build_destination(&destination)?.check().await?;
                Ok(format!("logged in to the {kind} server; it takes writes"))
            }
            ConnectionConfig::Kafka(_) => {
                let config = probe("source", json!({ "type": "kafka", "connection": connection.name() }))?;
                crate::kafka::test_cluster(config).await
            }
            ConnectionConfig::Aws(_) => {
                let config = probe(
                    "source",
                    json!({ "type": "kinesis", "connection": connection.name(), "stream": "sluice_test" }),
                )?;
                crate::kinesis::test_account(config).await
            }
        }
    }
    .await;
    vec![match result {
        Ok(message) => Check { name: "connect", ok: true, message },
        Err(e) => Check { name: "connect", ok: false, message: e.to_string() },
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg() -> ConnectionConfig {
        serde_json::from_value(json!({"kind": "postgres", "name": "prod", "host": "db", "user": "etl",
            "password": "s3cret", "database": "app"}))
        .unwrap()
    }

    #[test]
    fn a_connection_fills_its_fields_and_strip_takes_them_back() {
        let mut stream = json!({"name": "s", "table": "t",
            "source": {"type": "postgres", "connection": "prod", "tables": ["public.a"], "host": "db"}});
        fill(&mut stream, |n| (n == "prod").then(pg)).unwrap();
        let source = &stream["source"];
        assert_eq!((source["host"].as_str(), source["user"].as_str()), (Some("db"), Some("etl")));
        assert_eq!((source["database"].as_str(), source["password"].as_str()), (Some("app"), Some("s3cret")));
        let mut secrets = BTreeMap::from([("source.password".to_string(), "s3cret".to_string())]);
        strip(&mut stream, &mut secrets, |n| (n == "prod").then(pg));
        assert!(secrets.is_empty(), "{secrets:?}");
        assert_eq!(stream["source"], json!({"type": "postgres", "connection": "prod", "tables": ["public.a"]}));
    }

    #[test]
    fn a_config_read_into_its_type_and_stripped_keeps_only_its_own_fields() {
        let mut stream = json!({"name": "s", "table": "t",
            "source": {"type": "postgres", "connection": "prod", "tables": ["public.a"]}});
        fill(&mut stream, |_| Some(pg())).unwrap();
        let config: crate::StreamConfig = serde_json::from_value(stream).unwrap();
        let (mut stored, mut secrets) = (serde_json::to_value(&config).unwrap(), config.secrets());
        strip(&mut stored, &mut secrets, |_| Some(pg()));
        let own = stored["source"].as_object().unwrap();
        for given in ["host", "port", "database", "user", "sslmode"] {
            assert!(!own.contains_key(given), "{given} is the connection's: {stored}");
        }
        assert!(secrets.is_empty(), "{secrets:?}");
    }

    #[test]
    fn credentials_go_to_the_connections_endpoint_only() {
        let aws: ConnectionConfig = serde_json::from_value(
            json!({"kind": "aws", "name": "acct", "access_key_id": "AK", "secret_access_key": "SK"}),
        )
        .unwrap();
        let mut own = json!({"source": {"type": "kinesis", "connection": "acct", "stream": "s",
                                        "endpoint": "http://attacker.example"}});
        assert!(fill(&mut own, |_| Some(aws.clone())).unwrap_err().to_string().contains("endpoint"));
        let mut local = json!({"destination": {"kind": "files", "connection": "acct", "location": "/tmp/x"}});
        assert!(fill(&mut local, |_| Some(aws.clone())).unwrap_err().to_string().contains("s3://"));
    }

    #[test]
    fn a_field_the_connection_gives_cannot_be_set_to_another_value() {
        let mut stream = json!({"source": {"type": "postgres", "connection": "prod", "database": "other"}});
        let e = fill(&mut stream, |_| Some(pg())).unwrap_err().to_string();
        assert!(e.starts_with("source.database:") && e.contains("'prod'"), "{e}");
    }

    #[test]
    fn an_unknown_or_unfitting_connection_names_the_field() {
        let mut stream = json!({"source": {"type": "postgres", "connection": "nope"}});
        let e = fill(&mut stream, |_| None).unwrap_err().to_string();
        assert!(e.contains("source.connection") && e.contains("nope"), "{e}");
        let mut sync = json!({"destination": {"kind": "mysql", "connection": "prod"}});
        let e = fill(&mut sync, |_| Some(pg())).unwrap_err().to_string();
        assert!(e.contains("destination.connection") && e.contains("postgres connection"), "{e}");
    }

    #[test]
    fn an_aws_account_fills_a_kinesis_source_and_an_s3_location() {
        let aws: ConnectionConfig =
            serde_json::from_value(json!({"kind": "aws", "name": "acct", "region": "eu-west-1",
            "endpoint": "http://127.0.0.1:4566", "access_key_id": "AK", "secret_access_key": "SK"}))
            .unwrap();
        let mut config = json!({"source": {"type": "kinesis", "connection": "acct", "stream": "s"},
            "destination": {"kind": "files", "connection": "acct", "location": "s3://b/p", "s3": {"region": "eu-west-1"}}});
        fill(&mut config, |_| Some(aws.clone())).unwrap();
        assert_eq!(config["source"]["credentials"]["secret_access_key"], "SK");
        assert_eq!(config["destination"]["s3"]["endpoint"], "http://127.0.0.1:4566");
        assert_eq!(config["destination"]["s3"]["access_key_id"], "AK");
        assert_eq!(named_in(&config), ["acct", "acct"]);
    }
}
