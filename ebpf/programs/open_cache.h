/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The open verdict cache: the permissions a target's open of a file was decided to need nothing
 * for (no denial, no report, no modeling policy), so that the next such open is answered before
 * the target is even looked up. A slot holds while nothing the decision rested on can have
 * changed:
 * - the opener's deepest candidate (common.h: the deepest cgroup above it or its own that may be
 *   a target, which fixes the targets it is under) and the cache's generation (in the fast
 *   path's value, common.h), which the agent advances by an epoch (2^32) after every change of
 *   targets, of the policies they point at and of its protected files, and at its start: within
 *   one epoch a candidate has one target, one policy and the same protected files (while
 *   nothing is enforced, lsm/d_instantiate does not keep the slots: the agent starts a new
 *   epoch before it publishes a gate, and before an agent adopting pinned maps sets the gate
 *   back to its initial value). The programs on __d_move advance it by one at the start and
 *   at the end of each of the kernel's dentry moves (rename, exchange, a directory alias
 *   spliced in): odd while one is under way, when nothing is cached. Its top bit
 *   (PALISADE_OPEN_CACHE_OFF_BIT), which the agent sets, turns the cache off;
 * - the dentry (by its address) and the mount it was opened through: another mount or
 *   namespace is another mount, another name (a hard link) another dentry. A dentry given its
 *   inode (a lookup, a link, a creation, a file handle decoded: lsm/d_instantiate) empties its
 *   slot, so that a dentry freed and its memory reused for another, or made negative and given
 *   another inode, is not taken for the old: the slot is chosen by the address. A positive
 *   dentry keeps its inode: the dentry fixes the file;
 * - the opener's root (chroot), by the addresses of its mount and dentry: d_path stops at the
 *   root when its walk up from the file meets them, comparing addresses. The rest of the key
 *   fixes that walk (the file's dentry, its parents, the mounts above it and their mount
 *   points, all pinned by the file's dentry): a root the walk met is pinned, and one it did
 *   not meet, freed and its memory reused for another, is not met either;
 * - the opener's mount namespace with the count of changes of its mount tree (mount, move,
 *   umount, pivot_root) the kernel keeps in it. A slot is only written for a file on a mount of
 *   that namespace: the file's name is made of the names of its dentry and their parents up to
 *   their mount's root, and of where the mounts above it are mounted in that namespace. The
 *   count is the kernel's global event number at the namespace's last change, 0 before the
 *   first: a namespace whose tree never changed is not cached, so that another allocated where
 *   a freed one was is never taken for it.
 * A slot older than OPEN_SLOT_LIFETIME jiffies is not used either: it bounds how long a change
 * the agent failed to mark with a new epoch goes unseen.
 * A decision is remembered only for an open that finds its dentry's slot tagged with its dentry
 * and epoch (`tag`): the first open of a file by a target in an epoch only leaves the tag. Most
 * files a program opens it opens once; those pay neither the key's path nor the slot's write,
 * and evict no other file's verdict. The tag leaves the opener out, whose candidate every look
 * has: a task under no target is told so before it looks. A verdict of the epoch for another
 * candidate is not replaced: two cgroups opening one file in turns would otherwise each evict
 * the other's.
 * The cache is an array of OPEN_SLOTS slots in the fast path's value, after the target filter
 * that told the opener a candidate (one lookup finds both), each dentry's slot chosen by its
 * address (a hit reads no field of the dentry): its memory is fixed at load, whatever the
 * targets open. A slot is written under its own sequence (odd while written; a writer that
 * finds it odd or loses the race to make it odd leaves the slot alone), and read twice around
 * the comparison, so that a slot read while written is a miss.
 */
#ifndef PALISADE_OPEN_CACHE_H
#define PALISADE_OPEN_CACHE_H

#include "path_match.h"

/* 10 s at HZ=1000, 100 s at HZ=100: jiffies cost one load where a clock read costs tens of
 * instructions. */
#define OPEN_SLOT_LIFETIME 10000

/* The agent's part of the generation. */
#define OPEN_EPOCH_SHIFT 32

/* Where an open's path starts and what could have moved it, read before the path is resolved.
 * Kernel pointers are compared, never followed. */
