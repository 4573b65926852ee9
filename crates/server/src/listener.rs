//! The HTTP listener: hyper's HTTP/1 server with the timeouts and the connection cap that `axum::serve` lacks.
//! A client that opens connections and sends nothing, or sends headers byte by byte, is cut
//! off after [`HEADER_TIMEOUT`]; past [`MAX_CONNECTIONS`] new connections are closed at once,
//! so a flood of half-open connections cannot take the descriptors the streams need.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::api::ApiError;

/// Time a connection has to send a request's headers (also between keep-alive requests).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send a request body (the push route has its own, longer limit).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest body of a request other than a push.
pub const MAX_API_BODY: usize = 2 << 20;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 4096;
/// How long open requests may take to finish at shutdown.
const DRAIN: Duration = Duration::from_secs(10);

/// Serve `app` on `listener` until `shutdown` completes, then let open requests finish.
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()>) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut refused_logged = false;
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of descriptors, most often: wait for some to close instead of spinning.
                    tracing::warn!(error = %e, "Could not accept a connection.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if !refused_logged {
                tracing::warn!(limit = MAX_CONNECTIONS, "Too many open connections; closing new ones.");
                refused_logged = true;
            }
            continue;
        };
        refused_logged = false;
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("Open requests did not finish in time; closing them.");
    }
}

/// Read a request's body within [`BODY_TIMEOUT`] and [`MAX_API_BODY`] before the handler
/// runs, so a client that trickles a body cannot hold a connection for ever.
pub async fn read_body_in_time(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_API_BODY)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(_)) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {MAX_API_BODY} bytes, or was cut off"),
        )
        .into_response(),
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {} s", BODY_TIMEOUT.as_secs()),
        )
        .into_response(),
    }
}
