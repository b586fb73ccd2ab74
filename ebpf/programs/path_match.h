/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Path rules: one longest-prefix lookup answers every exact and directory-prefix rule (user space
 * merged covering rules into each trie entry); "PREFIX**SUFFIX" globs add one lookup in a trie of
 * reversed suffixes, and only when the policy has globs and the prefix already matched one.
 */
#ifndef PALISADE_PATH_MATCH_H
#define PALISADE_PATH_MATCH_H

#include "model.h"

/*
 * The glob rules among `candidates` that match the path of `chars` bytes in the scratch memory's
 * path, of the policy in its key (as match_path left them), considered into `d`; returns the
 * permissions of `perms` an allow rule covers. A global function: the verifier checks it once,
 * not again for every state of its caller that reaches it (inlined, its loops made up most of
 * the instructions verified for a path hook, and of an agent's start). It looks the scratch memory
 * up again: before 6.2 a map key cannot be in memory a global function was given.
 */
__noinline __u32 match_globs(__u32 chars, __u64 candidates, __u32 perms,
			     struct palisade_verdict *d)
{
	struct scratch *s = scratch_memory();
	if (!s || !d)
		return 0;
	struct palisade_trie_key *key = &s->key;
	__u32 n = chars > PALISADE_KEY_PATH_LEN ? PALISADE_KEY_PATH_LEN : chars;
	/* The path's last n bytes reversed, 8 at a time (a byte at a time cost 16 instructions a
	 * byte): the key's bytes at..at+7 are the path's chars-1-at down to chars-8-at, a load
	 * byte-swapped; where fewer than 8 are left, the first word's, shifted past the bytes
	 * that are not there. Bytes past n are past prefixlen: never compared. */
	for (__u32 at = 0; at < PALISADE_KEY_PATH_LEN; at += 8) {
		if (at >= n)
			break;
		__u64 word;
		if (chars >= at + 8)
			word = __builtin_bswap64(
				unaligned_word(&s->path[(chars - at - 8) & (PATH_BUF_LEN - 1)]));
		else
			word = __builtin_bswap64(*(__u64 *)s->path) >> 8 * (at + 8 - chars);
		*(__u64 *)__builtin_assume_aligned(&key->data.path[at], 8) = word;
	}
	key->prefixlen = PALISADE_TRIE_FIXED_BITS + n * 8;
	struct palisade_path_verdict *suffix = bpf_map_lookup_elem(&path_suffixes, key);
	if (!suffix)
		return 0;
	__u64 matched = candidates & suffix->glob_mask;
	__u32 allowed = 0;
	/* `matched` is never modified in the loop, so that the verifier's states converge. */
	for (__u32 i = 0; i < PALISADE_MAX_GLOBS; i++) {
		if (!(matched >> i))
			break;
		if (!((matched >> i) & 1))
			continue;
		struct palisade_glob_key glob_key = { .policy_id = key->data.policy_id,
						  .index = i };
		struct palisade_glob_rule *glob = bpf_map_lookup_elem(&globs, &glob_key);
		if (glob && chars >= glob->min_len && (glob->perms & perms)) {
			consider(d, glob->action, glob->rule_id);
			if (glob->action & PALISADE_ACTION_ALLOW)
				allowed |= glob->perms & perms;
		}
	}
	return allowed;
}

/* Decides `perms` on the path of `len` bytes (with its NUL) in s->path; returns the permissions
 * of `perms` an allow rule covers. */
static __always_inline __u32 match_path(__u32 policy_id, struct scratch *s,
					long len, __u32 perms, struct palisade_verdict *d)
{
	struct palisade_trie_key *key = &s->key;
	__u32 n = len > PALISADE_KEY_PATH_LEN ? PALISADE_KEY_PATH_LEN : len;
	key->data.policy_id = policy_id;
	key->prefixlen = PALISADE_TRIE_FIXED_BITS + n * 8;
	/* Only the first n bytes are compared: copied 8 at a time, not the whole key. */
	for (__u32 at = 0; at < PALISADE_KEY_PATH_LEN; at += 8) {
		if (at >= n)
			break;
		*(__u64 *)__builtin_assume_aligned(&key->data.path[at], 8) =
			*(__u64 *)__builtin_assume_aligned(&s->path[at], 8);
	}
	struct palisade_path_verdict *prefix = bpf_map_lookup_elem(&path_prefixes, key);
	if (!prefix)
		return 0;
	__u32 allowed = 0;
	for (__u32 i = 0; i < PALISADE_PERM_COUNT; i++) {
		if (!(perms & (1u << i)))
			continue;
		consider(d, prefix->action[i], prefix->rule_id[i]);
		if (prefix->action[i] & PALISADE_ACTION_ALLOW)
			allowed |= 1u << i;
	}
	/* A non-empty mask means this policy has globs starting with a prefix of the path. */
	if (prefix->glob_mask)
		allowed |= match_globs(len - 1, prefix->glob_mask, perms, d);
	return allowed;
}

/* find_subject_from, and the per-CPU scratch memory a path decision works in: NULL when the
 * task is not a target (or, never in practice, the scratch memory is missing). */
static __always_inline struct scratch *find_path_subject_from(struct subject *subject,
							       const struct candidate *who)
{
	if (!find_subject_from(subject, who))
		return NULL;
	return scratch_memory();
}

