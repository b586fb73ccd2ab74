//! What must hold before BPF LSM programs can enforce anything, and clear errors when it does not.

use std::fs;

use aya::{
    Btf,
    programs::{LsmAttachType, ProgramType},
    sys::is_program_supported,
};

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
        "the kernel refused to {step} BPF LSM program `{program}` ({error}): \
         BPF LSM programs cannot run on this kernel{hint}; `palisade doctor` shows what works here"
    )]
    Program {
        step: &'static str,
        program: String,
        hint: &'static str,
        // Not a #[source]: its text already carries the OS error, once.
        error: Box<aya::programs::ProgramError>,
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
}

impl LoadError {
    /// Explains an error from loading or attaching a program.
    pub(crate) fn program(
        step: &'static str,
        program: &str,
        error: aya::programs::ProgramError,
    ) -> Self {
        let os_error = match &error {
            aya::programs::ProgramError::LoadError { io_error, .. } => io_error.raw_os_error(),
            aya::programs::ProgramError::SyscallError(error) => error.io_error.raw_os_error(),
            _ => None,
        };
        let refused = os_error == Some(libc::EPERM);
        let hint = if refused {
            " (EPERM: this kernel refuses BPF trampoline programs such as lsm and fentry, \
             e.g. under lockdown or without ftrace support)"
        } else {
            ""
        };
        Self::Program {
            step,
            program: program.to_owned(),
            hint,
            error: Box::new(error),
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
    pub lsm_list: Option<LsmList>,
    pub btf: Result<(), String>,
    pub lsm_programs: Result<bool, String>,
}

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
        let btf = Btf::from_sys_fs().map(drop).map_err(|err| err.to_string());
        let lsm_programs =
            is_program_supported(ProgramType::Lsm(LsmAttachType::Mac)).map_err(|err| {
                format!(
                    "{err}: {}",
                    std::error::Error::source(&err)
                        .map(ToString::to_string)
                        .unwrap_or_default()
                )
            });
        Self {
            kernel,
            lsm_list,
            btf,
            lsm_programs,
        }
    }

    /// The first check that rules BPF LSM out, if any. An unreadable LSM list (securityfs not
    /// mounted, no `lsm=`) is not fatal: loading the programs is the real test.
    pub fn check(&self) -> Result<(), LoadError> {
        if let Some(lsm) = &self.lsm_list
            && !lsm.has_bpf()
        {
            return Err(LoadError::BpfLsmInactive {
                active: lsm.list.clone(),
            });
        }
        self.btf.clone().map_err(LoadError::NoBtf)
    }
}
