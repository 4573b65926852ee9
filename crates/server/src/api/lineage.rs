//! `GET /api/lineage`: where each table comes from and where it goes, from the live registry:
//! source (topic, Kinesis stream, Postgres table, push endpoint) → stream → table (in the
//! workspace or a destination) → sync → destination.
//!
//! Configs are read as their JSON (secrets are never serialized), so a new source or
//! destination kind shows up with its kind and location without a change here.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::{Value, json};
use sluice_connectors::StreamConfig;

use super::AppState;

#[derive(Default, Serialize)]
struct Graph {
    nodes: Vec<Node>,
    edges: Vec<Edge>,
    #[serde(skip)]
    seen: BTreeMap<String, usize>,
}

#[derive(Serialize)]
struct Node {
    id: String,
    /// `source`, `stream`, `table`, `sync` or `destination`.
    kind: &'static str,
    label: String,
    #[serde(skip_serializing_if = "Value::is_null")]
    details: Value,
}

#[derive(Serialize)]
struct Edge {
    from: String,
    to: String,
}

impl Graph {
    fn node(&mut self, id: String, kind: &'static str, label: String, details: Value) -> String {
        if !self.seen.contains_key(&id) {
            self.seen.insert(id.clone(), self.nodes.len());
            self.nodes.push(Node { id: id.clone(), kind, label, details });
        }
        id
    }

    fn edge(&mut self, from: &str, to: &str) {
        if !self.edges.iter().any(|e| e.from == from && e.to == to) {
            self.edges.push(Edge { from: from.to_string(), to: to.to_string() });
        }
    }
}

/// `GET /api/lineage`
pub async fn lineage(State(state): State<AppState>) -> Json<Value> {
    let mut graph = Graph::default();
    // Workspace tables by lower-case name, for matching sync queries.
    let mut workspace_tables: Vec<(String, String)> = Vec::new();
    for stream in state.supervisor.list().await {
        let config = &stream.config;
        let stream_id = graph.node(
            format!("stream:{}", config.name),
            "stream",
            config.name.clone(),
            json!({ "state": stream.metrics.snapshot().state }),
        );
        for (id, label, details) in sources(config) {
            let source = graph.node(id, "source", label, details);
            graph.edge(&source, &stream_id);
        }
        let table = match &config.destination {
            None => {
                workspace_tables.push((config.table.to_lowercase(), config.table.clone()));
                graph.node(
                    format!("table:workspace/{}", config.table),
                    "table",
                    config.table.clone(),
                    json!({ "in": "workspace" }),
                )
            }
            Some(destination) => {
                let (dest_id, dest_label, details) =
                    destination_node(&serde_json::to_value(destination).unwrap_or_default());
                let table = graph.node(
                    format!("table:{dest_id}/{}", config.table),
                    "table",
                    config.table.clone(),
                    json!({ "in": dest_label }),
                );
                let dest = graph.node(dest_id, "destination", dest_label, details);
                graph.edge(&table, &dest);
                table
            }
        };
        graph.edge(&stream_id, &table);
    }
    for sync in state.syncs.list().await {
        let config = &sync.config;
        let sync_id = graph.node(
            format!("sync:{}", config.name),
            "sync",
            config.name.clone(),
            json!({ "mode": config.mode, "query": config.query }),
        );
        for (_, table) in workspace_tables.iter().filter(|(lower, _)| mentions(&config.query, lower)) {
            graph.edge(&format!("table:workspace/{table}"), &sync_id);
        }
        let (dest_id, dest_label, details) =
            destination_node(&serde_json::to_value(&config.destination).unwrap_or_default());
        let dest = graph.node(dest_id, "destination", dest_label, details);
        graph.edge(&sync_id, &dest);
    }
    Json(json!({ "nodes": graph.nodes, "edges": graph.edges }))
}