struct open_path {
	__u64 file_mnt;
	__u64 root_mnt;
	__u64 root_dentry;
	__u64 mount_ns; /* the opener's mount namespace */
	__u64 mount_events; /* its event number */
	/* Not compared: the opener's fs_struct sequence, which must not change (a chroot) between
	 * the key and the slot's write. */
	__u32 root_sequence;
};

/* What an open's decision rests on. */
struct open_key {
	__u64 dentry; /* its place (dentry_place); in a slot, 0: forgotten (forget_opens) */
	__u64 candidate; /* the opener's deepest candidate's cgroup id */
	__u64 generation;
	struct open_path path;
};

struct open_slot {
	__u64 sequence; /* odd while written */
	/* Opens answered from the slot, whatever it held: it only grows (the agent sums the slots'
	 * counts through a mapping of the map for palisade_opens_cached_total). On the line every
	 * hit writes already, unlike a counter of its own. */
	__u64 hits;
	__u64 written; /* jiffies */
	/* The tag (tag_of) of the dentry in the epoch of the last target's open that did not find
	 * it: a hint, written with a plain store, next to what every open reads first. Another
	 * dentry's tag that is equal costs only a decision remembered. */
	__u32 tag;
	__u32 perms; /* PALISADE_PERM_* that need nothing */
	struct open_key key;
} __attribute__((aligned(64))); /* slots start on cache lines: a hit writes one */
_Static_assert(sizeof(struct open_slot) == PALISADE_OPEN_SLOT_SIZE, "the fast path's slots");

/* An open's look into the cache, which the decision that follows a miss goes on with. */
struct open_probe {
	/* As far as the look read it: the generation, the candidate and the dentry's place. */
	struct open_key key;
	struct open_slot *slot; /* the dentry's; NULL: nothing to remember (a move, the cache off) */
	__u32 tag; /* tag_of the dentry */
	__u32 seen; /* the slot held the tag: the decision is to be remembered */
	__u32 candidate_level;
};

_Static_assert(__builtin_offsetof(struct open_slot, hits) == PALISADE_OPEN_SLOT_HITS,
	       "the agent reads the slots' counts there");

/*
 * The dentry at `dentry` as a number: its distance from the cache's map, both fixed while the
 * cache is. The verifier turns a pointer into a number only by subtracting another pointer from
 * it (for a loader with CAP_PERFMON, which LSM programs need): no field of the dentry is read.
 */
static __always_inline __u64 dentry_place(struct dentry *dentry)
{
	return (__u64)dentry - (__u64)&fast_path;
}

/* The slot of the dentry at `place`. */
static __always_inline struct open_slot *slot_of(struct fast_path *fast, __u64 place)
{
	__u32 index = (place * 0x9e3779b97f4a7c15ull) >> (64 - OPEN_SLOT_BITS);
	return (struct open_slot *)fast->open_slots[index];
}

/* The sequence of the task's fs_struct, which chroot (and chdir) advance: a load the compiler
 * keeps in place. */
static __always_inline __u32 root_sequence(struct fs_struct *fs)
{
	__u32 sequence = *(volatile unsigned *)&fs->seq.seqcount.sequence;
	asm volatile("" ::: "memory");
	return sequence;
}

/*
 * Fills `path`, where the current task `task`'s open of `file` stands, before the path is
 * resolved (a mount that starts later changes the count the slot is stored under);
 * false while the task's root is changing, for a task without namespaces (one exiting), and in
 * a mount namespace whose tree never changed.
 */
static __always_inline int fill_open_path(struct open_path *path, struct task_struct *task,
					  struct file *file)
{
	/* Without namespaces, the loads through NULL read 0: no event number. */
	struct mnt_namespace *ns = task->nsproxy->mnt_ns;
	path->mount_ns = (__u64)ns;
	path->mount_events = *(volatile __u64 *)&ns->event;
	struct fs_struct *fs = task->fs;
	path->root_sequence = root_sequence(fs);
	if (path->root_sequence & 1)
		return 0;
	path->file_mnt = (__u64)file->f_path.mnt;
	path->root_mnt = (__u64)fs->root.mnt;
	path->root_dentry = (__u64)fs->root.dentry;
	/* The root read whole, in a namespace whose tree changed. */
	return path->mount_events && root_sequence(fs) == path->root_sequence;
}

