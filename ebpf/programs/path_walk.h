/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Paths for the path_* hooks. bpf_d_path is refused there on 6.1 (it is only allowed on the
 * hooks of the kernel's sleepable list, which gained the path hooks later), so the path is built
 * the way d_path builds it: from the dentry up through its parents and the mounts above, to the
 * task's root. The result is what bpf_d_path gives the file hooks, so one set of rules serves
 * both.
 *
 * A file can also be reached without a path: open_by_handle_at decodes a handle into a dentry of
 * the handle mount's file system that may lie outside that mount's subtree. Such a file is placed
 * under another mount of its file system, in the task's mount namespace, that holds it; the path
 * there is the one a lookup of the file would give. A file no such mount holds has no path.
 */
#ifndef PALISADE_PATH_WALK_H
#define PALISADE_PATH_WALK_H

#include "open_cache.h"

/* Components followed at most; a deeper path is undecided (and counted). */
#define WALK_MAX_STEPS 256

struct walk {
	struct scratch *s;
	__u64 dentry;
	__u64 vfsmnt;
	__u64 root_dentry;
	__u64 root_vfsmnt;
	__u32 pos; /* the path built so far starts at s->walk[pos] and ends at PATH_BUF_LEN */
	__u32 done;
	__u32 outside_mount; /* the parents ended at a root dentry that is not the mount's root */
};

/* Whether a mount is the kernel's own (kern_mount: pipes, sockets, memfd), in no namespace. */
static __always_inline int internal_mount(__u64 vfsmnt)
{
	__u64 ns = (__u64)BPF_CORE_READ((struct mount *)real_mount(vfsmnt), mnt_ns);
	return !ns || ns >= (__u64)-MAX_ERRNO; /* NULL, or MNT_NS_INTERNAL: ERR_PTR(-EINVAL) */
}

/* One step: prepend the current component, or cross to the mount above, or stop. */
static long walk_step(__u32 index, void *ctx)
{
	struct walk *w = ctx;
	struct scratch *s = w->s;
	if (!s)
		return 1;
	if (w->dentry == w->root_dentry && w->vfsmnt == w->root_vfsmnt) {
		w->done = 1;
		return 1;
	}
	struct vfsmount *vfsmnt = (struct vfsmount *)w->vfsmnt;
	struct dentry *dentry = (struct dentry *)w->dentry;
	if (w->dentry == (__u64)BPF_CORE_READ(vfsmnt, mnt_root)) {
		struct mount *mnt = (struct mount *)real_mount(w->vfsmnt);
		struct mount *parent = BPF_CORE_READ(mnt, mnt_parent);
		if (parent == mnt) {
			/* The root of the mount tree: the task's root is not above the file. */
			w->done = 1;
			return 1;
		}
		w->dentry = (__u64)BPF_CORE_READ(mnt, mnt_mountpoint);
		w->vfsmnt = (__u64)parent + bpf_core_field_offset(struct mount, mnt);
		return 0;
	}
	struct dentry *parent = BPF_CORE_READ(dentry, d_parent);
	if (parent == dentry) {
		/* A root dentry that is not its mount's root: the file of a kernel-internal mount
		 * (memfd, pipe, socket) has no path, any other file is cut off from the mount. */
		if (internal_mount(w->vfsmnt))
			w->done = 1;
		else
			w->outside_mount = 1;
		return 1;
	}
	__u32 len = BPF_CORE_READ(dentry, d_name.len);
	const unsigned char *name = BPF_CORE_READ(dentry, d_name.name);
	if (len > NAME_MAX || w->pos < len + 1)
		return 1; /* longer than PATH_MAX: not done */
	__u32 pos = w->pos - len - 1;
	s->walk[pos & (PATH_BUF_LEN - 1)] = '/';
	bpf_probe_read_kernel(&s->walk[(pos + 1) & (PATH_BUF_LEN - 1)], len & NAME_MAX, name);
	w->pos = pos;
	w->dentry = (__u64)parent;
	return 0;
}

/*
 * Builds the path of `dentry` on the mount `vfsmnt` into s->path, as seen from the current
 * task's root (or from the top of the mount tree, for a file outside that root, as d_path does).
 * Returns its length with the NUL, PATH_OUTSIDE_MOUNT, or another negative value.
 */
static __always_inline long walk_from(struct scratch *s, struct dentry *dentry,
				      struct vfsmount *vfsmnt)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct walk w = {
		.s = s,
		.dentry = (__u64)dentry,
		.vfsmnt = (__u64)vfsmnt,
		.root_dentry = (__u64)BPF_CORE_READ(task, fs, root.dentry),
		.root_vfsmnt = (__u64)BPF_CORE_READ(task, fs, root.mnt),
		.pos = PATH_BUF_LEN - 1,
		.done = 0,
		.outside_mount = 0,
	};
	s->walk[PATH_BUF_LEN - 1] = 0;
	bpf_loop(WALK_MAX_STEPS, walk_step, &w, 0);
	if (w.outside_mount)
		return PATH_OUTSIDE_MOUNT;
	if (!w.done)
		return -1;
	if (w.pos == PATH_BUF_LEN - 1) {
		/* The root itself. */
		s->path[0] = '/';
		s->path[1] = 0;
		return 2;
	}
	__u32 pos = w.pos;
	if (pos == 0 || pos >= PATH_BUF_LEN)
		return -1;
	__u32 len = PATH_BUF_LEN - pos;
	if (bpf_probe_read_kernel(s->path, len, &s->walk[pos]))
		return -1;
	return len;
}

