//! Events posted to Falcosidekick in Falco's JSON output format, so that every output it
//! supports (Slack, Loki, Elasticsearch, a SIEM...) works with Palisade. A bounded queue sits
//! between the event loop and the HTTP worker: when the receiver is down, events wait and are
//! retried in order, with a jittered backoff (so that a cluster's agents do not all retry at
//! once after an outage) and no sooner than a `Retry-After` asks; when the queue is full, new
//! events are counted as overflow and dropped.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{Map, Value, json};
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{info, warn};

use super::{AuditEvent, ModuleFailure, Sink};
use crate::{
    bpf::{HOOKS, SELF_PROTECTION},
    http::client::{Client, ClientError, TlsFiles, retry_after},
    metrics::HttpSinkMetrics,
    targets::PodIdentity,
};

const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(5);
/// The longest `Retry-After` waited for: events queue meanwhile, and the queue is bounded.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The event loop's side: queues events for the worker.
pub struct FalcoSink {
    name: String,
    queue: mpsc::Sender<Bytes>,
    metrics: HttpSinkMetrics,
    overflow: u64,
}

/// The task that posts queued events.
pub struct FalcoWorker(JoinHandle<()>);

impl FalcoWorker {
    /// Waits until every queued event is delivered (the sink must be dropped first), or for
    /// `grace` at most; returns whether all were.
    pub async fn finish(self, grace: Duration) -> bool {
        tokio::time::timeout(grace, self.0).await.is_ok()
    }
}

impl FalcoSink {
    /// Posts events to `url` (Falcosidekick listens on http://HOST:2801/, or https:// with
    /// its `tlsserver`), queueing up to `capacity` of them.
    pub fn start(
        url: &str,
        tls: &TlsFiles,
        capacity: usize,
        metrics: HttpSinkMetrics,
    ) -> Result<(Self, FalcoWorker), ClientError> {
        let client = Client::with_tls(url, tls)?;
        let (queue, pending) = mpsc::channel(capacity.max(1));
        let worker = tokio::spawn(deliver(client, pending, metrics.clone()));
        Ok((
            Self {
                name: url.to_owned(),
                queue,
                metrics,
                overflow: 0,
            },
            FalcoWorker(worker),
        ))
    }
}

impl FalcoSink {
    fn enqueue(&mut self, body: Bytes) {
        if self.queue.try_send(body).is_err() {
            self.overflow += 1;
            self.metrics.overflow.inc();
        }
        self.metrics
            .queued
            .set((self.queue.max_capacity() - self.queue.capacity()) as i64);
    }
}

impl Sink for FalcoSink {
    fn send(&mut self, event: &AuditEvent) {
        self.enqueue(Bytes::from(falco_output(event).to_string()));
    }

    fn report(&mut self, failure: &ModuleFailure) {
        self.enqueue(Bytes::from(falco_failure(failure).to_string()));
    }

    fn lost(&self) -> u64 {
        self.overflow
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// The waits between tries of one event: doubling from FIRST_RETRY to LAST_RETRY, each half its
/// step plus a random part of up to the other half ("equal jitter"), and never shorter than what
/// the receiver asks, plus a random tenth of that (at most a second) to spread the agents out.
struct Backoff {
    step: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self { step: FIRST_RETRY }
    }

    /// The wait before the next try, the receiver having asked for `asked`; `random` is in
    /// [0, 1).
    fn next(&mut self, asked: Option<Duration>, random: f64) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(LAST_RETRY);
        let backoff = step / 2 + (step / 2).mul_f64(random);
        match asked.map(|asked| asked.min(LONGEST_RETRY_AFTER)) {
            Some(asked) => {
                asked.max(backoff) + (asked / 10).min(Duration::from_secs(1)).mul_f64(random)
            }
            None => backoff,
        }
    }
}

