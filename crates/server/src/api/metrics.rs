//! Metrics: JSON per stream and for all, and Prometheus text.

use std::collections::HashMap;
use std::fmt::Write;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Map, Value, json};
use sluice_connectors::workspace::RunSummary;
use sluice_core::MetricsSnapshot;

use super::{ApiError, AppState};

/// `GET /api/streams/:id/metrics`: each call is a check, reporting the records processed since
/// the previous call for this stream (`records_since_last_check`) and when that was
/// (`last_check`). The other readers of metrics take snapshots and leave the check alone.
pub async fn stream(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<MetricsSnapshot>, ApiError> {
    let stream = super::running_stream(&state, &id).await?;
    Ok(Json(stream.metrics.check()))
}

/// `GET /api/metrics`
pub async fn all(State(state): State<AppState>) -> Json<Value> {
    let mut streams = Map::new();
    for s in state.supervisor.list().await {
        streams.insert(s.config.name.clone(), json!(s.metrics.snapshot()));
    }
    Json(json!({ "streams": streams }))
}

/// `GET /metrics`: Prometheus text exposition.
pub async fn prometheus(State(state): State<AppState>) -> impl IntoResponse {
    let snapshots: Vec<(String, MetricsSnapshot)> =
        state.supervisor.list().await.iter().map(|s| (s.config.name.clone(), s.metrics.snapshot())).collect();
    let mut text = render(&snapshots);
    let summaries = state.syncs.registry().run_summaries().await.unwrap_or_default();
    let names: Vec<String> = state.syncs.list().await.iter().map(|e| e.config.name.clone()).collect();
    render_syncs(&mut text, &names, &summaries);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// Reverse ETL syncs: run counts and the last finished run of each.
fn render_syncs(out: &mut String, names: &[String], runs: &HashMap<String, RunSummary>) {
    let none = RunSummary::default();
    let _ =
        writeln!(out, "# HELP sluice_sync_runs_total Finished runs by status.\n# TYPE sluice_sync_runs_total counter");
    for name in names {
        let r = runs.get(name).unwrap_or(&none);
        let sync = escape(name);
        let _ = writeln!(out, "sluice_sync_runs_total{{sync=\"{sync}\",status=\"succeeded\"}} {}", r.succeeded);
        let _ = writeln!(out, "sluice_sync_runs_total{{sync=\"{sync}\",status=\"failed\"}} {}", r.failed);
    }
    type Get = fn(&RunSummary) -> Option<f64>;
    let gauges: [(&str, &str, Get); 4] = [
        ("sluice_sync_last_run_success", "1 if the last finished run succeeded.", |r| {
            r.last_ok.map(|ok| f64::from(u8::from(ok)))
        }),
        ("sluice_sync_last_run_duration_seconds", "Duration of the last finished run.", |r| {
            r.last_duration_ms.map(|ms| ms as f64 / 1000.0)
        }),
        ("sluice_sync_last_run_rows_sent", "Rows and deletes the last finished run sent.", |r| {
            r.last_rows_sent.map(|n| n as f64)
        }),
        ("sluice_sync_last_success_timestamp_seconds", "When the last successful run finished.", |r| {
            r.last_success_epoch
        }),
    ];
    for (family, help, get) in gauges {
        let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} gauge");
        for name in names {
            if let Some(v) = runs.get(name).and_then(get) {
                let _ = writeln!(out, "{family}{{sync=\"{}\"}} {v}", escape(name));
            }
        }
    }
}

type Getter = fn(&MetricsSnapshot) -> f64;

fn render(streams: &[(String, MetricsSnapshot)]) -> String {
    let families: [(&str, &str, &str, Getter); 15] = [
        ("sluice_stream_events_in_total", "counter", "Events received.", |m| m.events_in as f64),
        ("sluice_stream_rows_written_total", "counter", "Rows written to tables.", |m| m.rows_written as f64),
        ("sluice_stream_rejects_total", "counter", "Rows added to the rejects ledger.", |m| m.rejects as f64),
        ("sluice_stream_filtered_total", "counter", "Events a transform's filter skipped.", |m| m.filtered as f64),
        ("sluice_stream_bytes_in_total", "counter", "Payload bytes received.", |m| m.bytes_in as f64),
        ("sluice_stream_batches_total", "counter", "Batches committed.", |m| m.batches as f64),
        ("sluice_stream_messages_per_second", "gauge", "Events per second over the last 10 s.", |m| m.messages_per_sec),
        ("sluice_stream_up", "gauge", "1 while the stream runs.", |m| f64::from(u8::from(m.state == "running"))),
        ("sluice_stream_latency_last_seconds", "gauge", "Receive-to-commit latency of the latest chunk.", |m| {
            m.latency_ms.now / 1000.0
        }),
        ("sluice_stream_latency_p50_seconds", "gauge", "Receive-to-commit latency, p50 of recent chunks.", |m| {
            m.latency_ms.p50 / 1000.0
        }),
        ("sluice_stream_latency_p99_seconds", "gauge", "Receive-to-commit latency, p99 of recent chunks.", |m| {
            m.latency_ms.p99 / 1000.0
        }),
        ("sluice_stream_latency_max_seconds", "gauge", "Largest receive-to-commit latency since start.", |m| {
            m.latency_ms.max / 1000.0
        }),
        ("sluice_stream_lag_total_messages", "gauge", "Messages behind the source, all partitions.", |m| {
            m.lag_messages as f64
        }),
        ("sluice_stream_max_lag_messages", "gauge", "Largest total lag since start.", |m| m.max_lag_messages as f64),
        ("sluice_stream_max_lag_seconds", "gauge", "Largest per-partition lag in seconds since start.", |m| {
            m.max_lag_seconds
        }),
    ];
    let mut out = String::new();
    for (name, kind, help, get) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (stream, m) in streams {
            let _ = writeln!(out, "{name}{{stream=\"{}\"}} {}", escape(stream), get(m));
        }
    }
    type LagGetter = fn(&sluice_core::Lag) -> Option<f64>;
    let per_partition: [(&str, &str, LagGetter); 2] = [
        (
            "sluice_stream_lag_messages",
            "Messages behind the source on one partition (high watermark minus position).",
            |l| l.messages.map(|m| m as f64),
        ),
        (
            "sluice_stream_lag_seconds",
            "Seconds behind the newest record, per partition or shard (Kinesis: MillisBehindLatest).",
            |l| Some(l.age_seconds),
        ),
    ];
    for (name, help, get) in per_partition {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (stream, m) in streams {
            for (partition, lag) in &m.lag {
                let Some(value) = get(lag) else { continue };
                let _ = writeln!(
                    out,
                    "{name}{{stream=\"{}\",partition=\"{}\"}} {}",
                    escape(stream),
                    escape(partition),
                    value
                );
            }
        }
    }
    type Gauges = fn(&MetricsSnapshot) -> &std::collections::BTreeMap<&'static str, f64>;
    let groups: [(&str, &str, Gauges); 2] =
        [("source", "Source-specific", |m| &m.source), ("destination", "Stream destination", |m| &m.destination)];
    for (prefix, help, gauges) in groups {
        let mut names: Vec<&str> = streams.iter().flat_map(|(_, m)| gauges(m).keys().copied()).collect();
        names.sort_unstable();
        names.dedup();
        for key in names {
            let name = format!("sluice_stream_{prefix}_{key}");
            let _ = writeln!(out, "# HELP {name} {help}: {key}.\n# TYPE {name} gauge");
            for (stream, m) in streams {
                if let Some(v) = gauges(m).get(key) {
                    let _ = writeln!(out, "{name}{{stream=\"{}\"}} {v}", escape(stream));
                }
            }
        }
    }
    let _ =
        writeln!(out, "# HELP sluice_stream_last_event_timestamp_seconds Receive time of the newest committed event.");
    let _ = writeln!(out, "# TYPE sluice_stream_last_event_timestamp_seconds gauge");
    for (stream, m) in streams {
        if let Some(t) = m.last_event_time.as_deref().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) {
            let secs = t.timestamp_micros() as f64 / 1e6;
            let _ = writeln!(out, "sluice_stream_last_event_timestamp_seconds{{stream=\"{}\"}} {secs}", escape(stream));
        }
    }
    out
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