/// The source nodes of a stream: one per topic, Postgres table, Kinesis stream or push endpoint.
fn sources(config: &StreamConfig) -> Vec<(String, String, Value)> {
    let source = serde_json::to_value(&config.source).unwrap_or_default();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    match source["type"].as_str().unwrap_or_default() {
        "http_push" => {
            let path = format!("/api/streams/{}/push", config.name);
            vec![(format!("push:{}", config.name), format!("POST {path}"), json!({ "type": "http_push" }))]
        }
        "kafka" => {
            let brokers = source["brokers"]
                .as_array()
                .map(|b| b.iter().map(text).collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            let mut out: Vec<(String, String, Value)> = source["topics"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    (
                        format!("kafka:{brokers}/{}", text(t)),
                        format!("topic {}", text(t)),
                        json!({ "type": "kafka", "brokers": brokers }),
                    )
                })
                .collect();
            if let Some(regex) = source["topic_regex"].as_str() {
                out.push((
                    format!("kafka:{brokers}/~{regex}"),
                    format!("topics ~ {regex}"),
                    json!({ "type": "kafka", "brokers": brokers }),
                ));
            }
            out
        }
        "kinesis" => {
            let name = text(&source["stream"]);
            vec![(format!("kinesis:{name}"), format!("Kinesis {name}"), json!({ "type": "kinesis" }))]
        }
        "postgres" => {
            let server = format!("{}/{}", text(&source["host"]), text(&source["database"]));
            let tables: Vec<String> = source["tables"].as_array().into_iter().flatten().map(text).collect();
            if tables.is_empty() {
                return vec![(
                    format!("postgres:{server}"),
                    format!("Postgres {server}"),
                    json!({ "type": "postgres" }),
                )];
            }
            tables
                .into_iter()
                .map(|t| {
                    (format!("postgres:{server}/{t}"), format!("Postgres {server} {t}"), json!({ "type": "postgres" }))
                })
                .collect()
        }
        other => vec![(format!("{other}:{}", config.name), other.to_string(), source.clone())],
    }
}

/// A destination's node: its kind and where it is, never a secret.
fn destination_node(config: &Value) -> (String, String, Value) {
    let kind = config["kind"].as_str().unwrap_or("destination").to_string();
    let place = ["path", "location", "url", "host"].iter().find_map(|k| config[*k].as_str()).unwrap_or_default();
    // A URL may carry a user and password; the password is already `***`, the host is enough.
    let place = match place.split_once("://") {
        Some((scheme, rest)) if kind == "http" => {
            format!("{scheme}://{}", rest.rsplit_once('@').map_or(rest, |(_, h)| h))
        }
        _ => place.to_string(),
    };
    let database = config["database"].as_str().map(|d| format!("/{d}")).unwrap_or_default();
    let where_ = format!("{place}{database}");
    let table = config["table"].as_str().or_else(|| config["name"].as_str()).unwrap_or_default();
    let label = if table.is_empty() { format!("{kind} {where_}") } else { format!("{kind} {where_} {table}") };
    (format!("destination:{kind}:{where_}:{table}"), label, json!({ "kind": kind, "table": table }))
}

/// Whether `query` names the table `lower` (lower case) as a word or a quoted identifier.
fn mentions(query: &str, lower: &str) -> bool {
    let query = query.to_lowercase();
    if query.contains(&format!("\"{}\"", lower.replace('"', "\"\""))) {
        return true;
    }
    let word = |c: char| c.is_alphanumeric() || c == '_';
    query.match_indices(lower).any(|(i, m)| {
        let before = query[..i].chars().next_back();
        let after = query[i + m.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_mentions_a_table_as_a_word_or_quoted() {
        assert!(mentions("SELECT * FROM clicks", "clicks"));
        assert!(mentions("select * from \"Clicks\" c", "clicks"));
        assert!(mentions("SELECT a FROM main.clicks WHERE x", "clicks"));
        assert!(!mentions("SELECT * FROM clicks_daily", "clicks"));
        assert!(!mentions("SELECT * FROM myclicks", "clicks"));
    }

    #[test]
    fn a_destination_node_shows_no_password() {
        let (_, label, _) = destination_node(&json!({ "kind": "http", "url": "https://u:***@api.example.com/in" }));
        assert_eq!(label, "http https://api.example.com/in");
        let (id, label, _) = destination_node(&json!({ "kind": "sqlite", "path": "/d/app.db", "table": "t" }));
        assert_eq!((id.as_str(), label.as_str()), ("destination:sqlite:/d/app.db:t", "sqlite /d/app.db t"));
    }
}