/// Posts each event until the receiver takes it, in order; ends when the sink is dropped and the
/// queue is empty.
async fn deliver(client: Client, mut pending: mpsc::Receiver<Bytes>, metrics: HttpSinkMetrics) {
    let mut failing = false;
    while let Some(body) = pending.recv().await {
        metrics.queued.set(pending.len() as i64);
        let mut backoff = Backoff::new();
        loop {
            let (failure, asked) = match client.post_json(body.clone()).await {
                Ok(answer) if answer.status.is_success() => {
                    metrics.sent.inc();
                    if std::mem::take(&mut failing) {
                        info!(url = %client.url(), "the event receiver takes events again");
                    }
                    break;
                }
                // The receiver refuses this event: retrying it would not help.
                Ok(answer)
                    if answer.status.is_client_error()
                        && answer.status != StatusCode::TOO_MANY_REQUESTS =>
                {
                    metrics.rejected.inc();
                    warn!(url = %client.url(), status = %answer.status, answer = %String::from_utf8_lossy(&answer.body), "the event receiver rejected an event");
                    break;
                }
                Ok(answer) => (
                    answer.status.to_string(),
                    retry_after(&answer.headers, SystemTime::now()),
                ),
                Err(err) => (err.to_string(), None),
            };
            if !std::mem::replace(&mut failing, true) {
                warn!(url = %client.url(), "cannot deliver events, retrying (they queue meanwhile): {failure}");
            }
            metrics.retries.inc();
            tokio::time::sleep(backoff.next(asked, fastrand::f64())).await;
        }
    }
}

/// Falco's priority for a decision.
fn priority(event: &AuditEvent) -> &'static str {
    match (event.naming.rule.as_deref(), event.naming.action) {
        (Some(SELF_PROTECTION), _) => "Critical",
        (_, "deny") => "Warning",
        _ => "Notice",
    }
}

/// Adds `value` to `fields` under `prefix`, objects flattened into dotted names.
fn flatten(fields: &mut Map<String, Value>, prefix: &str, value: Value) {
    match value {
        Value::Object(object) => {
            for (key, value) in object {
                flatten(fields, &format!("{prefix}.{key}"), value);
            }
        }
        Value::Null => {}
        value => {
            fields.insert(prefix.to_owned(), value);
        }
    }
}

/// A rule module's failure in Falco's JSON output format.
fn falco_failure(failure: &ModuleFailure) -> Value {
    let mut fields = Map::new();
    flatten(
        &mut fields,
        "palisade",
        serde_json::to_value(failure).expect("failures serialize"),
    );
    json!({
        "output": format!(
            "Error rule module {} failed ({}) on {} events (onFailure {}): {}",
            failure.module, failure.failure, failure.events, failure.on_failure, failure.message
        ),
        "priority": "Error",
        "rule": "palisade-rule-module-failure",
        "time": failure.time,
        "source": "palisade",
        "hostname": failure.node,
        "tags": ["palisade", "rule-module"],
        "output_fields": fields,
    })
}

/// The event in Falco's JSON output format: what Falcosidekick accepts on `POST /`.
fn falco_output(event: &AuditEvent) -> Value {
    let naming = &event.naming;
    let rule = naming.rule.as_deref().unwrap_or("unknown");
    let rule_class = HOOKS
        .iter()
        .find(|hook| hook.name == naming.hook)
        .map_or("unknown", |hook| hook.rule_class);
    let object = match (&event.socket, &event.capability, &event.fs_type) {
        (Some(socket), _, _) if socket.address.is_some() => format!(
            "{}:{}",
            socket.address.as_deref().unwrap_or_default(),
            socket.port.unwrap_or(0)
        ),
        (_, Some(capability), _) => capability.clone(),
        (_, _, Some(fs_type)) => fs_type.clone(),
        _ => event.path.clone(),
    };
    let verb = if naming.action == "deny" {
        "denied"
    } else {
        "audited"
    };
    let place = match &event.kubernetes {
        Some(PodIdentity {
            namespace,
            pod,
            container,
        }) => {
            let container = container
                .as_ref()
                .map(|container| format!(" container {container}"))
                .unwrap_or_default();
            format!("pod {namespace}/{pod}{container}")
        }
        None => naming
            .target
            .cgroup_path
            .as_deref()
            .unwrap_or("an unknown target")
            .to_owned(),
    };
    let output = format!(
        "{} {verb} {} {object} by {} (pid {}, uid {}) in {place} (policy {}, rule {rule})",
        priority(event),
        naming.hook,
        event.comm,
        event.pid,
        event.uid,
        naming.policy.as_deref().unwrap_or("unknown"),
    );
    // Falco's own field names where one means the same, Palisade's for the rest.
    let mut fields = Map::new();
    fields.insert("evt.type".to_owned(), json!(naming.hook));
    fields.insert("proc.name".to_owned(), json!(event.comm));
    fields.insert("proc.pid".to_owned(), json!(event.pid));
    fields.insert("thread.tid".to_owned(), json!(event.tid));
    fields.insert("user.uid".to_owned(), json!(event.uid));
    if !event.path.is_empty() {
        fields.insert("fd.name".to_owned(), json!(event.path));
    }
    if let Some(pod) = &event.kubernetes {
        fields.insert("k8s.ns.name".to_owned(), json!(pod.namespace));
        fields.insert("k8s.pod.name".to_owned(), json!(pod.pod));
        if let Some(container) = &pod.container {
            fields.insert("container.name".to_owned(), json!(container));
        }
    }
    flatten(
        &mut fields,
        "palisade",
        serde_json::to_value(event).expect("events serialize"),
    );
    json!({
        "output": output,
        "priority": priority(event),
        "rule": rule,
        "time": event.time,
        "source": "palisade",
        "hostname": naming.node,
        "tags": ["palisade", naming.action, rule_class],
        "output_fields": fields,
    })
}

