//! The bench's printed report.

use std::fmt;
use std::time::Duration;

/// What one bench run measured.
pub struct Report {
    pub events: usize,
    pub bytes: usize,
    pub misfits: usize,
    pub duckdb_rows: u64,
    /// DuckDB's default `read_json_auto` (schema from a sample): seconds, or why it failed.
    pub duckdb_default: Result<f64, String>,
    pub duckdb_secs: f64,
    pub sluice_secs: f64,
    pub throughput_push_latencies: Vec<Duration>,
    pub latency_rate: usize,
    pub latency_events: usize,
    pub latency: Vec<Duration>,
    pub peak_rss_kib: u64,
    pub clients: usize,
    pub batch: usize,
}

fn pct(samples: &[Duration], p: f64) -> f64 {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return 0.0;
    }
    ms[((ms.len() - 1) as f64 * p).round() as usize]
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = self.bytes as f64 / 1e6;
        let sluice_eps = self.events as f64 / self.sluice_secs;
        let duckdb_eps = self.duckdb_rows as f64 / self.duckdb_secs;
        writeln!(
            f,
            "events: {} ({:.1} MB NDJSON, {:.0} B/event, {} misfit values)",
            self.events,
            mb,
            self.bytes as f64 / self.events as f64,
            self.misfits
        )?;
        writeln!(f, "| run | events/s | MB/s | p50 ms | p99 ms |")?;
        writeln!(f, "|---|---|---|---|---|")?;
        match &self.duckdb_default {
            Ok(secs) => writeln!(
                f,
                "| DuckDB read_json_auto, default sampling | {:.0} | {:.1} | - | - |",
                self.events as f64 / secs,
                mb / secs
            )?,
            Err(e) => writeln!(
                f,
                "| DuckDB read_json_auto, default sampling | failed: {} | - | - | - |",
                e.replace('|', "/")
            )?,
        }
        writeln!(
            f,
            "| DuckDB read_json_auto, sample_size=-1 (the limit) | {:.0} | {:.1} | - | - |",
            duckdb_eps,
            mb / self.duckdb_secs
        )?;
        writeln!(
            f,
            "| Sluice push, {} clients x {} events/request | {:.0} | {:.1} | {:.1} | {:.1} |",
            self.clients,
            self.batch,
            sluice_eps,
            mb / self.sluice_secs,
            pct(&self.throughput_push_latencies, 0.5),
            pct(&self.throughput_push_latencies, 0.99)
        )?;
        writeln!(
            f,
            "| Sluice push at {} events/s offered ({} events), push→queryable | {:.0} | - | {:.1} | {:.1} |",
            self.latency_rate,
            self.latency_events,
            self.latency_rate,
            pct(&self.latency, 0.5),
            pct(&self.latency, 0.99)
        )?;
        writeln!(f, "ratio Sluice / DuckDB load: {:.2}", sluice_eps / duckdb_eps)?;
        write!(f, "peak RSS of the server: {:.0} MiB", self.peak_rss_kib as f64 / 1024.0)
    }
}