/*
 * Whether the current task `task`'s open of `file` stands where a slot's `path` says, read as a
 * hit reads it: the root's two pointers without the fs_struct's sequence (two loads fewer on
 * every hit). Read while a chroot or pivot_root changes them, they may pair the old mount with
 * the new dentry: such a pair meets a slot only as the root a task of the same candidate opened
 * the file under, and whoever tears it holds the capability that reaches any root. The writer
 * keeps the sequence (fill_open_path): what it stores is the root its decision resolved under.
 * The event number is read now: a mount change since the slot's key, before or after this
 * open's lookup, misses.
 */
static __always_inline int opens_at(const struct open_path *path, struct task_struct *task,
				    struct file *file)
{
	struct mnt_namespace *ns = task->nsproxy->mnt_ns;
	struct fs_struct *fs = task->fs;
	return path->file_mnt == (__u64)file->f_path.mnt &&
	       path->root_mnt == (__u64)fs->root.mnt &&
	       path->root_dentry == (__u64)fs->root.dentry && path->mount_ns == (__u64)ns &&
	       path->mount_events == *(volatile __u64 *)&ns->event;
}

/* Of the key's dentry in its epoch. Never 0, an unwritten slot's tag: the first open of a file
 * whose place is the epoch's would be taken for its second. */
static __always_inline __u32 tag_of(const struct open_key *key)
{
	return (key->dentry ^ (key->generation >> OPEN_EPOCH_SHIFT)) | 1u << 31;
}

static __always_inline int same_path(const struct open_path *a, const struct open_path *b)
{
	return a->file_mnt == b->file_mnt && a->root_mnt == b->root_mnt &&
	       a->root_dentry == b->root_dentry &&
	       a->mount_ns == b->mount_ns && a->mount_events == b->mount_events;
}

/* The same file (by dentry), opener (by candidate) and generation. */
static __always_inline int same_file(const struct open_key *a, const struct open_key *b)
{
	return a->dentry == b->dentry && a->candidate == b->candidate &&
	       a->generation == b->generation;
}

static __always_inline int same_open(const struct open_key *a, const struct open_key *b)
{
	return same_file(a, b) && same_path(&a->path, &b->path);
}

/* A read ordered before and after: on x86 (which keeps loads in order) a plain load. */
static __always_inline __u64 ordered_read(__u64 *value)
{
	load_barrier();
	__u64 read = *(volatile __u64 *)value;
	load_barrier();
	return read;
}

/*
 * Starts an open's look into the cache: reads the cache's generation, before anything else the
 * open reads. A barrier follows: what the open reads next (its candidate, the decision a miss
 * makes) is what the agent published at that epoch or later. Returns the fast path's value
 * (NULL never in practice), for the candidate's and the slot's look.
 */
static __always_inline struct fast_path *start_open_probe(struct open_probe *probe)
{
	struct fast_path *fast = fast_path_value();
	if (fast)
		probe->key.generation = *(volatile __u64 *)&fast->open_generation;
	load_barrier();
	return fast;
}

/*
 * Whether the cache says the current task's open (the task of deepest candidate `who`) of `file`
 * (through `dentry`) needs nothing for `perms`, the look started (returning `fast`). Fills
 * `probe` on the way, for the decision that follows a miss, which reads the key's path afresh.
 */
static __always_inline int open_needs_nothing(struct open_probe *probe, struct fast_path *fast,
					      const struct candidate *who, struct file *file,
					      struct dentry *dentry, __u64 perms)
{
	struct open_key *key = &probe->key;
	if (key->generation & (1ull << PALISADE_OPEN_CACHE_OFF_BIT | 1)) {
		probe->slot = NULL;
		return 0;
	}
	key->dentry = dentry_place(dentry);
	key->candidate = who->id;
	probe->candidate_level = who->level;
	struct open_slot *slot = slot_of(fast, key->dentry);
	probe->slot = slot;
	__u64 sequence = ordered_read(&slot->sequence);
	if (!(sequence & 1) && same_file(&slot->key, key) && (slot->perms & perms) == perms &&
	    opens_at(&slot->key.path, bpf_get_current_task_btf(), file) &&
	    bpf_jiffies64() - slot->written < OPEN_SLOT_LIFETIME &&
	    ordered_read(&slot->sequence) == sequence) {
		__sync_fetch_and_add(&slot->hits, 1);
		return 1;
	}
	/* The tag only for a miss. Another candidate's verdict of the epoch is kept: the open is
	 * then taken for a first one, which only tags. */
	probe->tag = tag_of(key);
	probe->seen = slot->tag == probe->tag &&
		      !(slot->key.dentry == key->dentry && slot->key.candidate != key->candidate &&
			slot->key.generation == key->generation);
	return 0;
}