#[cfg(test)]
mod tests {
    use std::{
        convert::Infallible,
        net::SocketAddr,
        path::PathBuf,
        sync::{Arc, Mutex},
        time::Instant,
    };

    use http_body_util::{BodyExt, Full};
    use hyper::{Request, Response, body::Incoming, server::conn::http1};
    use hyper_util::rt::TokioIo;

    use super::*;
    use crate::events::{Device, EventTarget, Naming};

    fn event(path: &str) -> AuditEvent {
        AuditEvent {
            time: crate::events::rfc3339_nanos(
                std::time::SystemTime::UNIX_EPOCH + Duration::from_nanos(1_795_323_600_000_000_001),
            ),
            naming: Arc::new(Naming::new(
                "node-1".into(),
                "file_open",
                "deny",
                Some("app".into()),
                Some("no-shadow".into()),
                1,
                EventTarget {
                    cgroup_id: 42,
                    cgroup_path: Some("/sys/fs/cgroup/app".into()),
                },
            )),
            cgroup_id: 42,
            kubernetes: None,
            pid: 100,
            tid: 101,
            uid: 0,
            comm: "cat".to_owned(),
            path: path.to_owned(),
            dev: Device(1),
            ino: 7,
            permissions: &["read"],
            errno: 1,
            suppressed: 0,
            object_pid: None,
            signal: None,
            capability: None,
            fs_type: None,
            socket: None,
            rdev: None,
            arg: None,
            added: Default::default(),
            facts: Default::default(),
        }
    }

    #[test]
    fn events_take_falcos_output_format() {
        let output = falco_output(&event("/etc/shadow"));
        assert_eq!(output["rule"], "no-shadow");
        assert_eq!(output["priority"], "Warning");
        assert_eq!(output["time"], "2026-11-22T05:00:00.000000001Z");
        assert_eq!(output["source"], "palisade");
        assert_eq!(output["hostname"], "node-1");
        assert_eq!(output["tags"], json!(["palisade", "deny", "files"]));
        assert_eq!(
            output["output"],
            "Warning denied file_open /etc/shadow by cat (pid 100, uid 0) in /sys/fs/cgroup/app (policy app, rule no-shadow)"
        );
        let fields = &output["output_fields"];
        assert_eq!(fields["proc.name"], "cat");
        assert_eq!(fields["fd.name"], "/etc/shadow");
        assert_eq!(fields["palisade.policy"], "app");
        assert_eq!(fields["palisade.target.cgroup_path"], "/sys/fs/cgroup/app");
        assert!(fields.get("palisade.signal").is_none(), "absent, not null");
        assert!(fields.get("k8s.pod.name").is_none());
    }

    #[test]
    fn pods_and_containers_take_falcos_field_names() {
        let mut in_pod = event("/etc/shadow");
        in_pod.kubernetes = Some(PodIdentity {
            namespace: "shop".to_owned(),
            pod: "web-1".to_owned(),
            container: Some("nginx".to_owned()),
        });
        let output = falco_output(&in_pod);
        assert!(
            output["output"]
                .as_str()
                .unwrap()
                .contains(" in pod shop/web-1 container nginx (policy app"),
            "{}",
            output["output"]
        );
        let fields = &output["output_fields"];
        assert_eq!(fields["k8s.ns.name"], "shop");
        assert_eq!(fields["k8s.pod.name"], "web-1");
        assert_eq!(fields["container.name"], "nginx");
        assert_eq!(fields["palisade.kubernetes.pod"], "web-1");
    }

