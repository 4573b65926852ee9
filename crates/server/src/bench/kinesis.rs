//! `sluice bench-kinesis`: stream → table rate against a raw GetRecords reader of the same
//! shards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType, StreamStatus};
use clap::Args;
use serde_json::json;

use sluice_connectors::kinesis::{aggregate, deaggregate};

use super::events;

/// Kinesis bench options.
#[derive(Args, Debug)]
pub struct KinesisBenchArgs {
    /// Endpoint URL of the Kinesis emulator (scripts/bench-kinesis.sh starts one).
    #[arg(long)]
    pub endpoint: String,
    /// Events to put.
    #[arg(long, default_value_t = 1_000_000)]
    pub events: usize,
    /// Shards of the stream.
    #[arg(long, default_value_t = 4)]
    pub shards: i32,
    /// Events per Kinesis record, aggregated as the KPL does (1 = one plain record per event).
    /// kinesis-local slows down with every record it holds, so 1M plain records cannot be put.
    #[arg(long, default_value_t = 100)]
    pub per_record: usize,
}

fn client(endpoint: &str) -> Client {
    let config = aws_sdk_kinesis::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(config)
}

/// Put, read raw, then read through Sluice; print both rates.
pub async fn run(args: KinesisBenchArgs) -> Result<(), String> {
    let kinesis = client(&args.endpoint);
    let stream = format!("bench-{}", std::process::id());
    kinesis.create_stream().stream_name(&stream).shard_count(args.shards).send().await.map_err(|e| e.to_string())?;
    loop {
        let d = kinesis.describe_stream_summary().stream_name(&stream).send().await.map_err(|e| e.to_string())?;
        if d.stream_description_summary().is_some_and(|s| s.stream_status() == &StreamStatus::Active) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    eprintln!("putting {} events to {stream} ({} shards, {} per record)", args.events, args.shards, args.per_record);
    let (lines, _) = events::generate(args.events);
    let bytes: usize = lines.iter().map(String::len).sum();
    let records: Vec<Vec<u8>> = if args.per_record <= 1 {
        lines.into_iter().map(String::into_bytes).collect()
    } else {
        lines
            .chunks(args.per_record)
            .enumerate()
            .map(|(i, chunk)| {
                let key = i.to_string();
                let users: Vec<(&str, &[u8])> = chunk.iter().map(|l| (key.as_str(), l.as_bytes())).collect();
                aggregate(&users)
            })
            .collect()
    };
    let t = Instant::now();
    put_all(&kinesis, &stream, Arc::new(records)).await?;
    let put_secs = t.elapsed().as_secs_f64();

    eprintln!("raw GetRecords reader");
    let raw_secs = raw_read(&kinesis, &stream, args.events).await?;

    eprintln!("sluice");
    let source = json!({"type": "kinesis", "stream": stream, "region": "us-east-1", "endpoint": args.endpoint,
                        "credentials": {"access_key_id": "bench", "secret_access_key": "bench"}});
    let (sluice_secs, rss, cpu) =
        super::time_stream("kinesis", source, None, serde_json::Map::new(), args.events).await?;

    let mb = bytes as f64 / 1e6;
    let rate = |secs: f64| (args.events as f64 / secs, mb / secs);
    println!(
        "events: {} ({mb:.1} MB of JSON), stream with {} shards, {} events per record (KPL aggregates)",
        args.events, args.shards, args.per_record
    );
    println!("| run | events/s | MB/s | seconds |");
    println!("|---|---|---|---|");
    let (e, m) = rate(put_secs);
    println!("| put (PutRecords, up to 500 records per call, 8 calls in flight) | {e:.0} | {m:.1} | {put_secs:.1} |");
    let (e, m) = rate(raw_secs);
    println!(
        "| raw reader (GetRecords on every shard at once, de-aggregates and counts) | {e:.0} | {m:.1} | {raw_secs:.1} |"
    );
    let (e, m) = rate(sluice_secs);
    println!("| Sluice stream → table (stream created → all rows queryable) | {e:.0} | {m:.1} | {sluice_secs:.1} |");
    println!("ratio Sluice / raw reader: {:.2}", raw_secs / sluice_secs);
    println!("peak RSS of the server: {:.0} MiB", rss as f64 / 1024.0);
    println!("CPU of the server: {cpu:.1} s ({:.1} µs per event)", cpu * 1e6 / args.events as f64);
    Ok(())
}

/// PutRecords in calls of up to 500 records and 4 MB, 8 calls in flight, retrying refused
/// entries.
async fn put_all(kinesis: &Client, stream: &str, lines: Arc<Vec<Vec<u8>>>) -> Result<(), String> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut chunks: Vec<(usize, usize)> = Vec::new();
    let (mut from, mut size) = (0, 0);
    for (i, record) in lines.iter().enumerate() {
        if i - from == 500 || size + record.len() > 4_000_000 {
            chunks.push((from, i));
            (from, size) = (i, 0);
        }
        size += record.len();
    }
    chunks.push((from, lines.len()));
    let per_task = chunks.len().div_ceil(8).max(1);
    for group in chunks.chunks(per_task) {
        let (kinesis, stream, lines, group) = (kinesis.clone(), stream.to_string(), lines.clone(), group.to_vec());
        tasks.spawn(async move {
            for (from, to) in group {
                let mut pending: Vec<usize> = (from..to).collect();
                while !pending.is_empty() {
                    let entries = pending
                        .iter()
                        .map(|i| {
                            PutRecordsRequestEntry::builder()
                                .partition_key(i.to_string())
                                .data(Blob::new(lines[*i].as_slice()))
                                .build()
                        })
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| e.to_string())?;
                    let out = kinesis
                        .put_records()
                        .stream_name(&stream)
                        .set_records(Some(entries))
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    pending = pending
                        .into_iter()
                        .zip(out.records())
                        .filter(|(_, r)| r.error_code().is_some())
                        .map(|(i, _)| i)
                        .collect();
                }
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// Read every shard from TRIM_HORIZON at once, back to back, and discard; seconds taken.
async fn raw_read(kinesis: &Client, stream: &str, expected: usize) -> Result<f64, String> {
    let shards = kinesis.list_shards().stream_name(stream).send().await.map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for shard in shards.shards() {
        let (kinesis, stream, id) = (kinesis.clone(), stream.to_string(), shard.shard_id().to_string());
        tasks.spawn(async move {
            let it = kinesis
                .get_shard_iterator()
                .stream_name(&stream)
                .shard_id(&id)
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let mut iterator = it.shard_iterator().map(str::to_string);
            let mut seen = 0usize;
            while let Some(it) = iterator {
                let out =
                    kinesis.get_records().shard_iterator(it).limit(10_000).send().await.map_err(|e| e.to_string())?;
                // Count events as Sluice does: the user records inside aggregates.
                for r in out.records() {
                    let key = r.partition_key().unwrap_or_default();
                    seen += deaggregate(r.data().as_ref(), key).map_or(1, |users| users.len());
                }
                if out.records().is_empty() && out.millis_behind_latest().unwrap_or(0) == 0 {
                    break;
                }
                iterator = out.next_shard_iterator().map(str::to_string);
            }
            Ok::<usize, String>(seen)
        });
    }
    let mut seen = 0;
    while let Some(done) = tasks.join_next().await {
        seen += done.map_err(|e| e.to_string())??;
    }
    if seen < expected {
        return Err(format!("raw reader saw {seen} of {expected}"));
    }
    Ok(t.elapsed().as_secs_f64())
}
