//! What a rule does, in the kernel's terms: the building blocks that built-in and custom rules
//! are both made of, and the parsing of network destinations.

use std::net::IpAddr;

use palisade_common::{Policy as KernelPolicy, Verdict};

use super::Pattern;

/// What an exec rule covers: running the file, and reading it, so that a target cannot make a
/// copy (or, reading being needed to link, a hard link) to run under another name.
pub const EXEC_RULE_PERMS: u32 = palisade_common::PERM_EXEC | palisade_common::PERM_READ;

/// Every value in an effect is checked: the encoder turns effects into map entries without
/// failing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Path patterns and the permissions they cover.
    Paths {
        patterns: Vec<Pattern>,
        perms: u32,
    },
    /// A mask of capability numbers.
    Capabilities(u64),
    Switch(Switch),
    /// New mounts of these file system types (names shorter than `FS_TYPE_LEN`).
    MountTypes(Vec<String>),
    /// Creating sockets: (family, protocol or ANY_PROTOCOL).
    Sockets(Vec<(u32, u32)>),
    /// Outgoing traffic to these blocks, on these ports and protocols; an empty list means
    /// every address, port or protocol.
    Network {
        blocks: Vec<AddressBlock>,
        ports: Vec<u16>,
        protocols: Vec<u8>,
    },
    /// DefenseInDepth: every file permission, capability, destination, socket and mount is the
    /// rule's unless `Allow`ed; denied and reported, or in a `trial` only reported (whatever the
    /// policy does with the violations of its other rules).
    DenyByDefault {
        trial: bool,
    },
    /// What a DefenseInDepth policy allows: exceptions to its `DenyByDefault`, not rules of their
    /// own (a `Sockets` key may be `SOCKET_TYPE | type`).
    Allow(Vec<Allowance>),
}

/// One allowance of a DefenseInDepth policy, and the list it came from (a field of the policy's
/// allowlist or of a rule module's allow rule), for errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowance {
    pub field: String,
    pub effect: Effect,
}

/// A rule class that is on or off for a whole policy: one verdict in its `policies` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    UsernsCapability,
    Mount,
    MountBlockDevice,
    Umount,
    UsernsCreate,
    BpfProgLoad,
    SetsockoptBpf,
    PtraceOutside,
    ChmodExecBits,
    ChmodSetidBits,
    BlockDeviceOpen,
    Userfaultfd,
}

impl Switch {
    pub fn verdict(self, policy: &mut KernelPolicy) -> &mut Verdict {
        match self {
            Switch::UsernsCapability => &mut policy.userns_capability,
            Switch::Mount => &mut policy.mount,
            Switch::MountBlockDevice => &mut policy.mount_block_device,
            Switch::Umount => &mut policy.umount,
            Switch::UsernsCreate => &mut policy.userns_create,
            Switch::BpfProgLoad => &mut policy.bpf_prog_load,
            Switch::SetsockoptBpf => &mut policy.setsockopt_bpf,
            Switch::PtraceOutside => &mut policy.ptrace_outside,
            Switch::ChmodExecBits => &mut policy.chmod_exec_bits,
            Switch::ChmodSetidBits => &mut policy.chmod_setid_bits,
            Switch::BlockDeviceOpen => &mut policy.block_device_open,
            Switch::Userfaultfd => &mut policy.userfaultfd,
        }
    }
}

/// An address block as the kernel's network trie holds it: 16 bytes, IPv4 mapped into IPv6
/// (::ffff:a.b.c.d), so that an IPv4 rule also covers IPv4-mapped IPv6 destinations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddressBlock {
    pub addr: [u8; 16],
    /// Significant leading bits of `addr`.
    pub bits: u32,
}

impl AddressBlock {
    /// Parses "IP" or "IP/LEN".
    pub fn parse(text: &str) -> Result<Self, String> {
        let (ip, len) = match text.split_once('/') {
            Some((ip, len)) => (ip, Some(len)),
            None => (text, None),
        };
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("\"{text}\" is not an IP address or CIDR block"))?;
        let (addr, max, offset) = match ip {
            IpAddr::V4(v4) => (v4.to_ipv6_mapped().octets(), 32, 96),
            IpAddr::V6(v6) => (v6.octets(), 128, 0),
        };
        let len = match len {
            None => max,
            Some(len) => len
                .parse::<u32>()
                .ok()
                .filter(|len| *len <= max)
                .ok_or_else(|| format!("\"{text}\": the prefix length must be 0 to {max}"))?,
        };
        let block = Self {
            addr,
            bits: offset + len,
        };
        if block.masked() != block.addr {
            return Err(format!("\"{text}\" has bits set beyond its prefix length"));
        }
        Ok(block)
    }

    fn masked(&self) -> [u8; 16] {
        let value = u128::from_be_bytes(self.addr);
        let mask = if self.bits == 0 {
            0
        } else {
            u128::MAX << (128 - self.bits)
        };
        (value & mask).to_be_bytes()
    }

    /// Whether every address of `other` is in this block.
    pub fn covers(&self, other: &AddressBlock) -> bool {
        self.bits <= other.bits
            && AddressBlock {
                addr: other.addr,
                bits: self.bits,
            }
            .masked()
                == self.addr
    }

    /// Every address (IPv4 and IPv6).
    pub const ALL: AddressBlock = AddressBlock {
        addr: [0; 16],
        bits: 0,
    };
}

/// Parses a port ("443") or a range ("8000-8100").
pub fn parse_port_range(text: &str) -> Result<(u16, u16), String> {
    let port = |part: &str| {
        part.trim()
            .parse::<u16>()
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| format!("\"{text}\" is not a port (1-65535) or a range \"LOW-HIGH\""))
    };
    let (low, high) = match text.split_once('-') {
        Some((low, high)) => (port(low)?, port(high)?),
        None => (port(text)?, port(text)?),
    };
    if low > high {
        return Err(format!("\"{text}\": the range ends before it starts"));
    }
    Ok((low, high))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_and_its_mapped_form_are_one_block() {
        let v4 = AddressBlock::parse("169.254.169.254").unwrap();
        let mapped = AddressBlock::parse("::ffff:169.254.169.254").unwrap();
        assert_eq!(v4, mapped);
        assert_eq!(v4.bits, 128);
        let net = AddressBlock::parse("10.0.0.0/8").unwrap();
        assert_eq!(net.bits, 104);
        assert!(net.covers(&AddressBlock::parse("10.1.2.3").unwrap()));
        assert!(!net.covers(&AddressBlock::parse("11.1.2.3").unwrap()));
        assert!(AddressBlock::ALL.covers(&net));
        assert!(!net.covers(&AddressBlock::ALL));
    }

    #[test]
    fn bad_addresses_and_ports_say_why() {
        assert_eq!(
            AddressBlock::parse("10.0.0.1/8").unwrap_err(),
            "\"10.0.0.1/8\" has bits set beyond its prefix length"
        );
        assert_eq!(
            AddressBlock::parse("10.0.0.0/33").unwrap_err(),
            "\"10.0.0.0/33\": the prefix length must be 0 to 32"
        );
        assert!(AddressBlock::parse("metadata").is_err());
        assert_eq!(parse_port_range("80-90"), Ok((80, 90)));
        assert_eq!(parse_port_range("443"), Ok((443, 443)));
        assert!(parse_port_range("90-80").is_err());
        assert!(parse_port_range("0").is_err());
    }
}
