//! Stopping a user query that runs on its own DuckDB connection: after its time limit, when the
//! server shuts down, or when the caller's future is dropped (the HTTP client went away).
//!
//! DuckDB's interrupt acts on whatever the connection runs at that moment; one that arrives
//! between two statements of the job (the parse check, BEGIN, the query) would be lost. So once
//! a query is to stop, a watchdog task interrupts it again every 50 ms until the job reports
//! that it has ended.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use duckdb::InterruptHandle;
use tokio::sync::oneshot;

/// Why a query was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It ran past its time limit.
    Timeout,
    /// The server is shutting down.
    Shutdown,
    /// The caller went away.
    Abandoned,
}

/// Shared between the caller, the watchdog and the job.
pub(crate) struct Control {
    handle: Arc<InterruptHandle>,
    reason: AtomicU8,
}

impl Control {
    /// Why the query was stopped, if it was.
    pub(crate) fn reason(&self) -> Option<Stop> {
        match self.reason.load(Ordering::SeqCst) {
            1 => Some(Stop::Timeout),
            2 => Some(Stop::Shutdown),
            3 => Some(Stop::Abandoned),
            _ => None,
        }
    }

    fn stop(&self, why: Stop) {
        let code = match why {
            Stop::Timeout => 1,
            Stop::Shutdown => 2,
            Stop::Abandoned => 3,
        };
        let _ = self.reason.compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst);
        self.handle.interrupt();
    }
}

/// The caller's side: dropping it before [`Guard::finish`] stops the query.
pub(crate) struct Guard {
    finished: Option<oneshot::Sender<()>>,
}

impl Guard {
    /// The job ended and its result was taken: the watchdog ends quietly.
    pub(crate) fn finish(mut self) {
        if let Some(tx) = self.finished.take() {
            let _ = tx.send(());
        }
    }
}

/// The job's side: dropped when the blocking job ends, however it ends.
pub(crate) struct Done {
    _done: oneshot::Sender<()>,
}

/// Start a watchdog for a query on a connection whose interrupt handle is `handle`.
pub(crate) fn watch<S>(handle: Arc<InterruptHandle>, timeout: Duration, shutdown: S) -> (Arc<Control>, Guard, Done)
where
    S: Future<Output = ()> + Send + 'static,
{
    let control = Arc::new(Control { handle, reason: AtomicU8::new(0) });
    let (finished_tx, finished_rx) = oneshot::channel::<()>();
    let (done_tx, mut done_rx) = oneshot::channel::<()>();
    let watched = control.clone();
    tokio::spawn(async move {
        let why = tokio::select! {
            biased;
            _ = &mut done_rx => return,
            finished = finished_rx => match finished {
                Ok(()) => return,
                Err(_) => Stop::Abandoned,
            },
            _ = tokio::time::sleep(timeout) => Stop::Timeout,
            _ = shutdown => Stop::Shutdown,
        };
        tracing::info!(reason = ?why, "Interrupting a SQL query.");
        loop {
            watched.stop(why);
            tokio::select! {
                _ = &mut done_rx => return,
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    });
    (control, Guard { finished: Some(finished_tx) }, Done { _done: done_tx })
}
