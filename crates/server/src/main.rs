//! `sluice`: one binary that moves data in real time.

mod api;
mod auth;
mod bench;
mod config;
mod connections;
mod feed;
mod keys;
mod listener;
mod page;
mod query_cli;
mod replay;
mod serve;
mod supervisor;
mod sync_cli;
mod syncs;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The default API address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

#[derive(Parser)]
#[command(name = "sluice", version, about = "Streams, CDC and reverse ETL in one binary.")]
struct Cli {
    /// Log format on stderr: `text` or `json` (one JSON object per line).
    #[arg(long, global = true, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: the embedded DuckDB workspace, the streams and the HTTP API.
    Serve {
        /// Folder of the workspace and state.
        #[arg(long, default_value = "./sluice-data")]
        data_dir: PathBuf,
        /// Address of the HTTP API.
        #[arg(long, default_value = DEFAULT_LISTEN)]
        listen: SocketAddr,
        /// A YAML file of declared streams, created or updated at start.
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        limits: serve::Limits,
        #[command(flatten)]
        access: serve::Access,
        #[command(flatten)]
        page: serve::Page,
    },
    /// Run one read-only SELECT on the workspace and print a table.
    Sql {
        /// The statement.
        sql: String,
        /// The running server to ask.
        #[arg(long, default_value = DEFAULT_LISTEN)]
        server: SocketAddr,
        /// The workspace to open when no server answers; its `admin.token` is sent to the
        /// server unless `SLUICE_TOKEN` is set.
        #[arg(long, default_value = "./sluice-data")]
        data_dir: PathBuf,
        /// Print JSON rows instead of a table.
        #[arg(long)]
        json: bool,
        /// Most rows returned.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Reverse ETL syncs on the running server: list, run, preview, runs.
    Sync {
        #[command(subcommand)]
        command: sync_cli::SyncCommand,
        /// The running server to ask.
        #[arg(long, global = true, default_value = DEFAULT_LISTEN)]
        server: SocketAddr,
        /// The server's data dir, whose `admin.token` is sent unless `SLUICE_TOKEN` is set.
        #[arg(long, global = true, default_value = "./sluice-data")]
        data_dir: PathBuf,
    },
    /// Measure push throughput and latency against DuckDB's own JSON load.
    Bench(bench::BenchArgs),
    /// Measure a Kafka topic → table stream against a raw consumer of the same topic.
    BenchKafka(bench::kafka::KafkaBenchArgs),
    /// Measure a Kinesis stream → table stream against a raw GetRecords reader of its shards.
    BenchKinesis(bench::kinesis::KinesisBenchArgs),
    /// Measure Debezium changes through mirror mode until the table matches.
    BenchMirror(bench::mirror::MirrorBenchArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve { data_dir, listen, config, limits, access, page } => {
                serve::run(data_dir, listen, config, limits, access, page).await
            }
            Command::Sql { sql, server, data_dir, json, limit } => {
                query_cli::run(&sql, server, &data_dir, json, limit).await
            }
            Command::Sync { command, server, data_dir } => sync_cli::run(command, server, &data_dir).await,
            Command::Bench(args) => bench::run(args).await,
            Command::BenchKafka(args) => bench::kafka::run(args).await,
            Command::BenchKinesis(args) => bench::kinesis::run(args).await,
            Command::BenchMirror(args) => bench::mirror::run(args).await,
        }
    });
    // Blocking jobs still running (a query being interrupted, a write) get a moment to end;
    // the process does not wait on them past that.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
