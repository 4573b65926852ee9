//! One live client of a feed, as server-sent events: at most `--feed-max-events-per-sec`
//! ([`MAX_EVENTS_PER_SEC`] by default) events a second; what it cannot take (over that rate, or
//! behind the channel) is skipped and counted in a `skipped` event.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::Event;
use futures_util::Stream;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;

use super::FeedEvent;

/// Events one client gets a second at most, unless `--feed-max-events-per-sec` says otherwise.
pub const MAX_EVENTS_PER_SEC: u32 = 50;

struct Client {
    rx: broadcast::Receiver<Arc<FeedEvent>>,
    opening: Option<String>,
    window: Instant,
    sent: u32,
    max_per_sec: u32,
    skipped: u64,
}

/// The events of `rx` for one client, after an `open` event with `opening` as its data, at
/// most `max_per_sec` a second.
pub fn events(
    rx: broadcast::Receiver<Arc<FeedEvent>>,
    opening: String,
    max_per_sec: u32,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    let client = Client { rx, opening: Some(opening), window: Instant::now(), sent: 0, max_per_sec, skipped: 0 };
    futures_util::stream::unfold(client, |mut c| async move { c.next().await.map(|e| (Ok(e), c)) })
}

impl Client {
    async fn next(&mut self) -> Option<Event> {
        if let Some(opening) = self.opening.take() {
            return Some(Event::default().event("open").data(opening));
        }
        loop {
            let window_end = self.window + Duration::from_secs(1);
            if Instant::now() >= window_end {
                self.window = Instant::now();
                self.sent = 0;
                if self.skipped > 0 {
                    return Some(self.skipped_event());
                }
            }
            // With skips to report, wake at the window's end even when nothing arrives.
            let received = if self.skipped > 0 {
                match tokio::time::timeout_at(window_end, self.rx.recv()).await {
                    Ok(r) => r,
                    Err(_) => continue,
                }
            } else {
                self.rx.recv().await
            };
            match received {
                Ok(event) if self.sent < self.max_per_sec => {
                    self.sent += 1;
                    return Some(Event::default().event(event.kind).data(event.data.as_str()));
                }
                Ok(_) => self.skipped += 1,
                Err(RecvError::Lagged(n)) => self.skipped += n,
                Err(RecvError::Closed) => return None,
            }
        }
    }

    fn skipped_event(&mut self) -> Event {
        let n = std::mem::take(&mut self.skipped);
        Event::default().event("skipped").data(format!("{{\"skipped\":{n}}}"))
    }
}