    #[test]
    fn module_failures_are_reported_as_errors() {
        let output = falco_failure(&ModuleFailure {
            kind: "rule_module_failure",
            time: crate::events::rfc3339_nanos(
                std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_323_600),
            ),
            node: "node-1".to_owned(),
            module: "egress".to_owned(),
            failure: "timeout",
            message: "it ran past its budget".to_owned(),
            events: 12,
            on_failure: "keep",
        });
        assert_eq!(output["priority"], "Error");
        assert_eq!(output["rule"], "palisade-rule-module-failure");
        assert_eq!(
            output["output"],
            "Error rule module egress failed (timeout) on 12 events (onFailure keep): it ran past its budget"
        );
        assert_eq!(output["output_fields"]["palisade.module"], "egress");
    }

    /// What a Falcosidekick stand-in was sent: each body, and when it came.
    type Received = Arc<Mutex<Vec<(Instant, Value)>>>;

    /// A Falcosidekick stand-in that answers `status` to everything, over plain HTTP.
    async fn receiver(address: SocketAddr, status: StatusCode) -> (Received, JoinHandle<()>) {
        receiver_with(address, None, move |_| (status, None)).await
    }

    /// A Falcosidekick stand-in, over TLS with `tls`: records the bodies it is sent and answers
    /// the status and Retry-After `answer` gives for the request's number (from 0).
    async fn receiver_with(
        address: SocketAddr,
        tls: Option<Arc<rustls::ServerConfig>>,
        answer: impl Fn(usize) -> (StatusCode, Option<&'static str>) + Send + Sync + 'static,
    ) -> (Received, JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind(address).await.unwrap();
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let received: Received = Arc::default();
        let bodies = received.clone();
        let answer = Arc::new(answer);
        let server = tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (bodies, answer) = (bodies.clone(), answer.clone());
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let (bodies, answer) = (bodies.clone(), answer.clone());
                    async move {
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        let mut bodies = bodies.lock().unwrap();
                        let (status, retry_after) = answer(bodies.len());
                        bodies.push((Instant::now(), serde_json::from_slice(&body).unwrap()));
                        let mut response = Response::new(Full::new(Bytes::new()));
                        *response.status_mut() = status;
                        if let Some(seconds) = retry_after {
                            response
                                .headers_mut()
                                .insert(hyper::header::RETRY_AFTER, seconds.parse().unwrap());
                        }
                        Ok::<_, Infallible>(response)
                    }
                });
                let acceptor = acceptor.clone();
                // The handshake in the connection's own task: one refused ends only it.
                tokio::spawn(async move {
                    match acceptor {
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            }
                        }
                    }
                });
            }
        });
        (received, server)
    }

    /// A loopback address nothing listens on (yet).
    fn free_address() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    /// A sink posting to http://`address`/, queueing `capacity` events; its worker and metrics.
    fn plain_sink(
        address: SocketAddr,
        capacity: usize,
    ) -> (FalcoSink, FalcoWorker, HttpSinkMetrics) {
        let metrics = HttpSinkMetrics::default();
        let (sink, worker) = FalcoSink::start(
            &format!("http://{address}/"),
            &TlsFiles::default(),
            capacity,
            metrics.clone(),
        )
        .unwrap();
        (sink, worker, metrics)
    }

    async fn until(what: &str, condition: impl Fn() -> bool) {
        for _ in 0..500 {
            if condition() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("never {what}");
    }

    #[tokio::test]
    async fn events_wait_while_the_receiver_is_down_and_overflow_is_counted() {
        let address = free_address();
        let (mut sink, worker, metrics) = plain_sink(address, 3);
        // The worker holds the first event, retrying; the queue takes three more; the fifth
        // overflows.
        sink.send(&event("/0"));
        until("retried", || metrics.retries.get() > 0).await;
        for index in 1..5 {
            sink.send(&event(&format!("/{index}")));
        }
        assert_eq!(sink.lost(), 1);
        assert_eq!(metrics.overflow.get(), 1);
        assert_eq!(metrics.queued.get(), 3);
        assert_eq!(metrics.sent.get(), 0);
        // The receiver comes up: everything queued arrives, in order.
        let (received, server) = receiver(address, StatusCode::OK).await;
        until("delivered", || metrics.sent.get() == 4).await;
        let paths: Vec<Value> = received
            .lock()
            .unwrap()
            .iter()
            .map(|(_, body)| body["output_fields"]["fd.name"].clone())
            .collect();
        assert_eq!(paths, [json!("/0"), json!("/1"), json!("/2"), json!("/3")]);
        assert_eq!(metrics.queued.get(), 0);
        drop(sink);
        assert!(worker.finish(Duration::from_secs(5)).await);
        server.abort();
    }

    #[tokio::test]
    async fn an_event_the_receiver_refuses_is_not_retried() {
        let address = free_address();
        let (received, server) = receiver(address, StatusCode::BAD_REQUEST).await;
        let (mut sink, worker, metrics) = plain_sink(address, 8);
        sink.send(&event("/a"));
        sink.send(&event("/b"));
        drop(sink);
        assert!(worker.finish(Duration::from_secs(5)).await);
        assert_eq!(received.lock().unwrap().len(), 2);
        assert_eq!(metrics.rejected.get(), 2);
        assert_eq!(metrics.retries.get(), 0);
        server.abort();
    }

    #[test]
    fn backoff_doubles_with_jitter_and_waits_what_the_receiver_asks() {
        let mut backoff = Backoff::new();
        let waits: Vec<Duration> = [0.0, 0.0, 0.5, 0.0, 0.75, 0.0, 0.0]
            .into_iter()
            .map(|random| backoff.next(None, random))
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(
            waits,
            [
                ms(50),
                ms(100),
                ms(300),
                ms(400),
                ms(1400),
                ms(1600),
                ms(2500)
            ],
            "half of each step (100 ms doubling up to 5 s) and a random part of the other half"
        );
        let asked =
            |asked: u64, random| Backoff::new().next(Some(Duration::from_secs(asked)), random);
        assert_eq!(asked(3, 0.0), Duration::from_secs(3));
        assert_eq!(
            asked(3, 0.5),
            ms(3150),
            "a tenth of it at most, to spread the agents"
        );
        assert_eq!(asked(3600, 0.0), LONGEST_RETRY_AFTER);
        assert_eq!(asked(0, 0.0), ms(50), "never below the backoff");
    }

    #[tokio::test]
    async fn a_503_with_retry_after_is_retried_no_sooner() {
        let address = free_address();
        let (received, server) = receiver_with(address, None, |request| match request {
            0 => (StatusCode::SERVICE_UNAVAILABLE, Some("1")),
            _ => (StatusCode::OK, None),
        })
        .await;
        let (mut sink, worker, metrics) = plain_sink(address, 8);
        sink.send(&event("/a"));
        drop(sink);
        assert!(worker.finish(Duration::from_secs(10)).await);
        let received = received.lock().unwrap();
        assert_eq!(received.len(), 2);
        let waited = received[1].0 - received[0].0;
        assert!(waited >= Duration::from_secs(1), "{waited:?}");
        assert_eq!((metrics.sent.get(), metrics.retries.get()), (1, 1));
        server.abort();
    }

    /// A CA, a certificate it signed for 127.0.0.1 (the receiver's) and one for a client, in
    /// PEM files where the agent's are (the CA, the client's certificate and key, and a key of
    /// another certificate).
    struct Pki {
        dir: PathBuf,
        ca: PathBuf,
        client_cert: PathBuf,
        client_key: PathBuf,
        other_key: PathBuf,
        server: Arc<rustls::ServerConfig>,
        /// The receiver's configuration when it asks clients for a certificate the CA signed,
        /// as Falcosidekick's `tlsserver.mutualtls` does.
        mutual: Arc<rustls::ServerConfig>,
    }

    fn pki(name: &str) -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa,
            KeyPair, KeyUsagePurpose,
        };
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        let dir = std::env::temp_dir().join(format!("palisade-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |name: &str, usage| {
            let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().unwrap();
            (params.signed_by(&key, &ca).unwrap(), key)
        };
        let (server_cert, server_key) = leaf("127.0.0.1", ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = leaf("palisade", ExtendedKeyUsagePurpose::ClientAuth);
        let write = |file: &str, pem: String| {
            let path = dir.join(file);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = |mutual: bool| {
            let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .unwrap();
            let builder = if mutual {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca.der().clone()).unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider.clone(),
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            } else {
                builder.with_no_client_auth()
            };
            let key = PrivateKeyDer::from(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
            Arc::new(
                builder
                    .with_single_cert(vec![server_cert.der().clone()], key)
                    .unwrap(),
            )
        };
        Pki {
            dir: dir.clone(),
            ca: write("ca.crt", ca.pem()),
            client_cert: write("tls.crt", client_cert.pem()),
            client_key: write("tls.key", client_key.serialize_pem()),
            other_key: write("other.key", server_key.serialize_pem()),
            server: server(false),
            mutual: server(true),
        }
    }

    impl Drop for Pki {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Whether one event sent over `tls` to a receiver with `server`'s configuration arrives;
    /// the error of a direct request when it does not.
    async fn delivered(
        server: &Arc<rustls::ServerConfig>,
        tls: &TlsFiles,
    ) -> Result<(), ClientError> {
        let address = free_address();
        let (received, receiver) =
            receiver_with(address, Some(server.clone()), |_| (StatusCode::OK, None)).await;
        let url = format!("https://{address}/");
        let metrics = HttpSinkMetrics::default();
        let (mut sink, worker) = FalcoSink::start(&url, tls, 8, metrics.clone()).unwrap();
        sink.send(&event("/a"));
        drop(sink);
        let finished = worker.finish(Duration::from_secs(3)).await;
        let result = if finished {
            assert_eq!(received.lock().unwrap().len(), 1);
            assert_eq!(metrics.sent.get(), 1);
            Ok(())
        } else {
            assert!(received.lock().unwrap().is_empty());
            assert_eq!(metrics.sent.get(), 0);
            assert!(metrics.retries.get() > 0);
            Err(Client::with_tls(&url, tls)
                .unwrap()
                .post_json(Bytes::from_static(b"{}"))
                .await
                .expect_err("refused by the sink, taken when asked directly"))
        };
        receiver.abort();
        result
    }

    #[tokio::test]
    async fn over_https_events_arrive_when_the_receiver_is_verified_and_only_then() {
        let pki = pki("server");
        let trusted = TlsFiles {
            ca: Some(pki.ca.clone()),
            identity: None,
        };
        delivered(&pki.server, &trusted).await.unwrap();
        let refused = delivered(&pki.server, &TlsFiles::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("invalid peer certificate: UnknownIssuer"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn mutual_tls_presents_the_client_certificate() {
        let pki = pki("mutual");
        let identified = TlsFiles {
            ca: Some(pki.ca.clone()),
            identity: Some((pki.client_cert.clone(), pki.client_key.clone())),
        };
        delivered(&pki.mutual, &identified).await.unwrap();
        let anonymous = TlsFiles {
            ca: Some(pki.ca.clone()),
            identity: None,
        };
        // Refused in the handshake (TLS 1.2) or at the first request (1.3), but refused.
        delivered(&pki.mutual, &anonymous).await.unwrap_err();
    }

    #[test]
    fn bad_tls_files_are_refused_with_the_file_and_the_reason() {
        let pki = pki("files");
        let url = "https://127.0.0.1:2801/";
        let refused = |tls: TlsFiles| {
            FalcoSink::start(url, &tls, 1, HttpSinkMetrics::default())
                .err()
                .expect("refused")
                .to_string()
        };
        let mismatch = refused(TlsFiles {
            ca: None,
            identity: Some((pki.client_cert.clone(), pki.other_key.clone())),
        });
        assert!(
            mismatch.starts_with(&format!("{}: ", pki.client_cert.display()))
                && mismatch.contains("key"),
            "{mismatch}"
        );
        let not_a_ca = refused(TlsFiles {
            ca: Some(pki.client_key.clone()),
            identity: None,
        });
        assert!(
            not_a_ca.starts_with(&format!("{}: ", pki.client_key.display())),
            "{not_a_ca}"
        );
        let missing = refused(TlsFiles {
            ca: Some("/nonexistent/ca.crt".into()),
            identity: None,
        });
        assert!(missing.starts_with("/nonexistent/ca.crt: "), "{missing}");
    }
}
