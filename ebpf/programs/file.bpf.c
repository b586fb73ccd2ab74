/* SPDX-License-Identifier: GPL-2.0-only */
/* File hooks. */
#include "path_match.h"

/* The permissions an open asks for. Opens for exec are decided by the exec hooks instead. */
static __always_inline __u32 open_perms(struct file *file)
{
	__u32 mode = file->f_mode;
	if (mode & FMODE_EXEC)
		return 0;
	__u32 perms = 0;
	if (mode & FMODE_READ)
		perms |= PALISADE_PERM_READ;
	if (mode & FMODE_WRITE)
		perms |= (file->f_flags & O_APPEND) ? PALISADE_PERM_APPEND : PALISADE_PERM_WRITE;
	return perms;
}

SEC("lsm/file_open")
int BPF_PROG(file_open, struct file *file, int ret)
{
	if (ret)
		return ret;
	return check_path(file, PALISADE_HOOK_FILE_OPEN, open_perms(file));
}
