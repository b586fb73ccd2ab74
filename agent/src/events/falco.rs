//! Events posted to Falcosidekick in Falco's JSON output format, so that every output it
//! supports (Slack, Loki, Elasticsearch, a SIEM...) works with Palisade. A bounded queue sits
//! between the event loop and the HTTP worker: when the receiver is down, events wait and are
//! retried in order; when the queue is full, new events are counted as overflow and dropped.

use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{Map, Value, json};
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{info, warn};

use super::{AuditEvent, ModuleFailure, Sink};
use crate::{
    bpf::{HOOKS, SELF_PROTECTION},
    http::client::{Client, ClientError},
    metrics::HttpSinkMetrics,
    targets::PodIdentity,
};

const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(5);

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
    /// Posts events to `url` (Falcosidekick listens on http://HOST:2801/), queueing up to
    /// `capacity` of them.
    pub fn start(
        url: &str,
        capacity: usize,
        metrics: HttpSinkMetrics,
    ) -> Result<(Self, FalcoWorker), ClientError> {
        let client = Client::new(url)?;
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

/// Posts each event until the receiver takes it, in order; ends when the sink is dropped and the
/// queue is empty.
async fn deliver(mut client: Client, mut pending: mpsc::Receiver<Bytes>, metrics: HttpSinkMetrics) {
    let mut failing = false;
    while let Some(body) = pending.recv().await {
        metrics.queued.set(pending.len() as i64);
        let mut wait = FIRST_RETRY;
        loop {
            let failure = match client.post_json(body.clone()).await {
                Ok((status, _)) if status.is_success() => {
                    metrics.sent.inc();
                    if std::mem::take(&mut failing) {
                        info!(url = %client.url(), "the event receiver takes events again");
                    }
                    break;
                }
                // The receiver refuses this event: retrying it would not help.
                Ok((status, answer))
                    if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS =>
                {
                    metrics.rejected.inc();
                    warn!(url = %client.url(), %status, answer = %String::from_utf8_lossy(&answer), "the event receiver rejected an event");
                    break;
                }
                Ok((status, _)) => status.to_string(),
                Err(err) => err.to_string(),
            };
            if !std::mem::replace(&mut failing, true) {
                warn!(url = %client.url(), "cannot deliver events, retrying (they queue meanwhile): {failure}");
            }
            metrics.retries.inc();
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(LAST_RETRY);
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
        sync::{Arc, Mutex},
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

    /// A Falcosidekick stand-in: records the bodies it is sent and answers `status`.
    async fn receiver(
        address: SocketAddr,
        status: StatusCode,
    ) -> (Arc<Mutex<Vec<Value>>>, JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind(address).await.unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let bodies = received.clone();
        let server = tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let bodies = bodies.clone();
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let bodies = bodies.clone();
                    async move {
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        bodies
                            .lock()
                            .unwrap()
                            .push(serde_json::from_slice::<Value>(&body).unwrap());
                        let mut response = Response::new(Full::new(Bytes::new()));
                        *response.status_mut() = status;
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
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
        let metrics = HttpSinkMetrics::default();
        let (mut sink, worker) =
            FalcoSink::start(&format!("http://{address}/"), 3, metrics.clone()).unwrap();
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
            .map(|body| body["output_fields"]["fd.name"].clone())
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
        let metrics = HttpSinkMetrics::default();
        let (mut sink, worker) =
            FalcoSink::start(&format!("http://{address}/"), 8, metrics.clone()).unwrap();
        sink.send(&event("/a"));
        sink.send(&event("/b"));
        drop(sink);
        assert!(worker.finish(Duration::from_secs(5)).await);
        assert_eq!(received.lock().unwrap().len(), 2);
        assert_eq!(metrics.rejected.get(), 2);
        assert_eq!(metrics.retries.get(), 0);
        server.abort();
    }
}
