//! A real Kubernetes control plane for tests: etcd, kube-apiserver, and the controllers and the
//! scheduler a node's pods need, on loopback (built by scripts/kube-tools.sh), with certificates
//! made here, and the chart installed into it with helm (after a server-side dry run). `cargo
//! xtask kube-test` checks the chart (chart.rs), installs it and runs the Kubernetes suite
//! against this API server.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};

use crate::{cache_dir, chart, run};

/// The address the test VM reaches the API server at (QEMU's guestfwd relays it to loopback).
pub const VM_ADDRESS: &str = "10.0.2.100";
pub const VM_PORT: u16 = 6443;
/// The agent's identity: the chart's service account, as a client certificate, so that the
/// agent runs with exactly the RBAC the chart grants.
const AGENT_USER: &str = "system:serviceaccount:palisade:palisade";
pub const NAMESPACE: &str = "palisade";

fn tools() -> PathBuf {
    std::env::var_os("PALISADE_KUBE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("kube/bin"))
}

pub fn tool(name: &str) -> anyhow::Result<PathBuf> {
    let path = tools().join(name);
    ensure!(
        path.exists(),
        "{} is missing: scripts/kube-tools.sh builds it",
        path.display()
    );
    Ok(path)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The control plane, stopped when dropped.
pub struct ApiServer {
    pub dir: PathBuf,
    pub port: u16,
    processes: Vec<Child>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for process in self.processes.iter_mut().rev() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}

/// A new ECDSA P-256 private key in `path`.
fn ec_key(path: &Path) -> anyhow::Result<()> {
    run(Command::new("openssl")
        .args([
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
        ])
        .arg(path))?;
    Ok(())
}

/// An ECDSA P-256 key and a certificate for `subject` signed by the CA in `dir` (or the CA
/// itself, self-signed).
fn certificate(dir: &Path, name: &str, subject: &str, extensions: &str) -> anyhow::Result<()> {
    let key = dir.join(format!("{name}.key"));
    ec_key(&key)?;
    let cert = dir.join(format!("{name}.crt"));
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(&ext, extensions)?;
    if name == "ca" {
        run(Command::new("openssl")
            .args([
                "req", "-x509", "-new", "-days", "2", "-subj", subject, "-key",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .arg("-extensions")
            .arg("v3")
            .arg("-config")
            .arg(&ext))?;
    } else {
        let csr = dir.join(format!("{name}.csr"));
        run(Command::new("openssl")
            .args(["req", "-new", "-subj", subject, "-key"])
            .arg(&key)
            .arg("-out")
            .arg(&csr))?;
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-CAcreateserial", "-in"])
            .arg(&csr)
            .arg("-CA")
            .arg(dir.join("ca.crt"))
            .arg("-CAkey")
            .arg(dir.join("ca.key"))
            .arg("-out")
            .arg(&cert)
            .arg("-extfile")
            .arg(&ext))?;
    }
    Ok(())
}

/// A kubeconfig for `user` reaching `server`, its files under `files` (host or VM paths).
fn kubeconfig(server: &str, user: &str, files: &Path) -> String {
    let file = |name: &str| files.join(name).display().to_string();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: {user}\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: {user}\ncurrent-context: test\n",
        file("ca.crt"),
        file(&format!("{user}.crt")),
        file(&format!("{user}.key")),
    )
}

impl ApiServer {
    /// Starts etcd and kube-apiserver with fresh state in `dir`; returns once /readyz says so.
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        certificate(
            &dir,
            "ca",
            "/CN=palisade-test-ca",
            "[v3]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n",
        )?;
        certificate(
            &dir,
            "apiserver",
            "/CN=kube-apiserver",
            &format!(
                "subjectAltName=IP:127.0.0.1,IP:{VM_ADDRESS},DNS:localhost,DNS:kubernetes\nextendedKeyUsage=serverAuth\n"
            ),
        )?;
        certificate(
            &dir,
            "admin",
            "/O=system:masters/CN=admin",
            "extendedKeyUsage=clientAuth\n",
        )?;
        certificate(
            &dir,
            "agent",
            &format!("/CN={AGENT_USER}"),
            "extendedKeyUsage=clientAuth\n",
        )?;
        // The kubelet of the node suite's VM.
        certificate(
            &dir,
            "node",
            "/O=system:nodes/CN=system:node:palisade-vm",
            "extendedKeyUsage=clientAuth\n",
        )?;
        ec_key(&dir.join("sa.key"))?;
        run(Command::new("openssl")
            .args(["ec", "-pubout", "-in"])
            .arg(dir.join("sa.key"))
            .arg("-out")
            .arg(dir.join("sa.pub")))?;

        let (etcd_port, peer_port, port) = (free_port()?, free_port()?, free_port()?);
        let mut server = Self {
            dir: dir.clone(),
            port,
            processes: Vec::new(),
        };
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let file = |name: &str| dir.join(name).display().to_string();
        server.spawn(
            "etcd",
            &[
                "--data-dir",
                &file("etcd"),
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("default={peer_url}"),
                "--unsafe-no-fsync",
            ],
        )?;
        server.spawn(
            "kube-apiserver",
            &[
                "--etcd-servers",
                &etcd_url,
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &port.to_string(),
                "--client-ca-file",
                &file("ca.crt"),
                "--tls-cert-file",
                &file("apiserver.crt"),
                "--tls-private-key-file",
                &file("apiserver.key"),
                "--service-account-issuer",
                "https://kubernetes.default.svc",
                "--service-account-key-file",
                &file("sa.pub"),
                "--service-account-signing-key-file",
                &file("sa.key"),
                "--service-cluster-ip-range",
                "10.0.0.0/24",
                "--authorization-mode",
                "RBAC",
                "--endpoint-reconciler-type",
                "none",
            ],
        )?;
        for user in ["admin", "agent", "node"] {
            std::fs::write(
                dir.join(format!("{user}.kubeconfig")),
                kubeconfig(&format!("https://127.0.0.1:{port}"), user, &dir),
            )?;
        }
        let started = Instant::now();
        while server.get("/readyz").is_err() {
            if started.elapsed() > Duration::from_secs(60) {
                bail!(
                    "kube-apiserver not ready after 60 s; see {}",
                    dir.join("kube-apiserver.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        server.start_controllers()?;
        Ok(server)
    }

    /// The controllers the tests' objects need (namespaces' `default` service accounts, the CA
    /// that service account volumes carry, DaemonSets' pods, and the deletion of what an owner
    /// leaves) and the scheduler (which places DaemonSets' pods), as admin. No other controller:
    /// the pods of the tests' fake nodes must stay.
    fn start_controllers(&mut self) -> anyhow::Result<()> {
        let admin = self.kubeconfig("admin").display().to_string();
        let root_ca = self.dir.join("ca.crt").display().to_string();
        self.spawn(
            "kube-controller-manager",
            &[
                "--kubeconfig",
                &admin,
                "--controllers",
                "serviceaccount,root-ca-cert-publisher,daemonset,garbagecollector",
                "--root-ca-file",
                &root_ca,
                "--leader-elect=false",
                "--secure-port=0",
            ],
        )?;
        self.spawn(
            "kube-scheduler",
            &[
                "--kubeconfig",
                &admin,
                "--leader-elect=false",
                "--secure-port=0",
            ],
        )
    }

    /// Starts tool `name` with `args`, its output in DIR/NAME.log; it stops with the server.
    fn spawn(&mut self, name: &str, args: &[&str]) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let process = Command::new(tool(name)?)
            .args(args)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        self.processes.push(process);
        Ok(())
    }

    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        self.dir.join(format!("{user}.kubeconfig"))
    }

    /// The files a VM needs to reach this server as `user` at VM_ADDRESS, with the kubeconfig's
    /// paths under `vm_dir`: (host file, VM path).
    pub fn vm_files(&self, user: &str, vm_dir: &Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
        let config = self.dir.join(format!("{user}.vm.kubeconfig"));
        std::fs::write(
            &config,
            kubeconfig(&format!("https://{VM_ADDRESS}:{VM_PORT}"), user, vm_dir),
        )?;
        let vm = |name: &str| vm_dir.join(name).display().to_string();
        Ok(vec![
            (config, vm(&format!("{user}.kubeconfig"))),
            (self.dir.join("ca.crt"), vm("ca.crt")),
            (
                self.dir.join(format!("{user}.crt")),
                vm(&format!("{user}.crt")),
            ),
            (
                self.dir.join(format!("{user}.key")),
                vm(&format!("{user}.key")),
            ),
        ])
    }

    /// GET `path` as admin.
    pub fn get(&self, path: &str) -> anyhow::Result<String> {
        let file = |name: &str| self.dir.join(name);
        run(Command::new("curl")
            .args(["--silent", "--show-error", "--fail", "--cacert"])
            .arg(file("ca.crt"))
            .arg("--cert")
            .arg(file("admin.crt"))
            .arg("--key")
            .arg(file("admin.key"))
            .arg(format!("https://127.0.0.1:{}{path}", self.port)))
    }

    fn helm(&self) -> anyhow::Result<Command> {
        let mut helm = Command::new(tool("helm")?);
        helm.arg("--kubeconfig").arg(self.kubeconfig("admin"));
        Ok(helm)
    }

    /// Installs the chart (its CRDs, RBAC, DaemonSet...) with `values` (helm arguments) as a
    /// user would, after a server-side dry run.
    pub fn install_chart(&self, chart: &Path, values: &[&str]) -> anyhow::Result<()> {
        for dry_run in [true, false] {
            let mut helm = self.helm()?;
            helm.args(["install", "palisade"]).arg(chart).args([
                "--namespace",
                NAMESPACE,
                "--create-namespace",
                "--wait=false",
            ]);
            helm.args(values);
            if dry_run {
                helm.arg("--dry-run=server");
            }
            run(&mut helm)?;
        }
        Ok(())
    }
}

/// `cargo xtask kube-test`.
pub fn test() -> anyhow::Result<()> {
    let root = crate::workspace();
    let chart = root.join("charts/palisade");
    let server = ApiServer::start(&root.join("target/kube"))?;
    chart::check(&server, &chart, &root.join("examples/kubernetes"))?;
    server.install_chart(&chart, &[])?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "test",
            "--locked",
            "--package",
            "palisade-kube-tests",
            "--",
            "--test-threads=1",
        ])
        .env("KUBECONFIG", server.kubeconfig("admin"))
        .env("PALISADE_AGENT_KUBECONFIG", server.kubeconfig("agent"))
        .status()?;
    ensure!(status.success(), "the Kubernetes tests failed");
    Ok(())
}