/* Mounts of one file system looked at, at most, to place a file cut off from its mount. */
#define PLACE_MAX_MOUNTS 256

struct place {
	struct scratch *s;
	__u64 node;   /* the mnt_instance list node of the mount last looked at */
	__u64 head;   /* the super block's s_mounts */
	__u64 mnt_ns; /* the task's mount namespace */
	__u32 depth;  /* entries of s->ancestors */
	__u32 full;   /* the root dentry was reached within PLACE_MAX_DEPTH */
	__u64 dentry; /* the next parent to record */
	__u64 found;  /* the vfsmount that holds the file, or 0 */
};

static long ancestor_step(__u32 index, void *ctx)
{
	struct place *p = ctx;
	struct scratch *s = p->s;
	if (!s)
		return 1;
	struct dentry *dentry = (struct dentry *)p->dentry;
	/* bpf_loop runs this PLACE_MAX_DEPTH times at most: the mask is for the verifier. */
	s->ancestors[index & (PLACE_MAX_DEPTH - 1)] = p->dentry;
	p->depth = index + 1;
	struct dentry *parent = BPF_CORE_READ(dentry, d_parent);
	if (parent == dentry) {
		p->full = 1;
		return 1;
	}
	p->dentry = (__u64)parent;
	return 0;
}

static long mount_step(__u32 index, void *ctx)
{
	struct place *p = ctx;
	struct scratch *s = p->s;
	if (!s)
		return 1;
	/* list_head.next, the first field of a structure that never changes. */
	struct list_head *node = NULL;
	if (bpf_probe_read_kernel(&node, sizeof(node), (void *)p->node) || !node ||
	    (__u64)node == p->head)
		return 1;
	p->node = (__u64)node;
	struct mount *mnt =
		(struct mount *)((__u64)node - bpf_core_field_offset(struct mount, mnt_instance));
	if ((__u64)BPF_CORE_READ(mnt, mnt_ns) != p->mnt_ns)
		return 0;
	__u64 root = (__u64)BPF_CORE_READ(mnt, mnt.mnt_root);
	for (__u32 i = 0; i < PLACE_MAX_DEPTH; i++) {
		if (i >= p->depth)
			break;
		if (s->ancestors[i] == root) {
			p->found = (__u64)mnt + bpf_core_field_offset(struct mount, mnt);
			return 1;
		}
	}
	return 0;
}

