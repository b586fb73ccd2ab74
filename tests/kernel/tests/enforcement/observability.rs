//! What the agent lets operators see: its HTTP endpoints, metrics counted in the kernel (per
//! rule, throttled, dropped, and what decisions cost), parsed as Prometheus would, the Grafana
//! dashboard over them, and `palisade top` reading them.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use palisade_kernel_tests::{
    Answer, EPERM, Kernel, Prober, binary, deny_read, file, policy, probe, sh,
};

use super::{Agent, cleanup_agent, fresh_dir, wait_until, write_policy};

/// GET `path` from the agent's HTTP endpoints: (status code, body).
pub(super) fn http_get(path: &str) -> std::io::Result<(u16, String)> {
    let (head, body) = http_exchange(path, "")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok((status, body))
}

/// The head (lowercase) and body of the answer to a GET of `path` with `headers` (each line
/// ending in CRLF).
fn http_exchange(path: &str, headers: &str) -> std::io::Result<(String, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect("127.0.0.1:9464")?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((head.to_ascii_lowercase(), body.to_owned()))
}

pub(super) fn wait_until_ready(agent: &Agent) {
    wait_until(
        || http_get("/readyz").is_ok_and(|(status, _)| status == 200),
        || format!("never ready: {}", agent.log()),
    );
}

/// Scrapes `/metrics` until `ready` makes something of a scrape (for 60 s at most): that.
fn scrape_until<T>(agent: &Agent, what: &str, ready: impl Fn(&Scrape) -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        let scrape = Scrape::now();
        if let Some(found) = ready(&scrape) {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never {what}: {}{}",
            scrape.text,
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `/metrics` as parsed by a Prometheus text-format parser.
pub(super) struct Scrape {
    samples: prometheus_parse::Scrape,
    pub(super) text: String,
}

impl Scrape {
    pub(super) fn now() -> Self {
        let (status, text) = http_get("/metrics").unwrap();
        assert_eq!(status, 200, "{text}");
        let samples = prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_owned())))
            .unwrap_or_else(|err| panic!("{err}: {text}"));
        Self { samples, text }
    }

    /// The value of the sample `name` with (at least) `labels`; None if there is none.
    pub(super) fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        use prometheus_parse::Value;
        let sample = self.samples.samples.iter().find(|sample| {
            sample.metric == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(key) == Some(*value))
        })?;
        match sample.value {
            Value::Counter(value) | Value::Gauge(value) | Value::Untyped(value) => Some(value),
            _ => None,
        }
    }

    pub(super) fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no {name} {labels:?} in {}", self.text))
    }
}

