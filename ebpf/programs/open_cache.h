/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The open verdict cache: per inode, the permissions a target's open of the file was decided to
 * need nothing for (no denial, no report, not modeled), so that the next such open skips
 * resolving the path and matching it. A slot holds while nothing its path is made of can have
 * changed:
 * - the mount and dentry the file was opened through (another mount, namespace or hard link is
 *   another dentry or mount);
 * - the opener's root (chroot), also by its inode (a root dentry freed and its memory reused for
 *   another directory's is not the same root);
 * - the kernel's rename_lock, whose sequence every dentry move advances (rename, exchange, a
 *   directory alias spliced in, a mount on a dentry), and mount_lock, advanced by every change of
 *   the mount tree: d_path reads the same two to know that the path it built is whole;
 * - the policy id (a policy's rules never change under its id) and the agent's epoch (ids start
 *   again when an agent starts with no policy, the pinned cache keeping its slots).
 * A slot is written under its own sequence (odd while written; a writer that finds it odd or
 * loses the race to make it odd leaves the slot alone), and read twice around the comparison, so
 * that a slot read while written is a miss. Slots live and die with their inodes (inode
 * storage): the cache is bounded by the kernel's inode cache, and an evicted inode starts empty.
 */
#ifndef PALISADE_OPEN_CACHE_H
#define PALISADE_OPEN_CACHE_H

#include "path_match.h"

/* What an open's path is made of. Kernel pointers are compared, never followed. */
struct open_key {
	__u64 file_mnt;
	__u64 file_dentry;
	__u64 root_mnt;
	__u64 root_dentry;
	__u64 root_ino;
	__u32 renames; /* rename_lock's sequence */
	__u32 mounts;  /* mount_lock's sequence */
	__u32 policy_id;
	__u32 epoch;
};

struct open_slot {
	__u64 sequence; /* odd while written */
	struct open_key key;
	__u32 perms; /* PALISADE_PERM_* that need nothing */
	__u32 unused;
};

struct {
	__uint(type, BPF_MAP_TYPE_INODE_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct open_slot);
} open_verdicts SEC(".maps");

/* The sequence of a kernel seqlock at `address` (its first word): odd while it is written, and
 * when the address is unknown. */
static __always_inline __u32 seqlock_sequence(__u64 address)
{
	__u32 sequence = 1;
	if (address)
		bpf_probe_read_kernel(&sequence, sizeof(sequence), (const void *)address);
	return sequence;
}

/*
 * Fills `key` for the current task's open of `file` under `subject`'s policy, before the path is
 * resolved (a rename or mount that starts later changes the sequences the slot is stored under);
 * false while a name or mount is changing, or when the seqlocks were not found.
 */
static __always_inline int open_key(struct open_key *key, const struct subject *subject,
				    struct file *file)
{
	const struct palisade_config *cfg = subject->config;
	key->renames = seqlock_sequence(cfg->rename_lock);
	key->mounts = seqlock_sequence(cfg->mount_lock);
	if ((key->renames | key->mounts) & 1)
		return 0;
	/* Direct loads through the task's BTF pointer: no helper call on the path of a hit. */
	struct path root = bpf_get_current_task_btf()->fs->root;
	key->file_mnt = (__u64)file->f_path.mnt;
	key->file_dentry = (__u64)file->f_path.dentry;
	key->root_mnt = (__u64)root.mnt;
	key->root_dentry = (__u64)root.dentry;
	key->root_ino = root.dentry->d_inode->i_ino;
	key->policy_id = subject->target->policy_id;
	key->epoch = cfg->open_cache_epoch;
	return 1;
}

static __always_inline int same_open(const struct open_key *a, const struct open_key *b)
{
	return a->file_mnt == b->file_mnt && a->file_dentry == b->file_dentry &&
	       a->root_mnt == b->root_mnt && a->root_dentry == b->root_dentry &&
	       a->root_ino == b->root_ino && a->renames == b->renames && a->mounts == b->mounts &&
	       a->policy_id == b->policy_id && a->epoch == b->epoch;
}

/* Whether `inode`'s slot says the open `key` needs nothing for `perms`. */
static __always_inline int open_needs_nothing(struct inode *inode, const struct open_key *key,
					      __u32 perms)
{
	struct open_slot *slot = bpf_inode_storage_get(&open_verdicts, inode, 0, 0);
	if (!slot)
		return 0;
	/* Atomic reads: ordered before and after the comparison on every architecture. */
	__u64 sequence = __sync_fetch_and_add(&slot->sequence, 0);
	if (sequence & 1)
		return 0;
	int hit = (slot->perms & perms) == perms && same_open(&slot->key, key);
	return hit && __sync_fetch_and_add(&slot->sequence, 0) == sequence;
}

/* Records in `inode`'s slot that the open `key` needs nothing for `perms`; a slot of another
 * open is replaced. The current task's root must still be the key's (a thread sharing it may
 * have changed it while the path was resolved). */
static __always_inline void remember_open(struct inode *inode, const struct open_key *key,
					  __u32 perms)
{
	struct path root = bpf_get_current_task_btf()->fs->root;
	if ((__u64)root.mnt != key->root_mnt || (__u64)root.dentry != key->root_dentry)
		return;
	struct open_slot *slot =
		bpf_inode_storage_get(&open_verdicts, inode, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!slot)
		return;
	__u64 sequence = slot->sequence;
	if ((sequence & 1) ||
	    __sync_val_compare_and_swap(&slot->sequence, sequence, sequence + 1) != sequence)
		return;
	if (!same_open(&slot->key, key)) {
		slot->key = *key;
		slot->perms = 0;
	}
	slot->perms |= perms;
	__sync_fetch_and_add(&slot->sequence, 1);
}

#endif
