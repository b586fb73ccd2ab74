//! The agent's HTTP endpoints: `/metrics` (Prometheus), `/healthz` (the process serves) and
//! `/readyz` (programs attached and every policy file reconciled once); and the client its
//! event sink and `palisade top` use.

pub mod client;

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, server::conn::http1};
use hyper_util::rt::TokioIo;
use tokio::{
    net::TcpListener,
    sync::{mpsc, oneshot},
};
use tracing::debug;

use crate::metrics::{Format, KernelSnapshot, Metrics};

/// What the endpoints answer from. Kernel counters come from the task that owns the BPF object:
/// each scrape sends it a request for a fresh snapshot.
pub struct Endpoints {
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
    pub snapshots: mpsc::Sender<oneshot::Sender<KernelSnapshot>>,
}

/// Serves `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, endpoints: Arc<Endpoints>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                debug!("accepting an HTTP connection: {err}");
                continue;
            }
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let endpoints = endpoints.clone();
                async move { Ok::<_, Infallible>(respond(&endpoints, &request).await) }
            });
            if let Err(err) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!("serving an HTTP connection: {err}");
            }
        });
    }
}

fn text(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

async fn respond(endpoints: &Endpoints, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if request.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "only GET\n");
    }
    match request.uri().path() {
        "/metrics" => {
            let (reply, snapshot) = oneshot::channel();
            let snapshot = match endpoints.snapshots.send(reply).await {
                Ok(()) => snapshot.await.ok(),
                Err(_) => None,
            };
            let Some(snapshot) = snapshot else {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    PLAIN,
                    "the agent is stopping\n",
                );
            };
            let accept = request.headers().get(header::ACCEPT);
            let format = Format::accepted(accept.and_then(|value| value.to_str().ok()));
            text(
                StatusCode::OK,
                format.content_type(),
                endpoints.metrics.encode(snapshot, format),
            )
        }
        "/healthz" => text(StatusCode::OK, PLAIN, "ok\n"),
        "/readyz" if endpoints.ready.load(Ordering::Relaxed) => {
            text(StatusCode::OK, PLAIN, "ready\n")
        }
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            PLAIN,
            "not ready: the policies are not reconciled yet\n",
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: try /metrics, /healthz or /readyz\n",
        ),
    }
}
