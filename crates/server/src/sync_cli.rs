//! `sluice sync …`: list, run, preview and show runs, through the running server's API, with
//! `SLUICE_TOKEN` or the data dir's `admin.token`.

use std::net::SocketAddr;
use std::path::Path;

use clap::Subcommand;
use comfy_table::Table;
use serde_json::Value;

/// What `sluice sync` does.
#[derive(Subcommand)]
pub enum SyncCommand {
    /// List the syncs.
    List,
    /// Run a sync now and wait for it to end.
    Run {
        /// The sync's name.
        name: String,
        /// Print the run id and return at once.
        #[arg(long)]
        no_wait: bool,
    },
    /// Show what the next run would send, without sending anything.
    Preview {
        /// The sync's name.
        name: String,
    },
    /// Show the newest runs.
    Runs {
        /// The sync's name.
        name: String,
    },
}

/// Run a `sluice sync` command against the server at `server`.
pub async fn run(command: SyncCommand, server: SocketAddr, data_dir: &Path) -> Result<(), String> {
    let base = format!("http://{server}/api/syncs");
    let client = Client { http: reqwest::Client::new(), server, data_dir };
    match command {
        SyncCommand::List => {
            let body = client.call(reqwest::Method::GET, base.clone()).await?;
            let mut table = Table::new();
            table.set_header(["name", "mode", "destination", "schedule", "next run"]);
            for sync in body["syncs"].as_array().into_iter().flatten() {
                let config = &sync["config"];
                table.add_row([
                    text(&config["name"]),
                    text(&config["mode"]),
                    text(&config["destination"]["kind"]),
                    text(&config["schedule"]["cron"]),
                    text(&sync["next_run_at"]),
                ]);
            }
            println!("{table}");
        }
        SyncCommand::Run { name, no_wait } => {
            let wait = if no_wait { "?trigger=manual" } else { "?trigger=manual&wait_seconds=3600" };
            let body = client.call(reqwest::Method::POST, format!("{base}/{name}/runs{wait}")).await?;
            println!("{}", serde_json::to_string_pretty(&body).map_err(|e| e.to_string())?);
            if body["status"] == "failed" {
                return Err(format!("run {} failed: {}", text(&body["id"]), text(&body["error"])));
            }
        }
        SyncCommand::Preview { name } => {
            let body = client.call(reqwest::Method::GET, format!("{base}/{name}/preview")).await?;
            println!(
                "{} rows in the result: {} to insert, {} to update, {} to delete (change detection {} ms)",
                body["total"], body["inserted"], body["updated"], body["deleted"], body["detect_ms"]
            );
            println!("{}", serde_json::to_string_pretty(&body["sample"]).map_err(|e| e.to_string())?);
        }
        SyncCommand::Runs { name } => {
            let body = client.call(reqwest::Method::GET, format!("{base}/{name}/runs")).await?;
            let mut table = Table::new();
            table.set_header(["run", "trigger", "status", "started", "ms", "sent", "ins", "upd", "del", "error"]);
            for run in body["runs"].as_array().into_iter().flatten() {
                table.add_row(
                    [
                        "id",
                        "trigger",
                        "status",
                        "started_at",
                        "duration_ms",
                        "rows_sent",
                        "inserted",
                        "updated",
                        "deleted",
                        "error",
                    ]
                    .map(|k| text(&run[k])),
                );
            }
            println!("{table}");
        }
    }
    Ok(())
}

/// The server, and where its token is.
struct Client<'a> {
    http: reqwest::Client,
    server: SocketAddr,
    data_dir: &'a Path,
}

impl Client<'_> {
    async fn call(&self, method: reqwest::Method, url: String) -> Result<Value, String> {
        let server = self.server;
        let mut request = self.http.request(method, url);
        if let Some(token) = crate::auth::setup::cli_token(self.data_dir) {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| {
            if e.is_connect() {
                format!("no Sluice server at {server} (start it with `sluice serve`)")
            } else {
                e.to_string()
            }
        })?;
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(crate::auth::setup::cli_hint(self.data_dir));
        }
        let body: Value = response.json().await.map_err(|e| format!("server at {server}: {e}"))?;
        if !status.is_success() {
            return Err(body["error"].as_str().unwrap_or("request failed").to_string());
        }
        Ok(body)
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}