/* A mount of `dentry`'s file system in the task's mount namespace whose subtree holds it. */
static __always_inline struct vfsmount *mount_holding(struct scratch *s, struct dentry *dentry)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct super_block *sb = BPF_CORE_READ(dentry, d_sb);
	__u64 head = (__u64)sb + bpf_core_field_offset(struct super_block, s_mounts);
	struct place p = {
		.s = s,
		.node = head,
		.head = head,
		.mnt_ns = (__u64)BPF_CORE_READ(task, nsproxy, mnt_ns),
		.dentry = (__u64)dentry,
	};
	bpf_loop(PLACE_MAX_DEPTH, ancestor_step, &p, 0);
	if (!p.full)
		return NULL;
	bpf_loop(PLACE_MAX_MOUNTS, mount_step, &p, 0);
	return (struct vfsmount *)p.found;
}

/*
 * The path of `dentry`, opened through the mount `vfsmnt`, in s->path (see walk_from); a file cut
 * off from that mount is placed under a mount that holds it, if there is one.
 */
static __always_inline long walk_path(struct scratch *s, struct dentry *dentry,
				      struct vfsmount *vfsmnt)
{
	long len = walk_from(s, dentry, vfsmnt);
	if (len != PATH_OUTSIDE_MOUNT)
		return len;
	struct vfsmount *holder = mount_holding(s, dentry);
	if (!holder)
		return PATH_OUTSIDE_MOUNT;
	return walk_from(s, dentry, holder);
}

/*
 * Decides `perms` by the path rules on what a path resolver answered (see match_resolved) and by
 * `by_file`, what was decided without the path; reports the decision. An open the cache may
 * answer (`open`: its look into the cache; NULL for anything else) that needs nothing, under a
 * path that was resolved, is remembered.
 */
static __always_inline int decide_resolved(const struct subject *subject, struct scratch *s,
					   long len, __u32 perms,
					   const struct palisade_verdict *by_file, struct inode *inode,
					   const struct open_probe *open)
{
	struct palisade_verdict d = {};
	int lasting = match_resolved(subject, s, len, perms, &d);
	consider(&d, by_file->action, by_file->rule_id);
	if (d.action == PALISADE_ACTION_NONE) {
		if (open && lasting)
			remember_open(open, perms);
		return 0;
	}
	return decide_path(&d, subject, s, inode, perms, 0);
}

/* The body of the path_* hooks: decide `perms` on the file `dentry` names on mount `vfsmnt`. */
static __always_inline int check_dentry(struct dentry *dentry, struct vfsmount *vfsmnt,
					__u32 hook, __u32 perms)
{
	SUBJECT(subject, hook);
	struct scratch *s = find_path_subject(&subject);
	if (!s)
		return 0;
	/* As in check_file: the path is walked for path rules, to report a decision, or to model. */
	struct palisade_verdict by_file = {};
	struct palisade_inode_key file = dentry_key(dentry);
	protect_files(&by_file, dentry, file, perms);
	match_names(&subject, dentry, file, perms, &by_file);
	if (!has_paths(&subject) && by_file.action == PALISADE_ACTION_NONE && !modeling(&subject))
		return 0;
	long len = walk_path(s, dentry, vfsmnt);
	if (modeling(&subject))
		record_file(&subject, s, len, perms);
	return decide_resolved(&subject, s, len, perms, &by_file, NULL, NULL);
}

/*
 * d_path appends " (deleted)" to the path of an unlinked file (d_unlinked: unhashed, not a root):
 * the rules are matched on the path the file had. Returns the length without the suffix.
 */
