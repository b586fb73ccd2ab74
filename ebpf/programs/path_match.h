/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Path rules: one longest-prefix lookup answers every exact and directory-prefix rule (user space
 * merged covering rules into each trie entry); "PREFIX**SUFFIX" globs add one lookup in a trie of
 * reversed suffixes, and only when the policy has globs and the prefix already matched one.
 */
#ifndef PALISADE_PATH_MATCH_H
#define PALISADE_PATH_MATCH_H

#include "common.h"

static __always_inline void match_globs(const struct palisade_target *target, struct scratch *s,
					__u32 chars, __u64 candidates, __u32 perms,
					struct decision *d)
{
	struct palisade_trie_key *key = &s->key;
	__u32 n = chars > PALISADE_KEY_PATH_LEN ? PALISADE_KEY_PATH_LEN : chars;
	for (__u32 i = 0; i < PALISADE_KEY_PATH_LEN; i++) {
		if (i >= n)
			break;
		key->data.path[i] = s->path[(chars - 1 - i) & (PATH_BUF_LEN - 1)];
	}
	key->prefixlen = 32 + n * 8;
	struct palisade_path_verdict *suffix = bpf_map_lookup_elem(&path_suffixes, key);
	if (!suffix)
		return;
	__u64 matched = candidates & suffix->glob_mask;
	/* `matched` is never modified in the loop, so that the verifier's states converge. */
	for (__u32 i = 0; i < PALISADE_MAX_GLOBS; i++) {
		if (!(matched >> i))
			break;
		if (!((matched >> i) & 1))
			continue;
		struct palisade_glob_key glob_key = { .policy_id = target->policy_id, .index = i };
		struct palisade_glob_rule *glob = bpf_map_lookup_elem(&globs, &glob_key);
		if (glob && chars >= glob->min_len && (glob->perms & perms))
			consider(d, glob->action, glob->rule_id);
	}
}

/*
 * Decides `perms` on the file at `f_path` for a target. Returns the path length (with its NUL)
 * left in s->path for the event, or a negative errno when the path could not be resolved.
 */
static __always_inline long match_path(const struct palisade_target *target, struct scratch *s,
				       struct path *f_path, __u32 perms, struct decision *d)
{
	long len = bpf_d_path(f_path, s->path, sizeof(s->path));
	if (len <= 0 || len > PATH_BUF_LEN) {
		stat_inc(PALISADE_STAT_UNDECIDED);
		return len <= 0 ? len : -1;
	}
	struct palisade_trie_key *key = &s->key;
	__u32 n = len > PALISADE_KEY_PATH_LEN ? PALISADE_KEY_PATH_LEN : len;
	key->data.policy_id = target->policy_id;
	key->prefixlen = 32 + n * 8;
	__builtin_memcpy(key->data.path, s->path, sizeof(key->data.path));
	struct palisade_path_verdict *prefix = bpf_map_lookup_elem(&path_prefixes, key);
	if (!prefix)
		return len;
	for (__u32 i = 0; i < PALISADE_PERM_COUNT; i++) {
		if (perms & (1u << i))
			consider(d, prefix->action[i], prefix->rule_id[i]);
	}
	/* A non-empty mask means this policy has globs starting with a prefix of the path. */
	if (prefix->glob_mask)
		match_globs(target, s, len - 1, prefix->glob_mask, perms, d);
	return len;
}

/* The common body of every path hook: find the target, match, report, decide. */
static __always_inline int check_path(struct file *file, __u32 hook, __u32 perms)
{
	if (!perms)
		return 0;
	__u64 target_cgroup_id = 0;
	struct palisade_target *target = current_target(&target_cgroup_id);
	if (!target)
		return 0;
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_space, &zero);
	if (!s)
		return 0;
	struct decision d = {};
	if (match_path(target, s, &file->f_path, perms, &d) < 0 || d.action == PALISADE_ACTION_NONE)
		return 0;
	__s32 error = d.action == PALISADE_ACTION_DENY ? -EPERM : 0;
	struct palisade_event *e = new_event(hook, &d, target->policy_id, target_cgroup_id, error);
	if (e) {
		struct inode *inode = file->f_inode;
		e->ino = BPF_CORE_READ(inode, i_ino);
		e->dev = BPF_CORE_READ(inode, i_sb, s_dev);
		e->perms = perms;
		e->object_pid = 0;
		e->signal = 0;
		__builtin_memcpy(e->path, s->path, sizeof(e->path));
		e->path[sizeof(e->path) - 1] = 0;
		submit_event(e);
	}
	return error;
}

#endif