#[test]
fn agent_serves_metrics_health_and_readiness() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "metrics");
    let secret = file("/tmp/metrics/secret");
    let dir = fresh_dir("/tmp/metrics-policies");
    write_policy(
        &format!("{dir}/app.yaml"),
        "app",
        target.path.to_str().unwrap(),
        secret,
    );
    let bpffs = "/sys/fs/bpf/palisade-test-metrics";
    let agent = Agent::start_with(dir, bpffs, "metrics", &["--bpf-stats"]);
    wait_until_ready(&agent);
    assert_eq!(http_get("/healthz").unwrap().0, 200);
    const VIOLATIONS: usize = 5;
    for _ in 0..VIOLATIONS {
        assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
    }
    let scrape = Scrape::now();
    let rule = [
        ("policy", "app"),
        ("rule", "customRules.files[0]"),
        ("hook", "file_open"),
        ("action", "deny"),
    ];
    assert_eq!(
        scrape.value("palisade_rule_decisions_total", &rule),
        VIOLATIONS as f64
    );
    assert_eq!(
        scrape.value("palisade_rule_events_throttled_total", &rule),
        0.0
    );
    assert_eq!(
        scrape.value("palisade_events_total", &[]),
        VIOLATIONS as f64
    );
    assert_eq!(scrape.value("palisade_events_dropped_total", &[]), 0.0);
    assert_eq!(scrape.value("palisade_targets", &[]), 1.0);
    assert_eq!(scrape.value("palisade_policies", &[]), 1.0);
    assert_eq!(scrape.value("palisade_policy_errors", &[]), 0.0);
    assert!(scrape.value("process_resident_memory_bytes", &[]) > 0.0);
    for map in ["targets", "path_prefixes", "policies", "rule_counts"] {
        assert!(scrape.value("palisade_bpf_map_memory_bytes", &[("map", map)]) > 0.0);
    }
    // What decisions cost: every decision about the target is timed, by hook and rule class;
    // every program run by the kernel's statistics (on all tasks, so at least as many).
    let file_open = [("rule_class", "files"), ("hook", "file_open")];
    let evaluations = scrape.value("palisade_rule_evaluations_total", &file_open);
    assert!(evaluations >= VIOLATIONS as f64, "{}", scrape.text);
    assert!(scrape.value("palisade_rule_evaluation_seconds_total", &file_open) > 0.0);
    assert!(scrape.value("palisade_hook_runs_total", &[("hook", "file_open")]) >= evaluations);
    assert!(scrape.value("palisade_hook_run_seconds_total", &[("hook", "file_open")]) > 0.0);
    // The classic text format unless a scraper asks for OpenMetrics (Prometheus does), as
    // Prometheus' own clients answer; Debian's promtool (Prometheus 2.42) reads it cleanly.
    let (head, classic) = http_exchange("/metrics", "").unwrap();
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let mut promtool = Command::new(binary("PALISADE_PROMTOOL"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(classic.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}{}\n{classic}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let prometheus =
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n";
    let (head, openmetrics) = http_exchange("/metrics", prometheus).unwrap();
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    assert!(
        openmetrics.contains("# TYPE palisade_events counter"),
        "{openmetrics}"
    );
    // `palisade top` shows the same counts.
    let top = Command::new(binary("PALISADE_BIN"))
        .args(["top", "--once"])
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.status.success(),
        "{screen}{}",
        String::from_utf8_lossy(&top.stderr)
    );
    let row = screen
        .lines()
        .find(|line| line.contains("customRules.files[0]"))
        .unwrap_or_else(|| panic!("no rule row in {screen}"));
    assert!(
        row.split_whitespace()
            .any(|field| field == VIOLATIONS.to_string()),
        "{screen}"
    );
    assert!(screen.contains("file_open"), "{screen}");
    // Into a pipe: one screen after another, no terminal control codes; the reader leaving ends
    // it quietly.
    let mut top = Command::new(binary("PALISADE_BIN"))
        .args(["top", "--interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut piped = String::new();
    let mut reader = BufReader::new(top.stdout.take().unwrap());
    while piped.matches("customRules.files[0]").count() < 2 {
        assert_ne!(reader.read_line(&mut piped).unwrap(), 0, "{piped}");
    }
    drop(reader);
    let ended = top.wait_with_output().unwrap();
    assert!(
        ended.status.success(),
        "{ended:?}: {}",
        String::from_utf8_lossy(&ended.stderr)
    );
    assert!(!piped.contains('\x1b'), "{piped:?}");
    assert!(piped.starts_with("palisade top "), "{piped}");
    assert_eq!(piped.matches("\n\npalisade top ").count(), 1, "{piped}");
    assert_eq!(http_get("/nothing").unwrap().0, 404);
    // A removed policy's series leave the exposition once its entries are deleted.
    std::fs::remove_file(format!("{dir}/app.yaml")).unwrap();
    wait_until(
        || {
            let scrape = Scrape::now();
            scrape.get("palisade_rule_decisions_total", &rule).is_none()
                && scrape.value("palisade_policies", &[]) == 0.0
        },
        || format!("the removed policy's series stay: {}", Scrape::now().text),
    );
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
}

/// Every metric name of the agent's in `text`: a word that starts with "palisade_", or
/// "process_" (the standard process metrics).
fn metric_names(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("palisade_") || word.starts_with("process_"))
        .map(str::to_owned)
        .collect()
}

/// Expressions and query variables' definitions anywhere in a Grafana dashboard.
fn queries(value: &serde_json::Value, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(object) => {
            for (key, value) in object {
                match (key.as_str(), value) {
                    ("expr" | "definition", serde_json::Value::String(query)) => {
                        found.push(query.clone())
                    }
                    _ => queries(value, found),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| queries(item, found)),
        _ => {}
    }
}

/// Every expression of the Grafana dashboard and of the chart's alerts reads metrics
/// `exposition` (the classic text format) declares.
pub(super) fn dashboard_and_alerts_read_only_exported_metrics(exposition: &str) {
    let exported: BTreeSet<String> = exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .flat_map(|declared| {
            let (family, kind) = declared.split_once(' ').unwrap_or((declared, ""));
            let suffixes: &[&str] = match kind {
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            suffixes
                .iter()
                .map(move |suffix| format!("{family}{suffix}"))
        })
        .collect();
    let dashboard: serde_json::Value = serde_json::from_str(include_str!(
        "../../../../charts/palisade/dashboards/palisade.json"
    ))
    .expect("the dashboard is JSON");
    let mut found = Vec::new();
    queries(&dashboard, &mut found);
    assert!(found.len() > 20, "{found:?}");
    for query in &found {
        let names = metric_names(query);
        assert!(!names.is_empty(), "{query} reads no metric of the agent's");
        for name in names {
            assert!(
                exported.contains(&name),
                "{query}: {name} is not exported (exported: {exported:?})"
            );
        }
    }
    // The template's only `palisade_` and `process_` words are the alerts' metrics (its own
    // names are `palisade.name` and such).
    let alerts = metric_names(include_str!(
        "../../../../charts/palisade/templates/prometheusrule.yaml"
    ));
    assert!(alerts.len() >= 5, "{alerts:?}");
    for name in alerts {
        assert!(
            exported.contains(&name),
            "the alerts read {name}, which is not exported (exported: {exported:?})"
        );
    }
}

/// A Falcosidekick stand-in on a loopback port: answers 200 to every POST and keeps the bodies.
struct Receiver {
    address: SocketAddr,
    bodies: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Receiver {
    fn start() -> Self {
        Self::listen(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
    }

    fn listen(listener: std::net::TcpListener) -> Self {
        use std::io::{BufRead, BufReader, Read, Write};
        let address = listener.local_addr().unwrap();
        let bodies: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let received = bodies.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                // Requests on one kept-alive connection, one after the other.
                loop {
                    let mut length = 0;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    if line.is_empty() {
                        break; // the client closed the connection
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    received
                        .lock()
                        .unwrap()
                        .push(serde_json::from_slice(&body).unwrap());
                    let _ = writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                }
            }
        });
        Self { address, bodies }
    }
}

/// Falcosidekick down for 30 s, then back: the denials go on, the events the agent queued arrive
/// in order once it is back, and those its full queue could not take are counted.
#[test]
fn falcosidekick_down_for_30_s_gets_what_was_queued_in_order_and_the_overflow_counted() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "sidekick");
    // One file per denial: the order shows in the events' paths.
    let files: Vec<String> = (0..12)
        .map(|index| file(&format!("/tmp/sidekick/secret-{index:02}")).to_owned())
        .collect();
    let dir = fresh_dir("/tmp/sidekick-policies");
    let cgroup = target.path.to_str().unwrap();
    write_policy(
        &format!("{dir}/app.yaml"),
        "sidekick",
        cgroup,
        "/tmp/sidekick/**",
    );
    // A free port, with nothing listening on it yet.
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{address}/");
    let bpffs = "/sys/fs/bpf/palisade-test-sidekick";
    let agent = Agent::start_with(
        dir,
        bpffs,
        "sidekick",
        &[
            "--audit-rate",
            "0",
            "--falcosidekick-url",
            &url,
            "--falcosidekick-queue",
            "8",
        ],
    );
    wait_until_ready(&agent);
    let down = Instant::now();
    let until = |what: &str, done: &dyn Fn(&Scrape) -> bool| {
        scrape_until(&agent, what, |scrape| done(scrape).then_some(()))
    };
    let outcome = |scrape: &Scrape, outcome: &str| {
        scrape.value("palisade_http_sink_events_total", &[("outcome", outcome)])
    };
    // The agent holds the first event, retrying; its queue takes eight more; three overflow.
    assert_eq!(probe(Some(&target), &["read", &files[0]]), EPERM);
    until("retried", &|scrape| {
        scrape.value("palisade_http_sink_retries_total", &[]) > 0.0
    });
    for file in &files[1..] {
        assert_eq!(probe(Some(&target), &["read", file]), EPERM);
    }
    until("queued and overflowed", &|scrape| {
        scrape.value("palisade_events_written_total", &[]) == 12.0
    });
    let scrape = Scrape::now();
    assert_eq!(outcome(&scrape, "overflow"), 3.0);
    assert_eq!(
        scrape.value("palisade_events_lost_total", &[("sink", &url)]),
        3.0
    );
    assert_eq!(scrape.value("palisade_http_sink_queue_length", &[]), 8.0);
    assert_eq!(outcome(&scrape, "sent"), 0.0);
    // Back after 30 s: what was queued arrives, in order.
    std::thread::sleep(Duration::from_secs(30).saturating_sub(down.elapsed()));
    let falcosidekick = Receiver::listen(std::net::TcpListener::bind(address).unwrap());
    until("delivered", &|scrape| outcome(scrape, "sent") == 9.0);
    let paths: Vec<serde_json::Value> = falcosidekick
        .bodies
        .lock()
        .unwrap()
        .iter()
        .map(|body| body["output_fields"]["fd.name"].clone())
        .collect();
    assert_eq!(paths, files[..9]);
    agent.wait_for_log("the event receiver takes events again");
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
}

#[test]
fn a_flood_of_violations_is_throttled_in_the_kernel_and_every_denial_still_happens() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "throttle");
    let secret = file("/tmp/throttle/secret");
    let dir = fresh_dir("/tmp/throttle-policies");
    write_policy(
        &format!("{dir}/app.yaml"),
        "flood",
        target.path.to_str().unwrap(),
        secret,
    );
    let bpffs = "/sys/fs/bpf/palisade-test-throttle";
    const RATE: f64 = 10.0;
    const BURST: f64 = 5.0;
    let falcosidekick = Receiver::start();
    let agent = Agent::start_with(
        dir,
        bpffs,
        "throttle",
        &[
            "--audit-rate",
            "10",
            "--audit-burst",
            "5",
            "--falcosidekick-url",
            &format!("http://{}/", falcosidekick.address),
        ],
    );
    wait_until_ready(&agent);
    let started = Instant::now();
    let prober = Prober::start(&target, secret, "/tmp/throttle/stop");
    std::thread::sleep(Duration::from_secs(3));
    let report = prober.finish();
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!((report.ok, report.other), (0, 0), "{report:?}");
    let scrape = Scrape::now();
    let rule = [("policy", "flood"), ("rule", "customRules.files[0]")];
    let denied = scrape.value("palisade_rule_decisions_total", &rule);
    let throttled = scrape.value("palisade_rule_events_throttled_total", &rule);
    assert_eq!(denied, report.eperm as f64, "every denial counted");
    assert_eq!(
        scrape.value("palisade_events_throttled_total", &[]),
        throttled
    );
    assert_eq!(scrape.value("palisade_events_dropped_total", &[]), 0.0);
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    assert!(
        log.contains("audit events suppressed by the audit rate"),
        "{log}"
    );
    cleanup_agent(bpffs);
    let events: Vec<serde_json::Value> = std::fs::read_to_string("/tmp/throttle-events.jsonl")
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let emitted = events.len() as f64;
    assert!(
        emitted >= BURST && emitted <= BURST + RATE * elapsed + 1.0,
        "{emitted} events in {elapsed:.1} s"
    );
    assert_eq!(
        emitted + throttled,
        denied,
        "each denial is an event or throttled"
    );
    // Events after a suppressed stretch say how many were held back.
    let summarised: f64 = events
        .iter()
        .filter_map(|event| event["suppressed"].as_f64())
        .sum();
    assert!(
        summarised > 0.0 && summarised <= throttled,
        "{summarised} of {throttled}"
    );
    // Falcosidekick got the same events, in Falco's format.
    let posted = falcosidekick.bodies.lock().unwrap().clone();
    assert_eq!(posted.len(), events.len());
    for body in &posted {
        assert_eq!(body["rule"], "customRules.files[0]");
        assert_eq!(body["priority"], "Warning");
        assert_eq!(body["output_fields"]["fd.name"], secret);
    }
}

