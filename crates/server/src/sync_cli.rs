//! `sluice sync …`: list, run, preview and show runs, through the running server's API.

use std::net::SocketAddr;

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
pub async fn run(command: SyncCommand, server: SocketAddr) -> Result<(), String> {
    let base = format!("http://{server}/api/syncs");
    match command {
        SyncCommand::List => {
            let body = call(reqwest::Client::new().get(&base), server).await?;
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
            let body = call(reqwest::Client::new().post(format!("{base}/{name}/runs{wait}")), server).await?;
            println!("{}", serde_json::to_string_pretty(&body).map_err(|e| e.to_string())?);
            if body["status"] == "failed" {
                return Err(format!("run {} failed: {}", text(&body["id"]), text(&body["error"])));
            }
        }
        SyncCommand::Preview { name } => {
            let body = call(reqwest::Client::new().get(format!("{base}/{name}/preview")), server).await?;
            println!(
                "{} rows in the result: {} to insert, {} to update, {} to delete (change detection {} ms)",
                body["total"], body["inserted"], body["updated"], body["deleted"], body["detect_ms"]
            );
            println!("{}", serde_json::to_string_pretty(&body["sample"]).map_err(|e| e.to_string())?);
        }
        SyncCommand::Runs { name } => {
            let body = call(reqwest::Client::new().get(format!("{base}/{name}/runs")), server).await?;
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

async fn call(request: reqwest::RequestBuilder, server: SocketAddr) -> Result<Value, String> {
    let response = request.send().await.map_err(|e| {
        if e.is_connect() {
            format!("no Sluice server at {server} (start it with `sluice serve`)")
        } else {
            e.to_string()
        }
    })?;
    let status = response.status();
    let body: Value = response.json().await.map_err(|e| format!("server at {server}: {e}"))?;
    if !status.is_success() {
        return Err(body["error"].as_str().unwrap_or("request failed").to_string());
    }
    Ok(body)
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}
