/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Paths for the path_* hooks. bpf_d_path is refused there on 6.1 (it is only allowed on the
 * hooks of the kernel's sleepable list, which gained the path hooks later), so the path is built
 * the way d_path builds it: from the dentry up through its parents and the mounts above, to the
 * task's root. The result is what bpf_d_path gives the file hooks, so one set of rules serves
 * both.
 */
#ifndef PALISADE_PATH_WALK_H
#define PALISADE_PATH_WALK_H

#include "path_match.h"

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
};

static __always_inline __u64 real_mount(__u64 vfsmnt)
{
	return vfsmnt - bpf_core_field_offset(struct mount, mnt);
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
		w->done = 1;
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
 * task's root. Returns its length with the NUL, or a value `resolved` rejects.
 */
static __always_inline long walk_path(struct scratch *s, struct dentry *dentry,
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
	};
	s->walk[PATH_BUF_LEN - 1] = 0;
	bpf_loop(WALK_MAX_STEPS, walk_step, &w, 0);
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

/* The body of the path_* hooks: decide `perms` on the file `dentry` names on mount `vfsmnt`. */
static __always_inline int check_dentry(struct dentry *dentry, struct vfsmount *vfsmnt,
					__u32 hook, __u32 perms)
{
	SUBJECT(subject, hook);
	struct scratch *s = find_path_subject(&subject);
	if (!s)
		return 0;
	/* As in check_file: the path is walked for path rules, or to report a decision. */
	struct palisade_verdict by_file = {};
	protect_files(&by_file, dentry, perms);
	if (!has_paths(&subject) && by_file.action == PALISADE_ACTION_NONE)
		return 0;
	long len = walk_path(s, dentry, vfsmnt);
	if (!resolved(len))
		return 0;
	struct palisade_verdict d = {};
	if (has_paths(&subject))
		match_path(subject.target, s, len, perms, &d);
	consider(&d, by_file.action, by_file.rule_id);
	if (d.action == PALISADE_ACTION_NONE)
		return 0;
	return decide_path(&d, &subject, s, NULL, perms, 0);
}

#endif
