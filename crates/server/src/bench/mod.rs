//! `sluice bench`: push generated events through the real endpoint.

use clap::Args;

/// Bench options.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Events to push.
    #[arg(long, default_value_t = 1_000_000)]
    pub events: usize,
}

/// Run the benchmark.
pub async fn run(_args: BenchArgs) -> Result<(), String> {
    Err("not yet".into())
}
