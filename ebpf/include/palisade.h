/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * The one definition of every type and constant shared between the kernel programs and user
 * space. The Rust side (crate palisade-common) is generated from this header by bindgen.
 * Rules: fixed-width fields only, no implicit padding, no C enums (plain #defines + u32 fields).
 */
#ifndef PALISADE_H
#define PALISADE_H

#ifndef __PALISADE_KERNEL__
#include <stdint.h>
typedef uint8_t __u8;
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef int32_t __s32;
typedef uint64_t __u64;
#endif

/* Bytes of path in a trie key: LPM keys carry at most 256 data bytes, 4 of them the policy id. */
#define PALISADE_KEY_PATH_LEN 252
/* Bytes of path copied into an audit event. */
#define PALISADE_EVENT_PATH_LEN 256
/* Glob rules ("PREFIX**SUFFIX") one policy may hold: one bit each in a u64 mask. */
#define PALISADE_MAX_GLOBS 64
/* Deepest cgroup level a target may sit at (bits of palisade_config.target_levels; the root
 * cgroup is level 0): Kubernetes puts containers at level 4, nested in a node container at 8 or
 * so. Each level is a turn of the loop every hook runs inlined (common.h), which the verifier
 * walks through: 6.1's checks file_open in ~193,000 instructions at 15 and gives up (1,000,000)
 * at 63. One less than a power of 2: a mask. */
#define PALISADE_MAX_LEVEL 15
_Static_assert((PALISADE_MAX_LEVEL & (PALISADE_MAX_LEVEL + 1)) == 0 && PALISADE_MAX_LEVEL < 64,
	       "a mask of the levels below 64 (the bits of target_levels)");
/*
 * The value of the `fast_path` map (common.h), what hooks read before they know whether the task
 * is a target, found by one lookup; byte offsets, for the agent's mapping of it:
 * - the open verdict cache's generation (a __u64, open_cache.h), alone on its cache line: every
 *   dentry move writes it;
 * - the target filter: a byte per cgroup id modulo PALISADE_TARGET_FILTER_CGROUPS (a byte, not
 *   a bit: testing a bit costs a shift by a register, four x86 instructions);
 * - the open verdict cache's PALISADE_OPEN_SLOTS slots of PALISADE_OPEN_SLOT_SIZE bytes.
 */
#define PALISADE_FAST_PATH_OPEN_GENERATION 0
#define PALISADE_FAST_PATH_TARGET_FILTER 64
#define PALISADE_TARGET_FILTER_CGROUPS 32768
#define PALISADE_FAST_PATH_OPEN_SLOTS                                                              \
	(PALISADE_FAST_PATH_TARGET_FILTER + PALISADE_TARGET_FILTER_CGROUPS)
#define PALISADE_OPEN_SLOT_SIZE 128
#define PALISADE_OPEN_SLOTS 16384

/* Permissions, one bit each: bit i is index i of the per-permission arrays below. */
#define PALISADE_PERM_READ (1u << 0)
#define PALISADE_PERM_WRITE (1u << 1)
#define PALISADE_PERM_APPEND (1u << 2)
#define PALISADE_PERM_EXEC (1u << 3)
/* Connecting to an AF_UNIX stream socket bound at this name ("@name" for abstract names). */
#define PALISADE_PERM_CONNECT (1u << 4)
#define PALISADE_PERM_COUNT 5
/* The permissions on a file's content: what rules that name files hold for on each of its names
 * (`inode_rules`), and what the agent's own files are protected against. */
#define PALISADE_PERM_CONTENT (PALISADE_PERM_READ | PALISADE_PERM_WRITE | PALISADE_PERM_APPEND)

/* What `protected_inodes` protects an inode of the agent's against, bits: changing it (or, for
 * a directory, its entries), and reading it (the audit trail). */
#define PALISADE_PROTECT_CHANGE (1u << 0)
#define PALISADE_PROTECT_READ (1u << 1)

/* Actions are bits: report (an audit event), deny (-EPERM), or both. As numbers they are
 * ordered: when several rules match, the larger value wins. */
#define PALISADE_ACTION_NONE 0
#define PALISADE_ACTION_AUDIT 1
#define PALISADE_ACTION_DENY 2
/* Beside those, in the entries of a DefenseInDepth policy only: an allow rule covers the
 * operation, so the policy's default denial does not apply to it. Never part of a decision. */
#define PALISADE_ACTION_ALLOW 4

/* Hooks named in events. */
#define PALISADE_HOOK_FILE_OPEN 1
#define PALISADE_HOOK_BPRM_CHECK 2
#define PALISADE_HOOK_MMAP_FILE 3
#define PALISADE_HOOK_TASK_KILL 4
#define PALISADE_HOOK_PTRACE_ACCESS_CHECK 5
#define PALISADE_HOOK_PATH_TRUNCATE 6
#define PALISADE_HOOK_PATH_UNLINK 7
#define PALISADE_HOOK_PATH_RENAME 8
#define PALISADE_HOOK_PATH_LINK 9
#define PALISADE_HOOK_PATH_SYMLINK 10
#define PALISADE_HOOK_PATH_CHMOD 11
#define PALISADE_HOOK_PATH_MKDIR 12
#define PALISADE_HOOK_PATH_RMDIR 13
#define PALISADE_HOOK_SB_MOUNT 14
#define PALISADE_HOOK_MOVE_MOUNT 15
#define PALISADE_HOOK_FS_CONTEXT_PARSE_PARAM 16
#define PALISADE_HOOK_SB_KERN_MOUNT 17
#define PALISADE_HOOK_SB_UMOUNT 18
#define PALISADE_HOOK_CAPABLE 19
#define PALISADE_HOOK_USERNS_CREATE 20
#define PALISADE_HOOK_BPF 21
#define PALISADE_HOOK_SOCKET_SETSOCKOPT 22
#define PALISADE_HOOK_SOCKET_CREATE 23
#define PALISADE_HOOK_SOCKET_CONNECT 24
#define PALISADE_HOOK_SOCKET_SENDMSG 25
#define PALISADE_HOOK_UNIX_STREAM_CONNECT 26
#define PALISADE_HOOK_FILE_RECEIVE 27
#define PALISADE_HOOK_PATH_MKNOD 28
#define PALISADE_HOOK_INODE_INIT_SECURITY_ANON 29
/* Hook numbers are below this. */
#define PALISADE_HOOK_COUNT 30

/* The rule id of the built-in protection of the process that loaded the programs. */
#define PALISADE_RULE_SELF_PROTECTION 0xffffffffu
/* The rule id of the refusal of a file no path names (cut off from the mount it was opened
 * through), for a target whose policy has path rules. */
#define PALISADE_RULE_PATH_OUTSIDE_MOUNT 0xfffffffeu

/* Indices of the per-CPU statistics array. */
#define PALISADE_STAT_EVENTS 0         /* events submitted to the ring buffer */
#define PALISADE_STAT_EVENTS_DROPPED 1 /* ring buffer full: event lost */
#define PALISADE_STAT_UNDECIDED 2      /* path could not be resolved: operation allowed */
#define PALISADE_STAT_EVENTS_THROTTLED 3 /* over the audit rate of its rule and target */
#define PALISADE_STAT_UNCOUNTED 4      /* decisions not counted by rule: `rule_counts` full */
/* Behaviour records lost: `model_records` full, and the model's overflow record missing. */
#define PALISADE_STAT_MODEL_DROPPED 5
/* A DefenseInDepth trial's event of an operation it had reported already: not sent. */
#define PALISADE_STAT_EVENTS_REPEATED 6
#define PALISADE_STAT_COUNT 7

/* Where an open verdict cache's slot (open_cache.h) counts the opens it answered: a byte offset. */
#define PALISADE_OPEN_SLOT_HITS 8
/* The bit of the open verdict cache's generation (open_cache.h) that turns the cache off: no open
 * is answered from it or remembered in it. The agent sets it where the kernel's dentry moves
 * cannot be counted, and when asked to (`palisade agent --no-open-cache`). */
#define PALISADE_OPEN_CACHE_OFF_BIT 63

/* Capabilities a policy can name: bit i of a mask is capability i (CAP_LAST_CAP is 40 today). */
#define PALISADE_CAP_COUNT 64
/* Length of a file system type name in a key (the longest in the kernel is shorter). */
#define PALISADE_FS_TYPE_LEN 16
/* A socket rule for every protocol of a family. */
#define PALISADE_ANY_PROTOCOL 0xffffffffu
/* The protocol of a socket allow entry by type: this bit with the type (SOCK_STREAM...). */
#define PALISADE_SOCKET_TYPE (1u << 31)

/* Bits of palisade_policy.lookups: the lookup structures a policy has entries in. */
#define PALISADE_LOOKUP_MOUNT_TYPES (1u << 0)
#define PALISADE_LOOKUP_SOCKETS (1u << 1)
#define PALISADE_LOOKUP_NETWORK (1u << 2)
/* Path rules (the `path_prefixes` trie): without them, file hooks resolve no path. */
#define PALISADE_LOOKUP_PATHS (1u << 3)
/* Exact or directory rules on a file's content, which the agent looks for by inode in the
 * targets' view (`inode_rules`). */
#define PALISADE_LOOKUP_INODES (1u << 4)

/* Bits of palisade_policy.flags. AlwaysAllow: the kernel leaves the policy's targets alone, as it
 * does processes that are no target (self-protection included); such a target still shadows the
 * policy of a target above it. */
#define PALISADE_POLICY_ALWAYS_ALLOW (1u << 0)
/* BehaviorModeling: the hooks record what the policy's targets do in `model_records`, under the
 * policy's model_id. */
#define PALISADE_POLICY_MODELING (1u << 1)
/* DefenseInDepth with allowViolations (a trial): what its allowlist does not allow is reported
 * once per distinct operation (the `reported` map), not at the audit rate. */
#define PALISADE_POLICY_REPORT_ONCE (1u << 2)

/* Bits of palisade_policy.defaults: what a DefenseInDepth policy denies unless an allow rule
 * covers it. Files by permission: the PALISADE_PERM_* bits. */
#define PALISADE_DEFAULT_CAPABILITIES (1u << 8)
#define PALISADE_DEFAULT_NETWORK (1u << 9)
#define PALISADE_DEFAULT_SOCKETS (1u << 10)
#define PALISADE_DEFAULT_MOUNT (1u << 11)

/* Bytes of a cgroup's name in a `pending` key (with its NUL): a systemd pod slice is ~65. */
#define PALISADE_CGROUP_NAME_LEN 128

/* Key of the `pending` hash map: a cgroup that does not exist yet, by its parent's id and its
 * name. When the kernel creates it, it becomes a target with the value's policy. */
struct palisade_pending_key {
	__u64 parent_id;
	__u8 name[PALISADE_CGROUP_NAME_LEN];
};

/* Key of the `protected_inodes` hash map: a file of the agent's (its executable, policies,
 * event file) or a directory whose entries are. Targets may not change them. */
struct palisade_inode_key {
	__u64 ino;
	__u32 dev; /* kernel encoding: major << 20 | minor */
	__u32 reserved;
};

/* What an `inode_rules` entry names: a file, or a directory whose files a prefix rule covers. */
#define PALISADE_NAMED_FILE 1
#define PALISADE_NAMED_DIRECTORY 2

/* Key of the `inode_rules` hash map: an inode one of a policy's exact or directory rules names,
 * found by the agent under the rule's path in a target's view. A rule holds for every name of
 * the inode: a hard link, a bind mount. */
struct palisade_inode_rule_key {
	__u32 policy_id;
	__u32 dev; /* kernel encoding: major << 20 | minor */
	__u64 ino;
	__u32 named; /* PALISADE_NAMED_* */
	__u32 reserved;
};

/* Value of the `inode_rules` hash map: the rules' actions on the content, per permission (those
 * of PALISADE_PERM_CONTENT; never an allow). */
struct palisade_inode_verdict {
	__u32 action[PALISADE_PERM_COUNT];
	__u32 rule_id[PALISADE_PERM_COUNT];
};

/* Value of the `targets` (and `pending`) hash map, keyed by cgroup v2 id (u64). */
struct palisade_target {
	__u32 policy_id;
};

/* The data of a key of the `path_prefixes` and `path_suffixes` LPM tries (suffix keys hold the
 * reversed path). */
struct palisade_trie_path {
	__u32 policy_id;
	__u8 path[PALISADE_KEY_PATH_LEN];
};

/* Bits of a trie key matched before its path (policy_id), and before its address (policy_id,
 * protocol, reserved and port): a key's prefix length adds those of its path or address. */
#define PALISADE_TRIE_FIXED_BITS 32
#define PALISADE_NETWORK_FIXED_BITS 64

struct palisade_trie_key {
	__u32 prefixlen; /* in bits, counting policy_id */
	struct palisade_trie_path data;
};

/*
 * Value of both tries. User space merges at compile time: an entry carries every rule whose
 * pattern covers it, so one longest-prefix lookup answers for all prefix and exact rules.
 */
struct palisade_path_verdict {
	__u64 glob_mask;                      /* glob rules whose prefix (or suffix) this is */
	__u32 action[PALISADE_PERM_COUNT];    /* prefix and exact rules, per permission */
	__u32 rule_id[PALISADE_PERM_COUNT];   /* the rule that set action[i] */
};

/* Key and value of the `globs` hash map: glob rule `index` of a policy. */
struct palisade_glob_key {
	__u32 policy_id;
	__u32 index;
};

struct palisade_glob_rule {
	__u32 min_len; /* shortest path the glob matches, without the NUL */
	__u32 perms;
	__u32 action;
	__u32 rule_id;
};

/* What a rule decided and which rule it was. */
struct palisade_verdict {
	__u32 action;
	__u32 rule_id;
};

/* Value of the `policies` hash map, keyed by policy id: every rule class decided by a flag or a
 * small table rather than a lookup structure of its own. */
struct palisade_policy {
	__u32 lookups; /* PALISADE_LOOKUP_* */
	__u32 flags;   /* PALISADE_POLICY_* */
	__u32 model_id; /* PALISADE_POLICY_MODELING: the model its targets' records go to */
	__u32 defaults; /* PALISADE_DEFAULT_* and PALISADE_PERM_* */
	struct palisade_verdict default_deny; /* on what `defaults` covers and no rule allows */
	struct palisade_verdict capability[PALISADE_CAP_COUNT];
	struct palisade_verdict userns_capability; /* any capability in a non-initial user ns */
	struct palisade_verdict mount;              /* every mount, remount, bind, move */
	struct palisade_verdict mount_block_device; /* new mounts of block-device file systems */
	struct palisade_verdict umount;
	struct palisade_verdict userns_create;
	struct palisade_verdict bpf_prog_load;    /* BPF_PROG_LOAD */
	struct palisade_verdict setsockopt_bpf;   /* attaching a BPF filter to a socket */
	struct palisade_verdict ptrace;           /* tracing or inspecting any other process */
	struct palisade_verdict ptrace_outside;   /* ... a process outside the target */
	struct palisade_verdict chmod_exec_bits;  /* chmod to a mode with an x bit */
	struct palisade_verdict chmod_setid_bits; /* chmod to a mode with setuid or setgid */
	struct palisade_verdict block_device_open;
	struct palisade_verdict userfaultfd; /* creating a userfaultfd */
};

/* Key of the `mount_types` hash map: new mounts of a file system type. */
struct palisade_mount_type_key {
	__u32 policy_id;
	__u8 fs_type[PALISADE_FS_TYPE_LEN];
};

/* Key of the `sockets` hash map: creating sockets of a family and protocol (the type's default
 * protocol when the caller passes 0), or of every protocol of the family. */
struct palisade_socket_key {
	__u32 policy_id;
	__u32 family;
	__u32 protocol;
};

/* The data of a key of the `network` LPM trie: outgoing traffic to an address. IPv4 addresses
 * are stored IPv4-mapped (::ffff:a.b.c.d), so both socket families find them. Protocol and port
 * 0 stand for every protocol and every port. */
struct palisade_network_key_data {
	__u32 policy_id;
	__u8 protocol;
	__u8 reserved;
	__u16 port;
	__u8 addr[16];
};

struct palisade_network_key {
	__u32 prefixlen; /* in bits, counting policy_id, protocol, reserved and port */
	struct palisade_network_key_data data;
};

/* Element 0 of the `config` array map. */
struct palisade_config {
	/* The levels the gate (below) is of, kept here for an agent that adopts the maps: bit L,
	 * some target (or staged one) is a cgroup at level L; and one at level L has a policy that is
	 * not AlwaysAllow. */
	__u64 target_levels;
	__u64 enforced_levels;
	__u64 protected_pid; /* the loading process: targets may not signal or trace it */
	/* Audit events of one rule on one target (one policy id): a token bucket refilled with one
	 * event every audit_interval_ns and holding at most audit_burst_ns worth (a multiple of the
	 * interval). 0: unlimited. */
	__u64 audit_interval_ns;
	__u64 audit_burst_ns;
	__u32 measure_cost; /* 1: account the time decisions take in `hook_cost` */
	__u32 reserved;
};

/* The global `gate`, what the programs read first, with no lookup: in `levels`, the lowest level
 * of `config`'s target_levels (0 if none) and, from bit PALISADE_LEVELS_SHIFT, its levels
 * shifted down by that lowest (a shift by a register costs the x86 JIT four instructions): one
 * word, read at once, so that both are of one publication. `enforced`: whether
 * `config`'s enforced_levels has any (1 or 0). With no level the programs answer "nothing
 * targeted" with one load, and with enforced 0 "nothing to decide". Its initial value has every
 * level, from 0, and enforced 1: until the agent publishes the gate, the programs look for
 * targets at every level. */
#define PALISADE_LEVELS_SHIFT 32
struct palisade_gate {
	__u64 levels;
	__u32 enforced;
	__u32 reserved;
};

/* Key of the per-CPU `rule_counts` hash map: the decisions one rule of one policy made in one
 * hook, by action (PALISADE_ACTION_DENY, or PALISADE_ACTION_AUDIT for allowed and reported). */
struct palisade_rule_key {
	__u32 policy_id;
	__u32 rule_id;
	__u32 hook;
	__u32 action;
};

struct palisade_rule_count {
	__u64 decisions;
	__u64 throttled; /* reported decisions whose event the audit rate suppressed */
};

/* Kinds of behaviour records (palisade_model_key.kind). */
#define PALISADE_MODEL_FILE 1       /* hook, arg: the PALISADE_PERM_* asked; data: the path */
#define PALISADE_MODEL_CAPABILITY 2 /* arg: the capability (checks the kernel audits) */
#define PALISADE_MODEL_SOCKET 3     /* family, protocol (after defaulting), arg: the type */
#define PALISADE_MODEL_PEER 4       /* hook, family, protocol, port, addr (as palisade_event's) */
#define PALISADE_MODEL_MOUNT 5      /* hook, data: the file system type */
/* Any other operation a hook decides: userns_create, bpf (arg: the command), ptrace (arg: the
 * mode), socket_setsockopt attaching BPF (arg: level << 16 | option). */
#define PALISADE_MODEL_OPERATION 6
/* What the map had no room for: the value counts the operations not recorded. */
#define PALISADE_MODEL_OVERFLOW 7
/* Bytes of a path or file system type in a record, with its NUL. */
#define PALISADE_MODEL_DATA_LEN 256

/* Key of the `model_records` hash map (value: a u64 count of times done): one distinct thing a
 * modeled target did. Unused fields and the bytes after the data's NUL are zero. */
struct palisade_model_key {
	__u32 model_id;
	__u32 kind; /* PALISADE_MODEL_* */
	__u32 hook; /* PALISADE_HOOK_* */
	__u32 arg;
	__u32 family;
	__u32 protocol;
	__u32 port;
	__u32 cut; /* files: 1 if the path was longer than data holds */
	__u8 addr[16];
	__u8 data[PALISADE_MODEL_DATA_LEN];
};

/* Key and value of the `audit_buckets` LRU hash map: the audit rate of a rule on a target. */
struct palisade_bucket_key {
	__u32 policy_id;
	__u32 rule_id;
};

struct palisade_bucket {
	__u64 credit_ns;
	__u64 updated_ns;
	__u64 suppressed; /* events suppressed since the last one emitted */
};

/* Value of the per-CPU `hook_cost` array, indexed by hook: decisions on targets (from finding
 * the target's policy to returning, event included) and the time they took. */
struct palisade_hook_cost {
	__u64 ns;
	__u64 count;
};

/* An audit event on the `events` ring buffer. */
struct palisade_event {
	__u64 time_ns; /* bpf_ktime_get_boot_ns */
	__u64 cgroup_id;
	__u64 target_cgroup_id;
	__u64 ino;
	__u32 dev; /* kernel encoding: major << 20 | minor */
	__u32 pid; /* process (thread group) id */
	__u32 tid; /* thread id */
	__u32 uid;
	__u32 hook;
	__u32 action;
	__u32 perms;
	__u32 rule_id;
	__u32 policy_id;
	__s32 error; /* what the hook returned: -EPERM if denied, 0 if allowed */
	__u32 object_pid; /* signal and ptrace hooks: the process acted on */
	/* task_kill: the signal; capable: the capability; bpf: the command; path_chmod: the mode;
	 * ptrace_access_check: the mode; socket_setsockopt: level << 16 | option;
	 * socket_create: the type. */
	__u32 arg;
	__u32 family;   /* socket hooks */
	__u32 protocol; /* socket hooks: after defaulting */
	__u32 port;     /* socket_connect, socket_sendmsg */
	__u32 rdev;     /* file hooks on a device file: the device (major << 20 | minor) */
	/* Events of this rule and target the audit rate suppressed since the previous one. */
	__u32 suppressed;
	__u32 once; /* PALISADE_POLICY_REPORT_ONCE: the first event of its operation */
	__u8 addr[16];  /* socket_connect, socket_sendmsg: IPv6 or IPv4-mapped */
	__u8 fs_type[PALISADE_FS_TYPE_LEN]; /* mount hooks */
	__u8 comm[16];
	__u8 path[PALISADE_EVENT_PATH_LEN];
};

#endif
