/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The few kernel structures the programs read, declared with only the fields used.
 * preserve_access_index makes every access a CO-RE relocation: aya resolves the real offsets
 * against the running kernel's BTF at load time, so one object serves every kernel.
 */
#ifndef PALISADE_KERNEL_TYPES_H
#define PALISADE_KERNEL_TYPES_H

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct super_block {
	__u32 s_dev;
};

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
};

struct vfsmount;
struct dentry;

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
};

struct file {
	struct path f_path;
	struct inode *f_inode;
	unsigned int f_flags;
	unsigned int f_mode;
};

struct linux_binprm {
	struct file *file;
};

struct task_struct {
	int tgid;
};

#pragma clang attribute pop

#define FMODE_READ 0x1
#define FMODE_WRITE 0x2
#define FMODE_EXEC 0x20
#define O_APPEND 02000
#define PROT_EXEC 0x4
#define EPERM 1

#endif
