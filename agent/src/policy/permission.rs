//! The permissions of file rules, as the bits events and map entries carry.

use std::sync::LazyLock;

use palisade_common::{PERM_APPEND, PERM_CONNECT, PERM_COUNT, PERM_EXEC, PERM_READ, PERM_WRITE};

use super::Permission;

pub fn kernel_perms(permissions: &[Permission]) -> u32 {
    permissions.iter().fold(0, |perms, permission| {
        perms
            | match permission {
                Permission::Read => PERM_READ,
                // Writing covers appending: an O_APPEND open is still a write.
                Permission::Write => PERM_WRITE | PERM_APPEND,
                Permission::Append => PERM_APPEND,
                Permission::Exec => PERM_EXEC,
            }
    })
}

/// Every permission's bit.
pub const EVERY_PERMISSION: u32 = (1 << PERM_COUNT) - 1;

/// The names of the permission bits events and map entries carry, by bit: bit `i` is `1 << i`.
pub const PERMISSION_NAMES: [&str; PERM_COUNT as usize] =
    ["read", "write", "append", "exec", "connect"];
const _: () = assert!(
    PERM_READ == 1 << 0
        && PERM_WRITE == 1 << 1
        && PERM_APPEND == 1 << 2
        && PERM_EXEC == 1 << 3
        && PERM_CONNECT == 1 << 4
);

/// The names of the permissions in `bits`, lowest bit first (bits this build does not know are
/// left out). Every list is made once: events would otherwise allocate one each.
pub fn permission_names(bits: u32) -> &'static [&'static str] {
    static LISTS: LazyLock<Vec<Vec<&str>>> = LazyLock::new(|| {
        (0..1u32 << PERM_COUNT)
            .map(|bits| {
                let names = PERMISSION_NAMES.iter().enumerate();
                let present = names.filter(|(bit, _)| bits & (1 << bit) != 0);
                present.map(|(_, name)| *name).collect()
            })
            .collect()
    });
    &LISTS[(bits & EVERY_PERMISSION) as usize]
}

/// The permission bit named `name`.
pub fn permission_bit(name: &str) -> Option<u32> {
    let bit = PERMISSION_NAMES.iter().position(|known| *known == name)?;
    Some(1 << bit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_are_named_by_their_bits_and_back() {
        assert_eq!(permission_names(PERM_READ | PERM_EXEC), ["read", "exec"]);
        assert!(permission_names(0).is_empty());
        assert_eq!(permission_names(!0), PERMISSION_NAMES);
        for (bit, name) in PERMISSION_NAMES.iter().enumerate() {
            assert_eq!(permission_bit(name), Some(1 << bit));
            assert_eq!(permission_names(1 << bit), [*name]);
        }
        assert_eq!(permission_bit("delete"), None);
    }
}
