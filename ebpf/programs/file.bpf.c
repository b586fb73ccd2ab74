/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * File hooks: opening, and every change to a file or its name. Write rules cover truncating,
 * deleting, renaming (both names), linking (both names: a hard link is another name for the
 * protected file), creating files (open with O_CREAT, mknod), directories and symlinks, and
 * chmod.
 */
#include "path_walk.h"

/*
 * The permissions the access of `file`, of mode `mode`, asks for. Access mode 3 opens for ioctls
 * only (neither FMODE_READ nor FMODE_WRITE), with the permission checks of reading and writing:
 * it asks for both. The flags are read only where the mode does not tell. 64 bits wide: the open
 * verdict cache compares them with a slot's with no zero-extension first.
 */
static __always_inline __u64 access_perms(struct file *file, __u32 mode)
{
	if (mode & FMODE_WRITE)
		return (mode & FMODE_READ ? PALISADE_PERM_READ : 0) |
		       (file->f_flags & O_APPEND ? PALISADE_PERM_APPEND : PALISADE_PERM_WRITE);
	if (mode & FMODE_READ)
		return PALISADE_PERM_READ;
	if ((file->f_flags & O_ACCMODE) == O_ACCMODE)
		return PALISADE_PERM_READ | PALISADE_PERM_WRITE;
	return 0;
}

/*
 * Whether `file` (of mode `mode`, its path's dentry `dentry`) is overlayfs's
 * open of the layer's file behind an overlay file, made under the overlay file's path
 * (open_with_fake_path, 6.1): a repeat, for the same task and access, of the open decided a
 * moment before; deciding it again would report it twice. Only such a file has a path that does
 * not lead to its inode, and it has FMODE_FAKE_PATH (as a few others do: tested first, the flag
 * spares most opens a load). (6.12's backing files carry the layer's own path and are decided
 * by it.)
 */
static __always_inline int under_another_files_path(struct file *file, __u32 mode,
						    struct dentry *dentry)
{
	return (mode & FMODE_FAKE_PATH) && dentry->d_inode != file->f_inode;
}

SEC("lsm/file_open")
int TARGET_HOOK(file_open, struct file *file, int ret)
{
	if (ret)
		return ret;
	/* The cache's generation before the candidate: a verdict of that generation was decided
	 * on targets no newer than those the candidate is of. */
	struct open_probe open;
	struct fast_path *fast = start_open_probe(&open);
	if (!fast)
		return 0; /* never: key 0 of a one-element array; the test is the verifier's */
	struct candidate who;
	if (!find_candidate(&who, fast))
		return 0;
	__u32 mode = file->f_mode;
	struct dentry *dentry = file->f_path.dentry;
	if (under_another_files_path(file, mode, dentry))
		return 0;
	/* An exec's open of its program is a read like any (neither test kernel has marked it
	 * FMODE_EXEC yet, and 6.1 marks uselib's read as it marks an exec's, in f_flags): exec
	 * rules and allowances cover reading; bprm_check decides the exec. */
	__u64 perms = access_perms(file, mode);
	if (!perms)
		return 0;
	/* The cache first: a hit needs neither the target nor the path. */
	if (open_needs_nothing(&open, fast, &who, file, dentry, perms))
		return 0;
	return check_file(file, PALISADE_HOOK_FILE_OPEN, perms, &who, &open);
}

/*
 * A dentry given its inode (a lookup, a link, a creation, a file handle decoded): the open
 * verdict cache forgets the open through the dentry's address (open_cache.h). Nothing is decided
 * here, and the hook returns nothing: no `ret` to answer, hence not a GATED_HOOK. While nothing
 * is enforced (no target, or AlwaysAllow ones only), no open is cached or answered from the
 * cache, and the agent starts a new epoch before enforcement resumes: nothing to forget.
 */
SEC("lsm/d_instantiate")
int BPF_PROG(d_instantiate, struct dentry *dentry, struct inode *inode)
{
	if (!nothing_enforced())
		forget_opens(dentry);
	return 0;
}

/*
 * Every move of a dentry (rename, exchange, a directory alias spliced in) is __d_move's work,
 * under the kernel's rename_lock: the open verdict cache's generation advances at its start (to
 * odd) and at its end (to even). (Named for what they count: they run on a kernel function, not
 * on an LSM hook.)
 */
static __always_inline void count_dentry_move(__u64 parity)
{
	struct fast_path *fast = fast_path_value();
	if (!fast)
		return;
	__u64 *generation = &fast->open_generation;
	/* Moves are one at a time, under rename_lock: nothing changes the generation's parity
	 * between this read and the add (the agent adds even epochs, and sets or clears only the
	 * top bit). A generation already of the parity (the other program missed a move, attached
	 * after it began) advances by 2: it changes all the same, and a missed start or end is not
	 * carried on to every move after.
	 * Used, the add is fully ordered (unused, it is not on arm64): begun, counted before any
	 * name changes; ended, after. */
	__u64 step = (*generation & 1) == parity ? 2 : 1;
	__u64 before = __sync_fetch_and_add(generation, step);
	asm volatile("" ::"r"(before));
}

SEC("fentry/__d_move")
int BPF_PROG(dentry_move_start)
{
	count_dentry_move(1);
	return 0;
}

SEC("fexit/__d_move")
int BPF_PROG(dentry_move_end)
{
	count_dentry_move(0);
	return 0;
}

