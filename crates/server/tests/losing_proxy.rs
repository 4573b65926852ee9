//! A proxy that loses answers: it forwards every request to a real server and, once armed,
//! forwards the next request its predicate matches, lets the server do it, and answers 502 Bad
//! Gateway in its place, as a load balancer that lost the server's reply would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};

pub struct LosingProxy {
    pub endpoint: String,
    armed: Arc<AtomicBool>,
    lost: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// An Iceberg REST table commit: `POST …/namespaces/{ns}/tables/{table}`, or a multi-table one.
pub fn iceberg_commit(method: &Method, path: &str) -> bool {
    let table = path.rsplit_once("/tables/").is_some_and(|(_, t)| !t.is_empty() && !t.contains('/'));
    method == Method::POST && (table || path.ends_with("/transactions/commit"))
}

/// A Delta commit: the put of `_delta_log/<version>.json`.
pub fn delta_commit(method: &Method, path: &str) -> bool {
    method == Method::PUT && path.contains("/_delta_log/") && path.ends_with(".json")
}

/// `method uri` with `headers` and `body`, sent on to `upstream` (the host and length its own).
pub async fn forward(
    http: &reqwest::Client,
    upstream: &str,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> reqwest::Response {
    let mut request = http.request(method, format!("{upstream}{uri}")).body(body);
    for (name, value) in headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    request.send().await.unwrap()
}

impl LosingProxy {
    pub async fn start(upstream: &str, loses: fn(&Method, &str) -> bool) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (armed, lost) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (upstream, http) = (upstream.trim_end_matches('/').to_string(), reqwest::Client::new());
        let (arm, count) = (armed.clone(), lost.clone());
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (upstream, http, arm, count) = (upstream.clone(), http.clone(), arm.clone(), count.clone());
            async move {
                let matched = loses(&method, uri.path());
                let answer = forward(&http, &upstream, method, &uri, &headers, body).await;
                let status = StatusCode::from_u16(answer.status().as_u16()).unwrap();
                if matched && status.is_success() && arm.swap(false, Ordering::SeqCst) {
                    count.fetch_add(1, Ordering::SeqCst);
                    return Response::builder()
                        .status(StatusCode::BAD_GATEWAY)
                        .header("content-type", "text/plain")
                        .body(Body::from("Bad Gateway"))
                        .unwrap();
                }
                let mut reply = Response::builder().status(status);
                for (name, value) in answer.headers() {
                    if !["content-length", "transfer-encoding", "connection"].contains(&name.as_str()) {
                        reply = reply.header(name.as_str(), value.as_bytes());
                    }
                }
                reply.body(Body::from(answer.bytes().await.unwrap())).unwrap()
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { endpoint, armed, lost, task }
    }

    /// The answer of the next matching request is lost.
    pub fn lose_next(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// How many answers were lost.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for LosingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
