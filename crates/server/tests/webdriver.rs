//! A small W3C WebDriver client over reqwest, for the page's browser tests: it starts Debian's
//! chromedriver (installed by `scripts/services/chromium.sh`) on a free port and drives a
//! headless Chromium. Written here rather than taken from a crate (fantoccini) to keep the
//! test build free of another HTTP stack: the protocol used is a dozen JSON calls.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long a wait for the page lasts before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A headless Chromium session, closed (with its chromedriver) on drop.
pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    session: String,
    shots: PathBuf,
    step: usize,
}

impl Browser {
    /// Start chromedriver and a headless Chromium session; screenshots go to `shots`.
    pub async fn start(shots: &Path) -> Self {
        let chromedriver = std::env::var("SLUICE_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {chromedriver} ({e}): source scripts/services/chromium.sh"));
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        crate::harness::wait_until("chromedriver to answer", PATIENCE, || {
            let (http, url) = (http.clone(), format!("{base}/status"));
            async move { http.get(url).send().await.is_ok_and(|r| r.status().is_success()) }
        })
        .await;
        let binary = ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .map(str::to_string)
            .or_else(|| std::env::var("SLUICE_CHROMIUM").ok())
            .expect("chromium: source scripts/services/chromium.sh");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": binary, "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1440,1000", "--no-first-run", "--disable-extensions"]}
        }}});
        let r: Value =
            http.post(format!("{base}/session")).json(&capabilities).send().await.unwrap().json().await.unwrap();
        let id = r["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {r}"));
        std::fs::create_dir_all(shots).unwrap();
        Self { driver, http, session: format!("{base}/session/{id}"), shots: shots.to_path_buf(), step: 0 }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let r: Value = request.send().await.unwrap().json().await.unwrap();
        if let Some(error) = r["value"]["error"].as_str() {
            panic!("webdriver {path}: {error}: {}", r["value"]["message"]);
        }
        r["value"].clone()
    }

    /// Open `url`.
    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    /// Run `script` (a function body; `arguments` holds `args`) and return what it returns,
    /// awaiting a promise.
    pub async fn script(&self, script: &str, args: Value) -> Value {
        self.call(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": args}))).await
    }

    /// Wait until `css` matches an element, and return its id.
    pub async fn find(&self, css: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let r: Value = self
                .http
                .post(format!("{}/element", self.session))
                .json(&json!({"using": "css selector", "value": css}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if let Some(id) = r["value"][ELEMENT].as_str() {
                return id.to_string();
            }
            assert!(Instant::now() < deadline, "no element matches {css}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Click the element `css` matches.
    pub async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{id}/click"), Some(json!({}))).await;
    }

    /// Replace what the field `css` holds with `text`.
    pub async fn fill(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{id}/clear"), Some(json!({}))).await;
        self.call(reqwest::Method::POST, &format!("/element/{id}/value"), Some(json!({"text": text}))).await;
    }

    /// The visible text of `css`.
    pub async fn text(&self, css: &str) -> String {
        let id = self.find(css).await;
        self.call(reqwest::Method::GET, &format!("/element/{id}/text"), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Whether the control `css` is enabled.
    pub async fn enabled(&self, css: &str) -> bool {
        let id = self.find(css).await;
        self.call(reqwest::Method::GET, &format!("/element/{id}/enabled"), None).await.as_bool().unwrap_or(false)
    }

    /// Wait until the text of `css` satisfies `check`; returns it.
    pub async fn wait_text(&self, css: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;";
            let text = self.script(script, json!([css])).await;
            if let Some(text) = text.as_str().filter(|t| check(t)) {
                return text.to_string();
            }
            assert!(Instant::now() < deadline, "{css} never had the text wanted; last: {text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Save a PNG of the window as `<shots>/<nn>-<name>.png`; returns its path.
    pub async fn screenshot(&mut self, name: &str) -> PathBuf {
        self.step += 1;
        let data = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let path = self.shots.join(format!("{:02}-{name}.png", self.step));
        std::fs::write(&path, base64_decode(data.as_str().unwrap_or_default())).unwrap();
        println!("screenshot: {}", path.display());
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = std::process::Command::new("curl").args(["-s", "-X", "DELETE", &self.session]).output();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let digits: Vec<u8> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, d)| n | (u32::from(*d) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
