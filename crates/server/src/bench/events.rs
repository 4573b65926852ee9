//! Realistic generated events: about 300 bytes, nested, with fields that appear only in the
//! second half and about 0.1% values that do not fit their column.

use std::fmt::Write;

const COUNTRIES: [&str; 8] = ["DE", "US", "FR", "BR", "IN", "JP", "NG", "GB"];
const PAGES: [&str; 6] = ["/", "/pricing", "/docs/streams", "/blog/cdc", "/signup", "/app/settings"];
const BROWSERS: [&str; 4] = ["firefox", "chrome", "safari", "edge"];
const KINDS: [&str; 4] = ["page_view", "click", "purchase", "signup"];

/// Small deterministic generator (xorshift), so runs are comparable.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// One NDJSON line per event, `n` events; returns the lines and how many carry a misfit.
pub fn generate(n: usize) -> (Vec<String>, usize) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut misfits = 0;
    let base = 1_764_000_000_000i64; // ms
    let lines = (0..n)
        .map(|i| {
            let misfit = rng.next().is_multiple_of(1000);
            misfits += usize::from(misfit);
            let ms = base + i as i64 * 3;
            let ts = chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let amount = if misfit { "\"n/a\"".to_string() } else { format!("{}.{:02}", rng.next() % 500, rng.next() % 100) };
            let mut line = String::with_capacity(360);
            let _ = write!(
                line,
                r#"{{"event_id":{i},"kind":"{}","ts":"{ts}","user":{{"id":{},"country":"{}","plan":"{}"}},"page":{{"path":"{}","referrer":"https://example.com/r/{}"}},"device":{{"browser":"{}","mobile":{}}},"amount":{amount},"tags":["t{}","t{}"],"session":"{:016x}""#,
                rng.pick(&KINDS),
                rng.next() % 100_000,
                rng.pick(&COUNTRIES),
                if rng.next().is_multiple_of(3) { "pro" } else { "free" },
                rng.pick(&PAGES),
                rng.next() % 1000,
                rng.pick(&BROWSERS),
                rng.next().is_multiple_of(2),
                rng.next() % 10,
                rng.next() % 10,
                rng.next(),
            );
            if i >= n / 2 {
                let _ = write!(line, r#","experiment":{{"id":"exp-{}","variant":"{}"}}"#, rng.next() % 20, if rng.next().is_multiple_of(2) { "A" } else { "B" });
            }
            line.push('}');
            line
        })
        .collect();
    (lines, misfits)
}