/*
 * A file passed to the task already open (SCM_RIGHTS, pidfd_getfd, seccomp's addfd): decided as
 * if the task had opened it with the same access.
 */
SEC("lsm/file_receive")
int TARGET_HOOK(file_receive, struct file *file, int ret)
{
	if (ret)
		return ret;
	struct candidate who;
	if (!find_candidate(&who, NULL))
		return 0;
	return check_file(file, PALISADE_HOOK_FILE_RECEIVE, access_perms(file, file->f_mode), &who,
			  NULL);
}

SEC("lsm/path_truncate")
int TARGET_HOOK(path_truncate, const struct path *path, int ret)
{
	if (ret)
		return ret;
	return check_dentry(path->dentry, path->mnt, PALISADE_HOOK_PATH_TRUNCATE,
			    PALISADE_PERM_WRITE);
}

SEC("lsm/path_unlink")
int TARGET_HOOK(path_unlink, const struct path *dir, struct dentry *dentry, int ret)
{
	if (ret)
		return ret;
	return check_dentry(dentry, dir->mnt, PALISADE_HOOK_PATH_UNLINK, PALISADE_PERM_WRITE);
}

SEC("lsm/path_rmdir")
int TARGET_HOOK(path_rmdir, const struct path *dir, struct dentry *dentry, int ret)
{
	if (ret)
		return ret;
	return check_dentry(dentry, dir->mnt, PALISADE_HOOK_PATH_RMDIR, PALISADE_PERM_WRITE);
}

/* Also called for open with O_CREAT of a missing file (may_o_create), before it exists. */
SEC("lsm/path_mknod")
int TARGET_HOOK(path_mknod, const struct path *dir, struct dentry *dentry, unsigned short mode,
	     unsigned int dev, int ret)
{
	if (ret)
		return ret;
	return check_dentry(dentry, dir->mnt, PALISADE_HOOK_PATH_MKNOD, PALISADE_PERM_WRITE);
}

SEC("lsm/path_mkdir")
int TARGET_HOOK(path_mkdir, const struct path *dir, struct dentry *dentry, unsigned short mode,
	     int ret)
{
	if (ret)
		return ret;
	return check_dentry(dentry, dir->mnt, PALISADE_HOOK_PATH_MKDIR, PALISADE_PERM_WRITE);
}

SEC("lsm/path_symlink")
int TARGET_HOOK(path_symlink, const struct path *dir, struct dentry *dentry, const char *old_name,
	     int ret)
{
	if (ret)
		return ret;
	return check_dentry(dentry, dir->mnt, PALISADE_HOOK_PATH_SYMLINK, PALISADE_PERM_WRITE);
}

SEC("lsm/path_link")
int TARGET_HOOK(path_link, struct dentry *old_dentry, const struct path *new_dir,
	     struct dentry *new_dentry, int ret)
{
	if (ret)
		return ret;
	/* A hard link never crosses mounts: the old name is on the new one's mount. */
	int error = check_dentry(old_dentry, new_dir->mnt, PALISADE_HOOK_PATH_LINK,
				 PALISADE_PERM_READ | PALISADE_PERM_WRITE);
	if (error)
		return error;
	return check_dentry(new_dentry, new_dir->mnt, PALISADE_HOOK_PATH_LINK, PALISADE_PERM_WRITE);
}

SEC("lsm/path_rename")
int TARGET_HOOK(path_rename, const struct path *old_dir, struct dentry *old_dentry,
	     const struct path *new_dir, struct dentry *new_dentry, unsigned int flags, int ret)
{
	if (ret)
		return ret;
	int error = check_dentry(old_dentry, old_dir->mnt, PALISADE_HOOK_PATH_RENAME,
				 PALISADE_PERM_WRITE);
	if (error)
		return error;
	return check_dentry(new_dentry, new_dir->mnt, PALISADE_HOOK_PATH_RENAME,
			    PALISADE_PERM_WRITE);
}

SEC("lsm/path_chmod")
int TARGET_HOOK(path_chmod, const struct path *path, unsigned short mode, int ret)
{
	if (ret)
		return ret;
	SUBJECT(subject, PALISADE_HOOK_PATH_CHMOD);
	struct scratch *s = find_path_subject(&subject);
	if (!s)
		return 0;
	struct palisade_verdict d = {};
	if (mode & S_IXUGO)
		consider(&d, subject.policy->chmod_exec_bits.action,
			 subject.policy->chmod_exec_bits.rule_id);
	if (mode & (S_ISUID | S_ISGID))
		consider(&d, subject.policy->chmod_setid_bits.action,
			 subject.policy->chmod_setid_bits.rule_id);
	long len = walk_path(s, path->dentry, path->mnt);
	if (modeling(&subject))
		record_file(&subject, s, len, PALISADE_PERM_WRITE);
	match_resolved(&subject, s, len, PALISADE_PERM_WRITE, &d);
	struct palisade_inode_key file = dentry_key(path->dentry);
	protect_files(&d, path->dentry, file, PALISADE_PERM_WRITE);
	match_names(&subject, path->dentry, file, PALISADE_PERM_WRITE, &d);
	if (d.action == PALISADE_ACTION_NONE)
		return 0;
	return decide_path(&d, &subject, s, NULL, PALISADE_PERM_WRITE, mode);
}
