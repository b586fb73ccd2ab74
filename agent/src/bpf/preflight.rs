//! What must hold before BPF LSM programs can enforce anything, and clear errors when it does not.

use std::fs;

use aya::{programs::ProgramError, sys::SyscallError};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "BPF LSM is not active: the kernel's LSM list is \"{active}\" and lacks \"bpf\". \
         Boot with lsm={active},bpf (and a kernel built with CONFIG_BPF_LSM=y)"
    )]
    BpfLsmInactive { active: String },
    #[error(
        "kernel BTF is unavailable ({0}): BPF LSM needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
    )]
    NoBtf(String),
    #[error(
        "the kernel refused to {step} BPF LSM program `{program}` ({detail}): \
         BPF LSM programs cannot run on this kernel{hint}; `palisade doctor` shows what works here"
    )]
    Program {
        step: &'static str,
        program: String,
        detail: String,
        hint: &'static str,
    },
    #[error("cannot load the BPF object: {0}")]
    Object(#[from] aya::EbpfError),
    #[error("BPF map `{0}` is missing from the object or has the wrong type")]
    Map(&'static str),
    #[error("cannot set up BPF map `{name}`: {source}")]
    MapSetup {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("BPF program `{0}` is missing from the object or is not of the type it is attached as")]
    MissingProgram(&'static str),
    #[error(
        "loading BPF programs needs root (CAP_BPF, CAP_SYS_ADMIN and CAP_PERFMON); run as root"
    )]
    NotRoot,
    #[error("cannot pin at {path}: {detail} (is bpffs mounted at /sys/fs/bpf?)")]
    Pin { path: String, detail: String },
}

impl LoadError {
    pub(crate) fn pin(path: &std::path::Path, error: impl std::fmt::Display) -> Self {
        Self::Pin {
            path: path.display().to_string(),
            detail: error.to_string(),
        }
    }

    /// Explains an error from loading or attaching a program.
    pub(crate) fn program(step: &'static str, program: &str, error: ProgramError) -> Self {
        let (detail, os_error) = match &error {
            ProgramError::LoadError {
                io_error,
                verifier_log,
            } => {
                let log = verifier_log.to_string();
                let detail = if log.trim().is_empty() {
                    format!("BPF_PROG_LOAD: {io_error}")
                } else {
                    format!(
                        "BPF_PROG_LOAD: {io_error}; verifier log:\n{}",
                        log.trim_end()
                    )
                };
                (detail, io_error.raw_os_error())
            }
            ProgramError::SyscallError(SyscallError { call, io_error }) => {
                (format!("{call}: {io_error}"), io_error.raw_os_error())
            }
            other => (other.to_string(), None),
        };
        let hint = if os_error == Some(libc::EPERM) {
            " (EPERM: this kernel refuses BPF trampoline programs such as lsm and fentry, \
             e.g. under lockdown or without ftrace support)"
        } else {
            ""
        };
        Self::Program {
            step,
            program: program.to_owned(),
            detail,
            hint,
        }
    }
}

/// The active LSMs, from securityfs or, when it is not mounted, from `lsm=` on the command line.
#[derive(Debug)]
pub struct LsmList {
    pub list: String,
    pub source: &'static str,
}

impl LsmList {
    pub fn has_bpf(&self) -> bool {
        self.list.split(',').any(|lsm| lsm == "bpf")
    }
}

/// The cheap checks, in the order a person would debug them.
#[derive(Debug)]
pub struct Preflight {
    pub kernel: String,
    pub root: bool,
    pub lsm_list: Option<LsmList>,
    pub btf: bool,
}

pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

impl Preflight {
    pub fn run() -> Self {
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|release| release.trim().to_owned())
            .unwrap_or_else(|err| format!("unknown ({err})"));
        let lsm_list = fs::read_to_string("/sys/kernel/security/lsm")
            .map(|list| LsmList {
                list: list.trim().to_owned(),
                source: "/sys/kernel/security/lsm",
            })
            .ok()
            .or_else(|| {
                let cmdline = fs::read_to_string("/proc/cmdline").ok()?;
                let list = cmdline
                    .split_whitespace()
                    .find_map(|arg| arg.strip_prefix("lsm="))?;
                Some(LsmList {
                    list: list.to_owned(),
                    source: "the kernel command line",
                })
            });
        Self {
            kernel,
            // SAFETY: geteuid cannot fail.
            root: unsafe { libc::geteuid() } == 0,
            lsm_list,
            btf: std::path::Path::new(KERNEL_BTF).exists(),
        }
    }

    /// The first check that rules BPF LSM out, if any. An unreadable LSM list (securityfs not
    /// mounted, no `lsm=`) is not fatal: loading the programs is the real test.
    pub fn check(&self) -> Result<(), LoadError> {
        if !self.root {
            return Err(LoadError::NotRoot);
        }
        if let Some(lsm) = &self.lsm_list
            && !lsm.has_bpf()
        {
            return Err(LoadError::BpfLsmInactive {
                active: lsm.list.clone(),
            });
        }
        if !self.btf {
            return Err(LoadError::NoBtf(format!("{KERNEL_BTF} does not exist")));
        }
        Ok(())
    }
}