/// A flood of violations far beyond what the agent can write (unpaced reads for 5 s, the ring
/// buffer overflowing) and then a trickle (20 a second for 5 s): the agent keeps writing, every
/// event of the trickle is written, and every decision is accounted for: written, dropped by the
/// kernel (ring buffer full) or by the agent (its queue full), throttled, or still queued. An
/// agent stopped during a flood stops in bounded time.
#[test]
fn a_flood_never_blinds_the_event_pipeline() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "blind");
    let (flood, trickle) = (file("/tmp/blind/flood"), file("/tmp/blind/trickle"));
    let dir = fresh_dir("/tmp/blind-policies");
    let cgroup = target.path.to_str().unwrap();
    let denied = format!("{flood}, {trickle}");
    write_policy(&format!("{dir}/app.yaml"), "blind", cgroup, &denied);
    let bpffs = "/sys/fs/bpf/palisade-test-blind";
    let agent = Agent::start_with(dir, bpffs, "blind", &["--audit-rate", "0"]);
    wait_until_ready(&agent);
    let prober = Prober::start(&target, flood, "/tmp/blind/stop");
    std::thread::sleep(Duration::from_secs(5));
    let flooded = prober.finish();
    assert_eq!((flooded.ok, flooded.other), (0, 0), "{flooded:?}");
    let trickled = 100;
    for _ in 0..trickled {
        assert_eq!(probe(Some(&target), &["read", trickle]), EPERM);
        std::thread::sleep(Duration::from_millis(50));
    }
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string("/tmp/blind-events.jsonl")
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    };
    // Within moments, every event submitted is written or counted as dropped by the agent, and
    // the file holds what it counts as written (a batch is in the file a moment before it is
    // counted: asked again).
    let written = scrape_until(&agent, "every event handled", |scrape| {
        let written = lines();
        let written_total = scrape.value("palisade_events_written_total", &[]);
        let handled = written_total
            + scrape.value("palisade_events_overflowed_total", &[])
            + scrape.value("palisade_events_undecodable_total", &[]);
        let submitted = scrape.value("palisade_events_total", &[]);
        (handled == submitted && written.len() as f64 == written_total).then(|| {
            assert_eq!(scrape.value("palisade_events_queued", &[]), 0.0);
            written
        })
    });
    // Every event handled: the counts stand still from here.
    let scrape = Scrape::now();
    let denied = scrape.value("palisade_rule_decisions_total", &[("policy", "blind")]);
    assert_eq!(denied, (flooded.eperm + trickled) as f64);
    let submitted = scrape.value("palisade_events_total", &[]);
    assert!(written.len() > 4 * 1024, "{} events written", written.len());
    let dropped = scrape.value("palisade_events_dropped_total", &[]);
    let throttled = scrape.value("palisade_events_throttled_total", &[]);
    assert_eq!(
        submitted + dropped + throttled,
        denied,
        "every decision accounted for"
    );
    let trickle_events = written
        .iter()
        .filter(|event| event["path"] == trickle)
        .count();
    assert_eq!(
        trickle_events,
        trickled as usize,
        "every event of the trickle written ({} written, {dropped} dropped)",
        written.len()
    );
    // Stopping during a flood it cannot keep up with (one prober's it can, on the one vCPU they
    // share) ends in bounded time, and says what was left unread.
    let probers: Vec<Prober> = (0..3)
        .map(|_| Prober::start(&target, flood, "/tmp/blind/stop"))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let stopping = Instant::now();
    let (stopped, log) = agent.stop(libc::SIGTERM);
    let took = stopping.elapsed();
    for prober in probers {
        prober.finish();
    }
    assert!(stopped, "{log}");
    assert!(took < Duration::from_secs(20), "stopping took {took:?}");
    assert!(log.contains("stopping with audit events unread"), "{log}");
    cleanup_agent(bpffs);
}

