//! `sluice bench-kafka`: topic → table rate against a raw consumer of the same topic.

use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

use super::events;

/// Kafka bench options.
#[derive(Args, Debug)]
pub struct KafkaBenchArgs {
    /// Bootstrap broker, host:port (scripts/bench-kafka.sh starts one).
    #[arg(long)]
    pub brokers: String,
    /// Events to produce.
    #[arg(long, default_value_t = 1_000_000)]
    pub events: usize,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// A stream destination (JSON, as in a stream's config): the rows go there instead of the
    /// workspace, and the run ends when the stream has written them all.
    #[arg(long)]
    pub destination: Option<String>,
    /// The stream's `stage` (JSON), with `--destination`: a staged bulk load.
    #[arg(long)]
    pub stage: Option<String>,
    /// The stream's `flush` (JSON, as in a stream's config), to compare unit sizes.
    #[arg(long)]
    pub flush: Option<String>,
    /// A librdkafka consumer property, `name=value`, given to both the raw consumer and the
    /// stream's source (`properties`); repeatable. `fetch.wait.max.ms` is 10 unless given:
    /// tansu holds every fetch for the whole of that wait, so librdkafka's default of 500 ms
    /// caps any consumer of it near 64k messages/s.
    #[arg(long = "property", value_parser = property)]
    pub properties: Vec<(String, String)>,
}

fn property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected name=value, got {s:?}")),
    }
}

/// Produce, read raw, then read through Sluice; print both rates.
pub async fn run(mut args: KafkaBenchArgs) -> Result<(), String> {
    if !args.properties.iter().any(|(k, _)| k == "fetch.wait.max.ms") {
        args.properties.push(("fetch.wait.max.ms".into(), "10".into()));
    }
    let topic = format!("bench-{}", std::process::id());
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &args.brokers).create().map_err(|e| e.to_string())?;
    let new = NewTopic::new(&topic, args.partitions, TopicReplication::Fixed(1));
    admin.create_topics([&new], &AdminOptions::new()).await.map_err(|e| e.to_string())?;

    eprintln!("producing {} events to {topic} ({} partitions)", args.events, args.partitions);
    let (lines, _) = events::generate(args.events);
    let bytes: usize = lines.iter().map(String::len).sum();
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    for (i, line) in lines.iter().enumerate() {
        let key = i.to_string();
        let mut record = BaseRecord::to(&topic).key(&key).payload(line);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(300)).map_err(|e| e.to_string())?;
    let produce_secs = t.elapsed().as_secs_f64();
    drop(lines);

    eprintln!("raw consumer");
    let raw_secs = raw_read(&args.brokers, &topic, args.partitions, args.events, &args.properties)?;

    eprintln!("sluice");
    let properties: serde_json::Map<String, serde_json::Value> =
        args.properties.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let source = json!({"type": "kafka", "brokers": [args.brokers], "topics": [topic], "properties": properties});
    let destination = args
        .destination
        .as_deref()
        .map(serde_json::from_str::<serde_json::Value>)
        .transpose()
        .map_err(|e| format!("--destination: {e}"))?;
    let into = if destination.is_some() { "destination table" } else { "table" };
    let mut extra = serde_json::Map::new();
    for (field, text) in [("stage", &args.stage), ("flush", &args.flush)] {
        if let Some(text) = text {
            let value = serde_json::from_str(text).map_err(|e| format!("--{field}: {e}"))?;
            extra.insert(field.to_string(), value);
        }
    }
    let (sluice_secs, rss, cpu) = super::time_stream("kafka", source, destination, extra, args.events).await?;

    let mb = bytes as f64 / 1e6;
    println!("events: {} ({mb:.1} MB of values), topic with {} partitions", args.events, args.partitions);
    let properties: Vec<String> = args.properties.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("consumer properties (both consumers): {}", properties.join(", "));
    println!("| run | events/s | MB/s | seconds |");
    println!("|---|---|---|---|");
    println!(
        "| produce (rdkafka) | {:.0} | {:.1} | {produce_secs:.1} |",
        args.events as f64 / produce_secs,
        mb / produce_secs
    );
    println!(
        "| raw consumer (rdkafka, reads only) | {:.0} | {:.1} | {raw_secs:.1} |",
        args.events as f64 / raw_secs,
        mb / raw_secs
    );
    println!(
        "| Sluice topic → {into} (stream created → all rows committed) | {:.0} | {:.1} | {sluice_secs:.1} |",
        args.events as f64 / sluice_secs,
        mb / sluice_secs
    );
    println!("ratio Sluice / raw consumer: {:.2}", raw_secs / sluice_secs);
    println!("peak RSS of the server: {:.0} MiB", rss as f64 / 1024.0);
    println!("CPU of the server: {cpu:.1} s ({:.1} µs per event)", cpu * 1e6 / args.events as f64);
    Ok(())
}

/// Read every message of `topic` from the beginning and discard it; seconds taken.
fn raw_read(
    brokers: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    properties: &[(String, String)],
) -> Result<f64, String> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers).set("group.id", format!("{topic}-raw")).set("enable.auto.commit", "false");
    for (k, v) in properties {
        config.set(k, v);
    }
    let consumer: BaseConsumer = config.create().map_err(|e| e.to_string())?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut seen = 0usize;
    while seen < expected {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(_)) => seen += 1,
            Some(Err(e)) => return Err(e.to_string()),
            None if t.elapsed() > Duration::from_secs(900) => return Err(format!("raw consumer saw {seen}")),
            None => {}
        }
    }
    Ok(t.elapsed().as_secs_f64())
}
