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

impl SeqLocks {
    /// From /proc/kallsyms; `None` when either is not listed, or listed at 0 (addresses hidden
    /// from this process).
    pub fn find() -> io::Result<Option<Self>> {
        Self::parse(io::BufReader::new(std::fs::File::open("/proc/kallsyms")?))
    }

    fn parse(kallsyms: impl BufRead) -> io::Result<Option<Self>> {
        let (mut rename_lock, mut mount_lock) = (None, None);
        for line in kallsyms.lines() {
            let line = line?;
            // "ADDRESS TYPE NAME", and "[MODULE]" after a module's symbols.
            let mut fields = line.split_ascii_whitespace();
            let (Some(address), Some("D" | "d" | "B" | "b"), Some(name), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let found = match name {
                "rename_lock" => &mut rename_lock,
                "mount_lock" => &mut mount_lock,
                _ => continue,
            };
            *found = u64::from_str_radix(address, 16).ok().filter(|&at| at != 0);
            if let (Some(rename_lock), Some(mount_lock)) = (rename_lock, mount_lock) {
                return Ok(Some(Self {
                    rename_lock,
                    mount_lock,
                }));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Option<SeqLocks> {
        SeqLocks::parse(text.as_bytes()).unwrap()
    }

    #[test]
    fn both_data_symbols_are_found() {
        let text = "ffffffff81000000 T _stext\n\
                    ffffffff82a1c040 D rename_lock\n\
                    ffffffff82a1c0c0 t rename_lock_helper\n\
                    ffffffffc0001000 d mount_lock\t[some_module]\n\
                    ffffffff82a21f80 D mount_lock\n";
        assert_eq!(
            parse(text),
            Some(SeqLocks {
                rename_lock: 0xffff_ffff_82a1_c040,
                mount_lock: 0xffff_ffff_82a2_1f80,
            })
        );
    }

    #[test]
    fn hidden_or_missing_addresses_give_none() {
        assert_eq!(
            parse("0000000000000000 D rename_lock\n0000000000000000 D mount_lock\n"),
            None
        );
        assert_eq!(parse("ffffffff82a1c040 D rename_lock\n"), None);
        assert_eq!(
            parse("ffffffff82a1c040 T mount_lock\nffffffff82a1c040 D rename_lock\n"),
            None
        );
    }
}