/// The event file's file system full, then read-only: the target is denied all along, what
/// cannot be written is counted lost and the failure logged, the file never keeps part of a
/// batch, and writing resumes once the file system is writable and has room again.
#[test]
fn a_full_then_read_only_event_file_system_stops_no_denial_and_writing_resumes() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "full");
    let secret = file("/tmp/full/secret");
    let dir = fresh_dir("/tmp/full-policies");
    write_policy(
        &format!("{dir}/app.yaml"),
        "full",
        target.path.to_str().unwrap(),
        secret,
    );
    // The events on a file system of their own, small enough to fill.
    let mount = fresh_dir("/tmp/full-events");
    sh(&format!("mount -t tmpfs -o size=64k full-events {mount}"));
    let events = format!("{mount}/events.jsonl");
    let filler = format!("{mount}/filler");
    let bpffs = "/sys/fs/bpf/palisade-test-full";
    let agent = Agent::start_with(
        dir,
        bpffs,
        "full",
        &["--audit-rate", "0", "--events", &events],
    );
    wait_until_ready(&agent);
    let deny = |times: usize| {
        for _ in 0..times {
            assert_eq!(probe(Some(&target), &["read", secret]), EPERM);
        }
    };
    // Once the agent has handled every event submitted, each written whole or counted lost:
    // (written, lost).
    let handled = || {
        scrape_until(&agent, "every event written or lost", |scrape| {
            let text = std::fs::read_to_string(&events).unwrap();
            for line in text.lines() {
                serde_json::from_str::<serde_json::Value>(line)
                    .unwrap_or_else(|err| panic!("{err}: a broken line {line:?}"));
            }
            let written = text.lines().count() as f64;
            let lost = scrape
                .get("palisade_events_lost_total", &[("sink", &events)])
                .unwrap_or(0.0);
            (written + lost == scrape.value("palisade_events_total", &[]))
                .then_some((written, lost))
        })
    };
    deny(5);
    assert_eq!(handled(), (5.0, 0.0));
    // Full: enough denials that their events cannot all fit in what room the file had.
    sh(&format!(
        "dd if=/dev/zero of={filler} bs=1k 2>/dev/null; true"
    ));
    deny(20);
    let (written, lost) = handled();
    assert!(lost > 0.0, "{written} written");
    agent.wait_for_log("No space left on device");
    // Read-only, once the agent closed the file after a failed write (a file system with a
    // file open for writing cannot be made read-only, "Device or resource busy"): another
    // denial while it is open. Output, not status: what mount prints stays off the console.
    let started = Instant::now();
    while !Command::new("mount")
        .args(["-o", "remount,ro", mount])
        .output()
        .unwrap()
        .status
        .success()
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the event file stayed open"
        );
        deny(1);
        std::thread::sleep(Duration::from_millis(200));
    }
    let (written, lost) = handled();
    deny(5);
    assert_eq!(handled(), (written, lost + 5.0));
    agent.wait_for_log("Read-only file system");
    // Writable, with room: writing resumes.
    sh(&format!("mount -o remount,rw {mount} && rm {filler}"));
    deny(5);
    assert_eq!(handled(), (written + 5.0, lost + 5.0));
    agent.wait_for_log("writing audit events again");
    let (stopped, log) = agent.stop(libc::SIGTERM);
    assert!(stopped, "{log}");
    cleanup_agent(bpffs);
    sh(&format!("umount {mount}"));
}

