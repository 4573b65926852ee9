//! A small HTTP API written for the tests: it records every request, and answers 500 or 429
//! (with `Retry-After`) on demand, or slowly, so retries and idempotency keys can be proven.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
    pub status: u16,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> String {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
    }

    pub fn rows(&self) -> Vec<Value> {
        self.body.as_array().cloned().unwrap_or_default()
    }
}

#[derive(Default)]
struct Control {
    received: Vec<Received>,
    /// Answers for the next requests, in order: (status, Retry-After).
    next: VecDeque<(u16, Option<String>)>,
    /// When set, every request gets this status once `succeed_first` requests succeeded.
    fail_always: Option<u16>,
    succeed_first: usize,
    delay: Duration,
    /// Requests that arrived, answered or not yet.
    arrived: usize,
}

#[derive(Clone)]
pub struct HttpTarget {
    control: Arc<Mutex<Control>>,
    pub base: String,
}

impl HttpTarget {
    pub async fn start() -> Self {
        let control = Arc::new(Mutex::new(Control::default()));
        let app = Router::new().fallback(record).with_state(control.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { control, base }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Answer the next request with `status` (and `Retry-After`).
    pub fn answer_next(&self, status: u16, retry_after: Option<&str>) {
        self.control.lock().unwrap().next.push_back((status, retry_after.map(str::to_string)));
    }

    /// After `ok` more successful requests, answer every request with `status`; `None` heals.
    pub fn fail_after(&self, ok: usize, status: Option<u16>) {
        let mut c = self.control.lock().unwrap();
        c.fail_always = status;
        c.succeed_first = ok;
    }

    pub fn delay(&self, delay: Duration) {
        self.control.lock().unwrap().delay = delay;
    }

    /// Requests that arrived, including those still being delayed.
    pub fn arrived(&self) -> usize {
        self.control.lock().unwrap().arrived
    }

    pub fn received(&self) -> Vec<Received> {
        self.control.lock().unwrap().received.clone()
    }

    /// Requests answered 2xx.
    pub fn accepted(&self) -> Vec<Received> {
        self.received().into_iter().filter(|r| r.status < 300).collect()
    }

    pub fn clear(&self) {
        self.control.lock().unwrap().received.clear();
    }
}

async fn record(
    State(control): State<Arc<Mutex<Control>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let delay = {
        let mut c = control.lock().unwrap();
        c.arrived += 1;
        c.delay
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut c = control.lock().unwrap();
    let (status, retry_after) = if let Some(next) = c.next.pop_front() {
        next
    } else if let Some(status) = c.fail_always {
        if c.succeed_first > 0 {
            c.succeed_first -= 1;
            (200, None)
        } else {
            (status, None)
        }
    } else {
        (200, None)
    };
    c.received.push(Received {
        method: method.to_string(),
        path: uri.path().to_string(),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        status,
        at: Instant::now(),
    });
    let mut response = (StatusCode::from_u16(status).unwrap(), "{}").into_response();
    if let Some(after) = retry_after {
        response.headers_mut().insert("retry-after", after.parse().unwrap());
    }
    response
}
