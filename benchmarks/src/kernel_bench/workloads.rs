//! Real workloads like the seeds' Phoronix set, from Debian's packages: the server runs in the
//! target, the load generator in the client cgroup (never a target).

use std::{
    process::{Child, Command},
    time::Duration,
};

use anyhow::Context;
use palisade_agent::targets::Cgroup;
use palisade_benchmarks::kernel::WorkloadSample;

use super::{
    Settings,
    system::{Cgroups, in_cgroup, output, wait_for},
};

const NGINX_CONF: &str = "daemon off;
master_process off;
worker_processes 1;
user root;
pid /tmp/bench/nginx/nginx.pid;
error_log stderr error;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path /tmp/bench/nginx/body;
    proxy_temp_path /tmp/bench/nginx/proxy;
    fastcgi_temp_path /tmp/bench/nginx/fastcgi;
    uwsgi_temp_path /tmp/bench/nginx/uwsgi;
    scgi_temp_path /tmp/bench/nginx/scgi;
    server {
        listen 127.0.0.1:8080;
        root /tmp/bench/nginx/html;
    }
}
";

/// A server in the target, killed when dropped.
struct Server(Child);

impl Server {
    fn start(cgroups: &Cgroups, program: &str, args: &[&str], port: u16) -> anyhow::Result<Self> {
        let log = format!("/tmp/bench/{program}.log");
        let output = std::fs::File::create(&log)?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdout(output.try_clone()?)
            .stderr(output);
        in_cgroup(&mut command, &cgroups.target);
        let mut server = Self(
            command
                .spawn()
                .with_context(|| format!("starting {program}"))?,
        );
        wait_for(program, Duration::from_secs(120), || {
            if let Some(status) = server.0.try_wait()? {
                anyhow::bail!(
                    "{program} exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            Ok(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())
        })?;
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `program` to completion inside `cgroup`; its standard output.
fn run_in(cgroup: &Cgroup, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut command = Command::new(program);
    command.args(args);
    in_cgroup(&mut command, cgroup);
    output(&mut command)
}

/// The number after `label` on the first line holding it.
fn number_after(text: &str, label: &str) -> anyhow::Result<f64> {
    text.lines()
        .find_map(|line| {
            let rest = &line[line.find(label)? + label.len()..];
            rest.trim_start_matches([' ', ':', '(', '"'])
                .split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("no {label:?} in {text}"))
}

/// Every workload once in `state`.
pub fn run(
    settings: &Settings,
    cgroups: &Cgroups,
    state: &str,
    round: usize,
) -> anyhow::Result<Vec<WorkloadSample>> {
    let sample = |workload: &str, value: f64, unit: &str| WorkloadSample {
        state: state.to_owned(),
        round,
        workload: workload.to_owned(),
        value,
        unit: unit.to_owned(),
    };
    let mut samples = Vec::new();
    {
        let _redis = Server::start(
            cgroups,
            "redis-server",
            &[
                "--bind",
                "127.0.0.1",
                "--port",
                "6379",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            6379,
        )?;
        let requests = settings.ops(20_000).to_string();
        let text = run_in(
            &cgroups.client,
            "redis-benchmark",
            &[
                "-p", "6379", "-n", &requests, "-c", "10", "-t", "set,get", "--csv",
            ],
        )?;
        for test in ["SET", "GET"] {
            let rps = number_after(&text, &format!("\"{test}\","))?;
            samples.push(sample(&format!("redis {test}"), rps, "requests/s"));
        }
    }
    {
        std::fs::create_dir_all("/tmp/bench/nginx/html")?;
        std::fs::write(
            "/tmp/bench/nginx/html/index.html",
            "<p>hello</p>\n".repeat(50),
        )?;
        std::fs::write("/tmp/bench/nginx/nginx.conf", NGINX_CONF)?;
        let _nginx = Server::start(
            cgroups,
            "nginx",
            &[
                "-c",
                "/tmp/bench/nginx/nginx.conf",
                "-p",
                "/tmp/bench/nginx",
                "-e",
                "stderr",
            ],
            8080,
        )?;
        let text = run_in(
            &cgroups.client,
            "wrk",
            &["-t", "1", "-c", "10", "-d", "1s", "http://127.0.0.1:8080/"],
        )?;
        samples.push(sample(
            "nginx (wrk)",
            number_after(&text, "Requests/sec")?,
            "requests/s",
        ));
    }
    let events = settings.ops(2_000).to_string();
    let text = run_in(
        &cgroups.target,
        "sysbench",
        &[
            "cpu",
            "--cpu-max-prime=2000",
            "--time=0",
            &format!("--events={events}"),
            "run",
        ],
    )?;
    samples.push(sample(
        "sysbench cpu",
        number_after(&text, "events per second")?,
        "events/s",
    ));
    let total = format!("--memory-total-size={}M", settings.ops(256));
    let text = run_in(
        &cgroups.target,
        "sysbench",
        &["memory", "--time=0", &total, "run"],
    )?;
    samples.push(sample(
        "sysbench memory",
        number_after(&text, "MiB transferred")?,
        "MiB/s",
    ));
    Ok(samples)
}
