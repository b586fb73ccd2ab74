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
 * cgroup is level 0). */
#define PALISADE_MAX_LEVEL 63

/* Permissions, one bit each: bit i is index i of the per-permission arrays below. */
#define PALISADE_PERM_READ (1u << 0)
#define PALISADE_PERM_WRITE (1u << 1)
#define PALISADE_PERM_APPEND (1u << 2)
#define PALISADE_PERM_EXEC (1u << 3)
#define PALISADE_PERM_COUNT 4

/* Actions, ordered: a larger value wins when several rules match. */
#define PALISADE_ACTION_NONE 0
#define PALISADE_ACTION_AUDIT 1
#define PALISADE_ACTION_DENY 2

/* Hooks named in events. */
#define PALISADE_HOOK_FILE_OPEN 1
#define PALISADE_HOOK_BPRM_CHECK 2
#define PALISADE_HOOK_MMAP_FILE 3
#define PALISADE_HOOK_TASK_KILL 4
#define PALISADE_HOOK_PTRACE_ACCESS_CHECK 5

/* The rule id of the built-in protection of the process that loaded the programs. */
#define PALISADE_RULE_SELF_PROTECTION 0xffffffffu

/* Indices of the per-CPU statistics array. */
#define PALISADE_STAT_EVENTS 0         /* events submitted to the ring buffer */
#define PALISADE_STAT_EVENTS_DROPPED 1 /* ring buffer full: event lost */
#define PALISADE_STAT_UNDECIDED 2      /* path could not be resolved: operation allowed */
#define PALISADE_STAT_COUNT 3

/* Value of the `targets` hash map, keyed by cgroup v2 id (u64). */
struct palisade_target {
	__u32 policy_id;
};

/* The data of a key of the `path_prefixes` and `path_suffixes` LPM tries (suffix keys hold the
 * reversed path). */
struct palisade_trie_path {
	__u32 policy_id;
	__u8 path[PALISADE_KEY_PATH_LEN];
};

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

/* Element 0 of the `config` array map. */
struct palisade_config {
	__u64 target_levels; /* bit L: some target is a cgroup at level L */
	__u64 protected_pid; /* the loading process: targets may not signal or trace it */
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
	__u32 signal;     /* task_kill: the signal */
	__u8 comm[16];
	__u8 path[PALISADE_EVENT_PATH_LEN];
};

#endif
