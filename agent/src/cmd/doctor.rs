//! `palisade doctor`: can this machine enforce, and if not, which check fails and why.

use std::io::Write;

use aya::{
    programs::{LsmAttachType, ProgramType},
    sys::is_program_supported,
};

use crate::{
    bpf::{Enforcer, KERNEL_BTF, Preflight},
    targets::{Hierarchy, find_mount},
};

/// Prints the report; returns whether Palisade can enforce here.
pub fn run(out: &mut impl Write) -> std::io::Result<bool> {
    let preflight = Preflight::run();
    writeln!(out, "kernel           {}", preflight.kernel)?;
    if preflight.root {
        writeln!(out, "user             root: ok")?;
    } else {
        writeln!(
            out,
            "user             FAIL: not root; loading BPF LSM programs needs root"
        )?;
    }
    match &preflight.lsm_list {
        Some(lsm) if lsm.has_bpf() => writeln!(
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
    if preflight.btf {
        writeln!(out, "kernel BTF       {KERNEL_BTF}: ok")?;
    } else {
        writeln!(
            out,
            "kernel BTF       FAIL: {KERNEL_BTF} does not exist (CONFIG_DEBUG_INFO_BTF=y is needed)"
        )?;
    }
    match Hierarchy::find() {
        Ok(cgroup2) => writeln!(
            out,
            "cgroup v2        mounted at {}: ok",
            cgroup2.mount.display()
        )?,
        Err(err) => writeln!(out, "cgroup v2        FAIL: {err}")?,
    }
    match find_mount("bpf") {
        Some(mount) => writeln!(out, "bpffs            mounted at {}", mount.point.display())?,
        None => writeln!(out, "bpffs            not mounted (only needed to pin)")?,
    }
    writeln!(out, "program types that load:")?;
    let types = [
        ("lsm", ProgramType::Lsm(LsmAttachType::Mac)),
        ("tracing (fentry)", ProgramType::Tracing),
        ("kprobe", ProgramType::KProbe),
        ("tracepoint", ProgramType::TracePoint),
        ("cgroup_sock_addr", ProgramType::CgroupSockAddr),
    ];
    for (name, program_type) in types {
        let verdict = match is_program_supported(program_type) {
            Ok(true) => "yes".to_owned(),
            Ok(false) => "no (unsupported)".to_owned(),
            Err(err) => format!(
                "no ({err}: {})",
                std::error::Error::source(&err)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ),
        };
        writeln!(out, "  {name:<18} {verdict}")?;
    }
    let ready = match Enforcer::load() {
        Ok(_) => {
            writeln!(out, "palisade programs  loaded and attached: ok")?;
            true
        }
        Err(err) => {
            writeln!(out, "palisade programs  FAIL: {err}")?;
            false
        }
    };
    writeln!(
        out,
        "verdict          {}",
        if ready {
            "READY: Palisade can enforce on this kernel"
        } else {
            "NOT READY: Palisade cannot enforce on this kernel"
        }
    )?;
    Ok(ready)
}