/*
 * Whether an open of a file on `sb` may be remembered. Not on reiserfs: it keeps its extended
 * attributes in files of private inodes (S_PRIVATE) on the mounted file system itself, and the
 * kernel skips lsm/d_instantiate for private inodes. A dentry freed and its memory reused for one
 * of them would keep the slot of the file it was, and an open by handle (open_by_handle_at)
 * through the same mount would be answered from it. Every other private inode is on an internal
 * mount, or on none, which no slot holds.
 */
static __always_inline int may_remember_opens_on(struct super_block *sb)
{
	return sb->s_magic != REISERFS_SUPER_MAGIC;
}

static __always_inline __u64 real_mount(__u64 vfsmnt)
{
	return vfsmnt - bpf_core_field_offset(struct mount, mnt);
}

/*
 * Records that the open `probe` looked up needs nothing for `perms`; a slot of another open is
 * replaced.
 * Not when the opener's root changed since the key was read (a thread sharing it may have
 * changed it, or changed it and back, while the path was resolved), nor when it is no longer
 * below its deepest candidate (the decision, made from that candidate, probed the levels above
 * it where the task was then; moved there and back, it was moved by one who could have opened
 * the file from there). Nor for a file on a mount of another namespace
 * (reached through /proc/PID/root, say) or of none (detached): its namespace's mount tree
 * changes are not the opener's.
 */
static __always_inline void remember_open(const struct open_probe *probe, __u32 perms)
{
	const struct open_key *key = &probe->key;
	struct task_struct *task = bpf_get_current_task_btf();
	struct fs_struct *fs = task->fs;
	struct path root = fs->root;
	if ((__u64)root.mnt != key->path.root_mnt || (__u64)root.dentry != key->path.root_dentry ||
	    root_sequence(fs) != key->path.root_sequence ||
	    bpf_get_current_ancestor_cgroup_id(probe->candidate_level) != key->candidate)
		return;
	struct mnt_namespace *ns = task->nsproxy->mnt_ns;
	/* Outside BPF_CORE_READ, whose every field access is relocated against the kernel's types. */
	struct mount *mount = (struct mount *)real_mount(key->path.file_mnt);
	if ((__u64)ns != key->path.mount_ns ||
	    (__u64)BPF_CORE_READ(mount, mnt_ns) != key->path.mount_ns)
		return;
	struct open_slot *slot = probe->slot;
	__u64 sequence = slot->sequence;
	if ((sequence & 1) ||
	    __sync_val_compare_and_swap(&slot->sequence, sequence, sequence + 1) != sequence)
		return;
	__u64 now = bpf_jiffies64();
	if (!same_open(&slot->key, key) || now - slot->written >= OPEN_SLOT_LIFETIME) {
		slot->key = *key;
		slot->perms = 0;
		slot->written = now;
	}
	slot->perms |= perms;
	/* A fully ordered exchange (an add whose result is unused is not, on arm64): the slot's
	 * fields are visible before its sequence is even again. */
	__sync_val_compare_and_swap(&slot->sequence, sequence + 1, sequence + 2);
}

/* `dentry` given an inode: its slot, if it holds an open through the dentry's address, holds
 * one through a dentry that may be gone, whose memory this one reuses, or through this one
 * before it lost its inode. A plain store suffices: no open through the dentry can start before
 * it is instantiated. */
static __always_inline void forget_opens(struct dentry *dentry)
{
	struct fast_path *fast = fast_path_value();
	if (!fast)
		return;
	__u64 place = dentry_place(dentry);
	struct open_slot *slot = slot_of(fast, place);
	if (slot->key.dentry == place)
		*(volatile __u64 *)&slot->key.dentry = 0;
}

#endif