static __always_inline long without_deleted_suffix(struct scratch *s, struct dentry *dentry,
						   long len)
{
	const char suffix[] = " (deleted)";
	const long suffix_len = sizeof(suffix) - 1;
	if (len <= suffix_len + 1 || len > PATH_BUF_LEN)
		return len;
	/* The bytes first: they rule out almost every path without reading the dentry. */
	long start = len - 1 - suffix_len;
	for (long i = 0; i < suffix_len; i++) {
		if (s->path[(start + i) & (PATH_BUF_LEN - 1)] != suffix[i])
			return len;
	}
	if (BPF_CORE_READ(dentry, d_hash.pprev) || BPF_CORE_READ(dentry, d_parent) == dentry)
		return len;
	s->path[start & (PATH_BUF_LEN - 1)] = 0;
	return start + 1;
}

/*
 * The body of the hooks on a file already open (open, receive, exec, mmap), for a task of
 * deepest candidate `who`: match, decide. An open the cache did not answer passes its look into
 * it as open_needs_nothing left it (`open`), to be remembered; other hooks pass NULL.
 */
static __always_inline int check_file(struct file *file, __u32 hook, __u32 perms,
				      const struct candidate *who, struct open_probe *open)
{
	if (!perms)
		return 0;
	SUBJECT(subject, hook);
	struct scratch *s = find_path_subject_from(&subject, who);
	if (!s)
		return 0;
	/* Read once here: a field of a kernel pointer is loaded again after every helper call. */
	struct dentry *dentry = file->f_path.dentry;
	struct inode *inode = file->f_inode;
	if (open && !open->slot)
		open = NULL; /* the cache off, or a move under way */
	struct palisade_inode_key file_key = inode_key(inode);
	/* The first open of the file by a target in the epoch only tags the cache's slot. */
	if (open && !open->seen) {
		open->slot->tag = open->tag;
		open = NULL;
	}
	/* The path part of the cache's key before anything is decided on the file (a rename that
	 * moves it afterwards, into a protected directory say, the generation read before tells).
	 * A barrier after it: the file's parent is read later on arm64 too. */
	int cacheable = open && may_remember_opens_on(inode->i_sb) &&
			fill_open_path(&open->key.path, bpf_get_current_task_btf(), file);
	if (cacheable)
		load_barrier();
	/* What needs no path first: then the path is resolved for path rules, to report, or to
	 * model. */
	struct palisade_verdict by_file = {};
	protect_files(&by_file, dentry, file_key, perms);
	match_names(&subject, dentry, file_key, perms, &by_file);
	/* A block device is one whatever its path: matched by the inode's type. */
	if ((perms & PALISADE_PERM_CONTENT) && (inode->i_mode & S_IFMT) == S_IFBLK)
		consider(&by_file, subject.policy->block_device_open.action,
			 subject.policy->block_device_open.rule_id);
	/* Only the path can still decide an open the cache may answer, and never one of a policy
	 * that models: a runtime's open during setup, not modeled, would hide the workload's. */
	cacheable = cacheable && by_file.action == PALISADE_ACTION_NONE &&
		    !(subject.policy->flags & PALISADE_POLICY_MODELING);
	if (!has_paths(&subject) && by_file.action == PALISADE_ACTION_NONE && !modeling(&subject)) {
		if (cacheable)
			remember_open(open, perms);
		return 0;
	}
	long len = bpf_d_path(&file->f_path, s->path, PATH_BUF_LEN);
	len = without_deleted_suffix(s, dentry, len);
	/* d_path also answers "/" for a file cut off from its mount, discarding the names it built
	 * (prepend_path returns 3, which d_path ignores): the walk tells that from a real root. The
	 * mount it places the file under is one of several of its file system (mount_holding),
	 * which the cache's key does not follow: not cached. */
	if (len == 2) {
		len = walk_path(s, dentry, file->f_path.mnt);
		cacheable = 0;
	}
	if (modeling(&subject))
		record_file(&subject, s, len, perms);
	return decide_resolved(&subject, s, len, perms, &by_file, inode, cacheable ? open : NULL);
}

#endif