/* find_path_subject_from the current task's deepest candidate. */
static __always_inline struct scratch *find_path_subject(struct subject *subject)
{
	struct candidate who;
	return find_candidate(&who, NULL) ? find_path_subject_from(subject, &who) : NULL;
}

/* Whether the subject's policy has path rules. */
static __always_inline int has_paths(const struct subject *subject)
{
	return subject->policy->lookups & PALISADE_LOOKUP_PATHS;
}

/* The rules of the subject's policy that name the inode of `inode` (`named`: as a file, or as
 * the directory holding the file), for `perms`, considered into `d`. */
static __always_inline void match_inode(const struct subject *subject,
					struct palisade_inode_key inode, __u32 named, __u32 perms,
					struct palisade_verdict *d)
{
	struct palisade_inode_rule_key key = {
		.policy_id = subject->policy_id,
		.dev = inode.dev,
		.ino = inode.ino,
		.named = named,
	};
	struct palisade_inode_verdict *verdict = bpf_map_lookup_elem(&inode_rules, &key);
	if (!verdict)
		return;
	for (__u32 i = 0; i < PALISADE_PERM_COUNT; i++) {
		if (perms & (1u << i))
			consider(d, verdict->action[i], verdict->rule_id[i]);
	}
}

/*
 * Rules that name a file, or a directory its files are in, hold for each of its names: a hard
 * link, a bind mount, whatever path it is reached by. The agent found the inodes they name in
 * the targets' view (`inode_rules`): the file's own (`file`, zero for a name not created yet)
 * and its directory's are looked up, for `perms` on the content, into `d`.
 */
static __always_inline void match_names(const struct subject *subject, struct dentry *dentry,
					struct palisade_inode_key file, __u32 perms,
					struct palisade_verdict *d)
{
	if (!(subject->policy->lookups & PALISADE_LOOKUP_INODES) || !(perms & PALISADE_PERM_CONTENT))
		return;
	if (file.ino)
		match_inode(subject, file, PALISADE_NAMED_FILE, perms, d);
	/* A file system's root is its own parent: a named directory mounted there (a volume, the
	 * service account's) is not in itself. */
	struct dentry *parent = dentry->d_parent;
	if (parent != dentry)
		match_inode(subject, inode_key(parent->d_inode), PALISADE_NAMED_DIRECTORY, perms, d);
}

/*
 * What a path resolver answers for a file that no path names: cut off from the mount it was
 * opened through (its parents end at a root dentry that is not the mount's root: a file handle
 * decoded outside the subtree of the handle's mount, or to a disconnected dentry), and held by no
 * other mount of the task's. No path rule can be known not to apply to it.
 */
#define PATH_OUTSIDE_MOUNT (-2)

/* The refusal of such a file to a target whose policy has path rules: denied and reported. */
static const struct palisade_verdict path_outside_mount = {
	.action = PALISADE_ACTION_DENY | PALISADE_ACTION_AUDIT,
	.rule_id = PALISADE_RULE_PATH_OUTSIDE_MOUNT,
};

/*
 * Decides `perms` by the subject's path rules on what a path resolver answered: a path of `len`
 * bytes with its NUL in s->path, PATH_OUTSIDE_MOUNT, or another error (a path too long or too
 * deep: allowed and counted, but denied by a DefenseInDepth policy, which cannot know it
 * allowed). s->path is left empty when there is no path to report. Then denies by default
 * (DefenseInDepth) the permissions no allow rule covered, on files of the file system: not on a
 * pipe, socket or other file of no directory ("pipe:[N]"), which no path names. Returns whether
 * the answer holds for the path beyond this moment: a path was resolved, and no default denial
 * was spared for a container's setup.
 */
static __always_inline int match_resolved(const struct subject *subject, struct scratch *s,
					  long len, __u32 perms, struct palisade_verdict *d)
{
	if (len == PATH_OUTSIDE_MOUNT) {
		s->path[0] = 0;
		if (has_paths(subject))
			consider(d, path_outside_mount.action, path_outside_mount.rule_id);
		return 0;
	}
	if (len <= 0 || len > PATH_BUF_LEN) {
		s->path[0] = 0;
		stat_inc(PALISADE_STAT_UNDECIDED);
		deny_by_default(d, subject, perms);
		return 0;
	}
	if (!has_paths(subject))
		return 1;
	__u32 allowed = match_path(subject->policy_id, s, len, perms, d);
	return s->path[0] != '/' || !deny_by_default(d, subject, perms & ~allowed);
}

/* Reports a path decision (the path is in s->path) and returns its error. */
static __always_inline int decide_path(const struct palisade_verdict *d,
				       const struct subject *subject, struct scratch *s,
				       struct inode *inode, __u32 perms, __u32 arg)
{
	struct palisade_event *e = record(d, subject);
	if (e) {
		if (inode) {
			e->ino = BPF_CORE_READ(inode, i_ino);
			e->dev = BPF_CORE_READ(inode, i_sb, s_dev);
			e->rdev = BPF_CORE_READ(inode, i_rdev);
		}
		e->perms = perms;
		e->arg = arg;
		__builtin_memcpy(e->path, s->path, sizeof(e->path));
		e->path[sizeof(e->path) - 1] = 0;
		submit_event(e, subject);
	}
	return verdict_error(d);
}

#endif
