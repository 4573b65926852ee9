//! A real Kafka-compatible broker for tests: tansu 0.6.0 on SQLite storage, started on a free
//! port, with SCRAM users or a TLS front end (socat) when asked. Built by scripts/test.sh.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::harness::DataDir;

fn tansu() -> String {
    std::env::var("TANSU_BIN").expect("TANSU_BIN is not set: run the tests through scripts/test.sh, which builds tansu")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub struct Broker {
    child: Option<Child>,
    socat: Option<Child>,
    pub dir: DataDir,
    listen: u16,
    /// The port clients use (the TLS front end's, when there is one).
    pub port: u16,
    auth: bool,
    pub ca: Option<PathBuf>,
}

impl Broker {
    /// A plaintext broker.
    pub fn start() -> Self {
        let port = free_port();
        let mut b =
            Broker { child: None, socat: None, dir: DataDir::new("tansu"), listen: port, port, auth: false, ca: None };
        b.spawn();
        b.wait_ready();
        b
    }

    /// A broker that requires SASL SCRAM; `users` are (mechanism, name, password), mechanism
    /// `scram256` or `scram512`.
    pub fn start_scram(users: &[(&str, &str, &str)]) -> Self {
        let mut b = Broker::start();
        for (mechanism, name, password) in users {
            let out = Command::new(tansu())
                .args([
                    "user",
                    "create",
                    "--broker",
                    &format!("tcp://127.0.0.1:{}", b.port),
                    "--mechanism",
                    mechanism,
                    name,
                    password,
                ])
                .output()
                .unwrap();
            assert!(out.status.success(), "tansu user create: {}", String::from_utf8_lossy(&out.stderr));
        }
        b.stop();
        b.auth = true;
        b.spawn();
        b.wait_port();
        b
    }

    /// A broker behind a TLS terminator (tansu 0.6.0 has no working TLS of its own).
    pub fn start_tls() -> Self {
        let dir = DataDir::new("tansu-tls");
        let (cert, key) = (dir.0.join("cert.pem"), dir.0.join("key.pem"));
        let out = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost"])
            .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
        let (listen, port) = (free_port(), free_port());
        let mut b = Broker { child: None, socat: None, dir, listen, port, auth: false, ca: Some(cert.clone()) };
        b.spawn();
        let socat = Command::new("socat")
            .arg(format!(
                "openssl-listen:{port},bind=127.0.0.1,reuseaddr,fork,cert={},key={},verify=0",
                cert.display(),
                key.display()
            ))
            .arg(format!("tcp:127.0.0.1:{listen}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("socat (scripts/test.sh installs it)");
        b.socat = Some(socat);
        b.wait_port();
        b
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(tansu());
        cmd.current_dir(&self.dir.0)
            .args(["broker", "--listener-url", &format!("tcp://127.0.0.1:{}", self.listen)])
            .args(["--advertised-listener-url", &format!("tcp://127.0.0.1:{}", self.port)])
            .args(["--storage-engine", "sqlite://tansu.db", "--silent"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.auth {
            cmd.arg("--authentication");
        }
        self.child = Some(cmd.spawn().expect("start tansu"));
    }

    fn wait_port(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {}", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A real Kafka round trip: `tansu topic list` (bounded; it hangs on a closed port).
    fn wait_ready(&self) {
        self.wait_port();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = Command::new("timeout")
                .args(["5", &tansu(), "topic", "list", "--broker", &format!("tcp://127.0.0.1:{}", self.listen)])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "tansu did not answer");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }

    /// Start again on the same port and storage.
    pub fn restart(&mut self) {
        self.spawn();
        if self.auth { self.wait_port() } else { self.wait_ready() }
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn create_topic(&self, name: &str, partitions: u32) {
        let out = Command::new("timeout")
            .args(["20", &tansu(), "topic", "create", "--broker", &format!("tcp://127.0.0.1:{}", self.listen)])
            .args(["--partitions", &partitions.to_string(), name])
            .output()
            .unwrap();
        assert!(out.status.success(), "topic create {name}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// An independent producer (rdkafka) for this broker.
    pub fn producer(&self, extra: &[(&str, &str)]) -> FutureProducer {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", self.bootstrap()).set("linger.ms", "5").set("message.timeout.ms", "60000");
        if let Some(ca) = &self.ca {
            c.set("security.protocol", "ssl").set("ssl.ca.location", ca.display().to_string());
        }
        for (k, v) in extra {
            c.set(*k, *v);
        }
        c.create().expect("producer")
    }
}

/// Produce `values` to `topic` (key = index as text, partition by key, a `source` header),
/// waiting for each ack.
pub async fn produce(producer: &FutureProducer, topic: &str, values: &[String]) {
    send(producer, topic, values, true).await;
}

/// As `produce`, without headers. tansu 0.6.0 keeps headers in an unindexed SQLite table and
/// scans all of it once per record fetched, so a fetch of a large backlog with headers takes
/// minutes (the broker spins at 100% CPU); the volume tests send none.
pub async fn produce_bare(producer: &FutureProducer, topic: &str, values: &[String]) {
    send(producer, topic, values, false).await;
}

/// Produce `total` orders (`id`, `amount`; a `coupon` from the half on: a column added
/// mid-stream) to `topic` in bursts of `step`, `pause_ms` apart, without headers.
pub fn produce_orders(
    producer: FutureProducer,
    topic: &'static str,
    total: usize,
    step: usize,
    pause_ms: u64,
) -> tokio::task::JoinHandle<()> {
    let limit = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(total));
    produce_orders_up_to(producer, topic, total, step, pause_ms, limit)
}

/// [`produce_orders`], never past `limit` orders produced: the test raises it, so the producer
/// cannot finish ahead of a stream held up by a restart.
pub fn produce_orders_up_to(
    producer: FutureProducer,
    topic: &'static str,
    total: usize,
    step: usize,
    pause_ms: u64,
    limit: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for start in (0..total).step_by(step) {
            while start >= limit.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let values: Vec<String> = (start..(start + step).min(total))
                .map(|i| {
                    if i >= total / 2 {
                        format!("{{\"id\": {i}, \"amount\": {}.5, \"coupon\": \"c{i}\"}}", i % 97)
                    } else {
                        format!("{{\"id\": {i}, \"amount\": {}.5}}", i % 97)
                    }
                })
                .collect();
            produce_bare(&producer, topic, &values).await;
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        }
    })
}

async fn send(producer: &FutureProducer, topic: &str, values: &[String], headers: bool) {
    let mut acks = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let key = i.to_string();
        let mut record = FutureRecord::to(topic).key(&key).payload(v);
        if headers {
            record = record.headers(
                rdkafka::message::OwnedHeaders::new()
                    .insert(rdkafka::message::Header { key: "source", value: Some("test") }),
            );
        }
        acks.push(producer.send_result(record).map_err(|(e, _)| e).expect("enqueue"));
    }
    for ack in acks {
        ack.await.expect("delivery").map_err(|(e, _)| e).expect("acked");
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        for child in [self.child.take(), self.socat.take()].into_iter().flatten() {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Produce (key, value) messages in order to partition 0 and wait for all; a `None` value is
/// a tombstone. Use an idempotent producer so retries keep the order.
pub async fn produce_keyed(producer: &FutureProducer, topic: &str, messages: &[(Option<String>, Option<String>)]) {
    let mut acks = Vec::with_capacity(messages.len());
    for (key, value) in messages {
        let mut record: FutureRecord<'_, String, String> = FutureRecord::to(topic).partition(0);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        acks.push(producer.send_result(record).map_err(|(e, _)| e).expect("enqueue"));
    }
    for ack in acks {
        ack.await.expect("delivery").map_err(|(e, _)| e).expect("acked");
    }
}