/// Makes `depth` directories `name` one inside the other in `root`, and the file `file` in the
/// deepest, each relative to its parent's descriptor: the only way to a path over PATH_MAX.
fn deep_tree(root: &str, name: &str, depth: usize, file: &str) {
    use std::{
        ffi::CString,
        os::fd::{AsRawFd, FromRawFd, OwnedFd},
    };
    let (name, file) = (CString::new(name).unwrap(), CString::new(file).unwrap());
    let mut dir = OwnedFd::from(std::fs::File::open(root).unwrap());
    for _ in 0..depth {
        // SAFETY: system calls on a descriptor owned here, with NUL-terminated names.
        let made = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) };
        assert_eq!(made, 0, "{}", std::io::Error::last_os_error());
        // SAFETY: as above.
        let next = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        assert!(next >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: a descriptor just opened, owned by nothing else.
        dir = unsafe { OwnedFd::from_raw_fd(next) };
    }
    // SAFETY: as above.
    let created = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            file.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    assert!(created >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: as above.
    drop(unsafe { OwnedFd::from_raw_fd(created) });
}

#[test]
fn a_path_longer_than_path_max_is_allowed_undecided_and_counted() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "deep");
    let near = file("/tmp/deep/near/secret");
    kernel.apply(&target, policy("deep", &deny_read("/tmp/deep/**/secret")));
    assert_eq!(probe(Some(&target), &["read", near]), EPERM);
    // /tmp/deep/D/.../D/secret: 20 components of 250 bytes, over PATH_MAX (4096 bytes).
    let component = "d".repeat(250);
    deep_tree("/tmp/deep", &component, 20, "secret");
    let mut args = vec!["read-within", "/tmp/deep"];
    args.extend([component.as_str(); 20]);
    args.push("secret");
    let before = kernel.enforcer().stats().unwrap();
    assert_eq!(probe(Some(&target), &args), Answer::Ok);
    let after = kernel.enforcer().stats().unwrap();
    assert!(after.undecided > before.undecided, "{before:?} {after:?}");
    // Outside the target, where nothing is decided, nothing is counted.
    assert_eq!(probe(None, &args), Answer::Ok);
    assert_eq!(
        kernel.enforcer().stats().unwrap().undecided,
        after.undecided
    );
}

#[test]
fn ring_buffer_overflow_is_counted_not_silent() {
    let mut kernel = Kernel::new();
    let target = kernel.cgroup(None, "flood");
    let secret = file("/tmp/flood/secret");
    kernel.apply(&target, policy("flood", &deny_read(secret)));
    let before = kernel.enforcer().stats().unwrap();
    // Nobody reads the ring buffer meanwhile: denials outrun its capacity.
    let prober = Prober::start(&target, secret, "/tmp/flood/stop");
    let started = Instant::now();
    while kernel.enforcer().stats().unwrap().events_dropped == before.events_dropped {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the ring buffer never filled"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let report = prober.finish();
    let after = kernel.enforcer().stats().unwrap();
    let received = kernel.events().len() as u64;
    assert_eq!(after.events - before.events, received, "{report:?}");
    assert_eq!(
        received + (after.events_dropped - before.events_dropped),
        report.eperm,
        "every denial is an event or a counted drop"
    );
}
