//! The kernel's seqlocks the open verdict cache follows (ebpf/programs/open_cache.h), found in
//! /proc/kallsyms: the programs read their sequences at the addresses the agent gives them.

use std::io::{self, BufRead};

/// The addresses of `rename_lock` (every dentry move) and `mount_lock` (every change of the
/// mount tree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqLocks {
    pub rename_lock: u64,
    pub mount_lock: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SeqLocksError {
    #[error("reading /proc/kallsyms: {0}")]
    Read(#[from] io::Error),
    #[error("/proc/kallsyms does not list {0}")]
    Missing(&'static str),
    #[error("/proc/kallsyms lists {0} more than once")]
    Ambiguous(&'static str),
    #[error(
        "/proc/kallsyms hides kernel addresses from the agent (it needs CAP_SYSLOG, and \
         kernel.kptr_restrict below 2)"
    )]
    Hidden,
}

impl SeqLocks {
    pub fn find() -> Result<Self, SeqLocksError> {
        Self::parse(io::BufReader::new(std::fs::File::open("/proc/kallsyms")?))
    }

    fn parse(kallsyms: impl BufRead) -> Result<Self, SeqLocksError> {
        const NAMES: [&str; 2] = ["rename_lock", "mount_lock"];
        let mut found = [None; 2];
        for line in kallsyms.lines() {
            let line = line?;
            // "ADDRESS TYPE NAME": the kernel's own data; a module's symbols end in "[MODULE]".
            let mut fields = line.split_ascii_whitespace();
            let (Some(address), Some("D" | "d" | "B" | "b"), Some(name), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Some(index) = NAMES.iter().position(|wanted| *wanted == name) else {
                continue;
            };
            if found[index].is_some() {
                return Err(SeqLocksError::Ambiguous(NAMES[index]));
            }
            let Ok(address) = u64::from_str_radix(address, 16) else {
                continue;
            };
            found[index] = Some(address);
        }
        let [rename_lock, mount_lock] = found;
        let rename_lock = rename_lock.ok_or(SeqLocksError::Missing(NAMES[0]))?;
        let mount_lock = mount_lock.ok_or(SeqLocksError::Missing(NAMES[1]))?;
        if rename_lock == 0 || mount_lock == 0 {
            return Err(SeqLocksError::Hidden);
        }
        Ok(Self {
            rename_lock,
            mount_lock,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> String {
        match SeqLocks::parse(text.as_bytes()) {
            Ok(locks) => format!("{:x} {:x}", locks.rename_lock, locks.mount_lock),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn both_data_symbols_are_found() {
        let text = "ffffffff81000000 T _stext\n\
                    ffffffff82a1c040 D rename_lock\n\
                    ffffffff82a1c0c0 t rename_lock_helper\n\
                    ffffffffc0001000 d mount_lock\t[some_module]\n\
                    ffffffff82a21f80 D mount_lock\n";
        assert_eq!(parse(text), "ffffffff82a1c040 ffffffff82a21f80");
    }

    #[test]
    fn missing_hidden_or_repeated_symbols_are_refused() {
        assert_eq!(
            parse("ffffffff82a1c040 D rename_lock\nffffffff82a1c040 T mount_lock\n"),
            "/proc/kallsyms does not list mount_lock"
        );
        assert!(
            parse("0000000000000000 D rename_lock\n0000000000000000 D mount_lock\n")
                .contains("hides kernel addresses")
        );
        assert_eq!(
            parse(
                "ffffffff82a1c040 D rename_lock\nffffffff82a1c080 d rename_lock\n\
                 ffffffff82a21f80 D mount_lock\n"
            ),
            "/proc/kallsyms lists rename_lock more than once"
        );
    }
}
