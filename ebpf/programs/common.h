/* SPDX-License-Identifier: GPL-2.0-only */
/* Maps, target lookup, statistics and event emission shared by every hook family. */
#ifndef PALISADE_COMMON_H
#define PALISADE_COMMON_H

#include "palisade.h"

#define PATH_BUF_LEN 4096 /* PATH_MAX: bpf_d_path fails on anything longer */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct palisade_config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct palisade_target);
} targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct palisade_inode_key);
	__type(value, __u32);
} protected_inodes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct palisade_pending_key);
	__type(value, struct palisade_target);
} pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct palisade_policy);
} policies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct palisade_mount_type_key);
	__type(value, struct palisade_verdict);
} mount_types SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct palisade_socket_key);
	__type(value, struct palisade_verdict);
} sockets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_network_key);
	__type(value, struct palisade_verdict);
} network SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_trie_key);
	__type(value, struct palisade_path_verdict);
} path_prefixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_trie_key);
	__type(value, struct palisade_path_verdict);
} path_suffixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct palisade_glob_key);
	__type(value, struct palisade_glob_rule);
} globs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PALISADE_STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/*
 * Never read by programs. Updating a map-in-map makes the kernel wait until every running BPF
 * program has finished (maybe_wait_bpf_programs), so user space writes `sync_barrier` to know
 * that no program still uses entries it is about to delete.
 */
struct sync_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} sync_inner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct sync_inner);
} sync_barrier SEC(".maps");

/*
 * Per-CPU working memory: too large for the 512-byte BPF stack. LSM programs only disable
 * migration, so on a fully preemptible kernel a task preempted mid-decision could find this
 * overwritten by another task's decision on the same CPU (see the note in README.md).
 */
struct scratch {
	char path[PATH_BUF_LEN];
	/* Paths built backwards by path_walk.h: room for a name of NAME_MAX bytes written at any
	 * offset below PATH_BUF_LEN. */
	char walk[PATH_BUF_LEN + NAME_MAX + 1];
	struct palisade_trie_key key;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch_space SEC(".maps");

static __always_inline void stat_inc(__u32 index)
{
	__u64 *count = bpf_map_lookup_elem(&stats, &index);
	if (count)
		__sync_fetch_and_add(count, 1);
}

/*
 * The target covering the current task: its cgroup or the nearest ancestor with a policy.
 * Only levels where some target sits are probed, and none deeper than the task itself, so a
 * task that is not a target costs one array read when nothing is targeted, and one helper call
 * plus one hash lookup per occupied level above it otherwise. The number of rules never matters.
 * The loop is written so that the verifier's states converge at every iteration.
 */
static __always_inline struct palisade_target *current_target(__u64 *target_cgroup_id,
							      __u32 *target_level)
{
	__u32 zero = 0;
	struct palisade_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg)
		return NULL;
	__u64 levels = cfg->target_levels;
	struct palisade_target *found = NULL;
	for (__u32 level = 0; level <= PALISADE_MAX_LEVEL; level++) {
		if (!(levels >> level))
			break; /* no target this deep */
		if (!((levels >> level) & 1))
			continue;
		__u64 id = bpf_get_current_ancestor_cgroup_id(level);
		if (!id)
			break; /* the task sits above this level */
		struct palisade_target *target = bpf_map_lookup_elem(&targets, &id);
		if (target) {
			/* Keep going: a deeper target's own policy wins. */
			found = target;
			*target_cgroup_id = id;
			*target_level = level;
		}
	}
	return found;
}

/* The target the current task is in, and its policy's entry. */
struct subject {
	struct palisade_target *target;
	__u64 target_cgroup_id;
	__u32 target_level;
	struct palisade_policy *policy;
};

/* Fills `subject` when the current task is a target; false otherwise. */
static __always_inline int find_subject(struct subject *subject)
{
	subject->target_cgroup_id = 0;
	subject->target_level = 0;
	subject->target = current_target(&subject->target_cgroup_id, &subject->target_level);
	if (!subject->target)
		return 0;
	subject->policy = bpf_map_lookup_elem(&policies, &subject->target->policy_id);
	return subject->policy != NULL;
}

static __always_inline void consider(struct palisade_verdict *d, __u32 action, __u32 rule_id)
{
	if (action > d->action) {
		d->action = action;
		d->rule_id = rule_id;
	}
}

static __always_inline int verdict_error(const struct palisade_verdict *d)
{
	return (d->action & PALISADE_ACTION_DENY) ? -EPERM : 0;
}

/*
 * Reserves an event for a decision that is reported, and fills what every hook reports; the
 * caller adds what it knows and submits. NULL when the decision is not reported, or when the
 * ring buffer is full (counted, never silent).
 */
static __always_inline struct palisade_event *new_event(__u32 hook, const struct palisade_verdict *d,
							 const struct subject *subject)
{
	if (!(d->action & PALISADE_ACTION_AUDIT))
		return NULL;
	struct palisade_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		stat_inc(PALISADE_STAT_EVENTS_DROPPED);
		return NULL;
	}
	/* Ring buffer memory is not zeroed. */
	__builtin_memset(e, 0, __builtin_offsetof(struct palisade_event, comm));
	e->path[0] = 0;
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	e->time_ns = bpf_ktime_get_boot_ns();
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->target_cgroup_id = subject->target_cgroup_id;
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->uid = (__u32)bpf_get_current_uid_gid();
	e->hook = hook;
	e->action = d->action;
	e->rule_id = d->rule_id;
	e->policy_id = subject->target->policy_id;
	e->error = verdict_error(d);
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	return e;
}

static __always_inline void submit_event(struct palisade_event *e)
{
	bpf_ringbuf_submit(e, 0);
	stat_inc(PALISADE_STAT_EVENTS);
}

/* The decision of the built-in protection of Palisade itself: always denied and reported. */
static const struct palisade_verdict self_protection = {
	.action = PALISADE_ACTION_DENY | PALISADE_ACTION_AUDIT,
	.rule_id = PALISADE_RULE_SELF_PROTECTION,
};

static __always_inline int is_protected_inode(struct inode *inode)
{
	if (!inode)
		return 0;
	struct palisade_inode_key key = {
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = BPF_CORE_READ(inode, i_sb, s_dev),
	};
	return bpf_map_lookup_elem(&protected_inodes, &key) != NULL;
}

/* Whether changing `dentry` would change bpffs or a file of the agent's (or an entry of one of
 * its directories). */
static __always_inline int is_protected_dentry(struct dentry *dentry)
{
	return BPF_CORE_READ(dentry, d_sb, s_magic) == BPF_FS_MAGIC ||
	       is_protected_inode(BPF_CORE_READ(dentry, d_inode)) ||
	       is_protected_inode(BPF_CORE_READ(dentry, d_parent, d_inode));
}

/* Self-protection overrides every rule when `perms` would change a protected file. */
static __always_inline void protect_files(struct palisade_verdict *d, struct dentry *dentry,
					  __u32 perms)
{
	if ((perms & (PALISADE_PERM_WRITE | PALISADE_PERM_APPEND)) && is_protected_dentry(dentry))
		*d = self_protection;
}

/* Reports (if the rule says so) and returns the error for a decision with nothing to add. */
static __always_inline int decide(__u32 hook, const struct palisade_verdict *d,
				  const struct subject *subject, __u32 arg)
{
	struct palisade_event *e = new_event(hook, d, subject);
	if (e) {
		e->arg = arg;
		submit_event(e);
	}
	return verdict_error(d);
}

#endif
