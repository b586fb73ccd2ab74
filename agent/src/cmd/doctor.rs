//! `palisade doctor`: can this machine enforce, and if not, which check fails and why.

use std::{io::Write, path::PathBuf};

use aya::{
    programs::{LsmAttachType, ProgramType},
    sys::is_program_supported,
};
use serde::Serialize;

use super::{Output, write_json};
use crate::{
    bpf::{Enforcer, KERNEL_BTF, Preflight},
    targets::{Hierarchy, find_mount},
};

/// What the checks found, in the order a person would debug them (`--output json` prints it).
#[derive(Debug, Serialize)]
struct Report {
    kernel: String,
    root: bool,
    /// The active LSMs; None when neither securityfs nor `lsm=` tells.
    lsm_list: Option<LsmList>,
    kernel_btf: bool,
    cgroup_v2: CgroupV2,
    /// Where bpffs is mounted (only needed to pin).
    bpffs: Option<PathBuf>,
    program_types: Vec<ProgramTypeCheck>,
    /// Why Palisade's own programs did not load and attach; None when they did.
    programs_error: Option<String>,
    /// Whether Palisade can enforce here: its programs load and attach.
    ready: bool,
}

#[derive(Debug, Serialize)]
struct LsmList {
    list: String,
    source: &'static str,
    bpf: bool,
}

/// Where the cgroup v2 hierarchy is mounted, or why it was not found.
#[derive(Debug, Serialize)]
struct CgroupV2 {
    mount: Option<PathBuf>,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct ProgramTypeCheck {
    #[serde(rename = "type")]
    program_type: &'static str,
    loads: bool,
    /// Why the kernel refused a test program; None when it loads or the type is unsupported.
    error: Option<String>,
}

impl Report {
    fn gather() -> Self {
        let preflight = Preflight::run();
        let types = [
            ("lsm", ProgramType::Lsm(LsmAttachType::Mac)),
            ("tracing (fentry)", ProgramType::Tracing),
            ("kprobe", ProgramType::KProbe),
            ("tracepoint", ProgramType::TracePoint),
            ("cgroup_sock_addr", ProgramType::CgroupSockAddr),
        ];
        let program_types = types
            .into_iter()
            .map(|(name, program_type)| {
                let (loads, error) = match is_program_supported(program_type) {
                    Ok(loads) => (loads, None),
                    Err(err) => (
                        false,
                        Some(format!(
                            "{err}: {}",
                            std::error::Error::source(&err)
                                .map(ToString::to_string)
                                .unwrap_or_default()
                        )),
                    ),
                };
                ProgramTypeCheck {
                    program_type: name,
                    loads,
                    error,
                }
            })
            .collect();
        let programs_error = Enforcer::load().err().map(|err| err.to_string());
        Self {
            kernel: preflight.kernel,
            root: preflight.root,
            lsm_list: preflight.lsm_list.map(|lsm| LsmList {
                bpf: lsm.has_bpf(),
                list: lsm.list,
                source: lsm.source,
            }),
            kernel_btf: preflight.btf,
            cgroup_v2: match Hierarchy::find() {
                Ok(cgroup2) => CgroupV2 {
                    mount: Some(cgroup2.mount),
                    error: None,
                },
                Err(err) => CgroupV2 {
                    mount: None,
                    error: Some(err.to_string()),
                },
            },
            bpffs: find_mount("bpf").map(|mount| mount.point),
            program_types,
            ready: programs_error.is_none(),
            programs_error,
        }
    }

    fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(out, "kernel           {}", self.kernel)?;
        if self.root {
            writeln!(out, "user             root: ok")?;
        } else {
            writeln!(
                out,
                "user             FAIL: not root; loading BPF LSM programs needs root"
            )?;
        }
        match &self.lsm_list {
            Some(lsm) if lsm.bpf => writeln!(
                out,
                "lsm list         {} (from {}): ok, bpf is active",
                lsm.list, lsm.source
            )?,
            Some(lsm) => writeln!(
                out,
                "lsm list         {} (from {}): FAIL, bpf is not in the list (boot with lsm={},bpf)",
                lsm.list, lsm.source, lsm.list
            )?,
            None => writeln!(
                out,
                "lsm list         unknown: securityfs is not mounted and there is no lsm= boot option"
            )?,
        }
        if self.kernel_btf {
            writeln!(out, "kernel BTF       {KERNEL_BTF}: ok")?;
        } else {
            writeln!(
                out,
                "kernel BTF       FAIL: {KERNEL_BTF} does not exist (CONFIG_DEBUG_INFO_BTF=y is needed)"
            )?;
        }
        match (&self.cgroup_v2.mount, &self.cgroup_v2.error) {
            (Some(mount), _) => {
                writeln!(out, "cgroup v2        mounted at {}: ok", mount.display())?
            }
            (None, error) => writeln!(
                out,
                "cgroup v2        FAIL: {}",
                error.as_deref().unwrap_or_default()
            )?,
        }
        match &self.bpffs {
            Some(mount) => writeln!(out, "bpffs            mounted at {}", mount.display())?,
            None => writeln!(out, "bpffs            not mounted (only needed to pin)")?,
        }
        writeln!(out, "program types that load:")?;
        for check in &self.program_types {
            let verdict = match (check.loads, &check.error) {
                (true, _) => "yes".to_owned(),
                (false, None) => "no (unsupported)".to_owned(),
                (false, Some(error)) => format!("no ({error})"),
            };
            writeln!(out, "  {:<18} {verdict}", check.program_type)?;
        }
        match &self.programs_error {
            None => writeln!(out, "palisade programs  loaded and attached: ok")?,
            Some(error) => writeln!(out, "palisade programs  FAIL: {error}")?,
        }
        writeln!(
            out,
            "verdict          {}",
            if self.ready {
                "READY: Palisade can enforce on this kernel"
            } else {
                "NOT READY: Palisade cannot enforce on this kernel"
            }
        )
    }
}

/// Prints the report; returns whether Palisade can enforce here.
pub fn run(output: Output, out: &mut impl Write) -> anyhow::Result<bool> {
    let report = Report::gather();
    match output {
        Output::Text => report.write_text(out)?,
        Output::Json => write_json(out, &report)?,
    }
    Ok(report.ready)
}
