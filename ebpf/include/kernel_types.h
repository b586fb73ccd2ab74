/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The few kernel structures the programs read, declared with only the fields used.
 * preserve_access_index makes every access a CO-RE relocation: aya resolves the real offsets
 * against the running kernel's BTF at load time, so one object serves every kernel.
 */
#ifndef PALISADE_KERNEL_TYPES_H
#define PALISADE_KERNEL_TYPES_H

/* User-space ABI: fixed layouts, no relocation needed. */
#define UNIX_PATH_MAX 108

struct sockaddr {
	unsigned short sa_family;
};

struct sockaddr_in {
	unsigned short sin_family;
	__u16 sin_port;
	__u32 sin_addr;
};

struct sockaddr_in6 {
	unsigned short sin6_family;
	__u16 sin6_port;
	__u32 sin6_flowinfo;
	__u8 sin6_addr[16];
};

struct sockaddr_un {
	unsigned short sun_family;
	char sun_path[UNIX_PATH_MAX];
};

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct file_system_type {
	const char *name;
	int fs_flags;
};

struct block_device;

struct list_head {
	struct list_head *next;
	struct list_head *prev;
};

struct super_block {
	__u32 s_dev;
	unsigned long s_magic;
	struct file_system_type *s_type;
	struct block_device *s_bdev;
	struct list_head s_mounts;
};

struct inode {
	unsigned short i_mode;
	unsigned long i_ino;
	__u32 i_rdev;
	struct super_block *i_sb;
};

struct qstr {
	__u32 len;
	const unsigned char *name;
};

struct hlist_bl_node {
	struct hlist_bl_node *next, **pprev;
};

struct dentry {
	struct hlist_bl_node d_hash; /* unhashed (pprev NULL) once unlinked */
	struct dentry *d_parent;
	struct qstr d_name;
	struct inode *d_inode;
	struct super_block *d_sb;
};

struct vfsmount {
	struct dentry *mnt_root;
	struct super_block *mnt_sb;
};

/* A mount namespace (fs/mount.h): `event` takes the kernel's next event number at every change
 * of its mount tree. */
struct mnt_namespace {
	__u64 event;
};

/* The mount a vfsmount is embedded in (fs/mount.h). */
struct mount {
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
	struct list_head mnt_instance; /* in the super block's s_mounts */
	struct mnt_namespace *mnt_ns;
};

struct nsproxy {
	struct mnt_namespace *mnt_ns;
};

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
};

struct seqcount {
	unsigned sequence;
};

struct seqcount_spinlock {
	struct seqcount seqcount;
};

struct fs_struct {
	struct seqcount_spinlock seq; /* odd while root or pwd is changed */
	struct path root;
};

struct fs_context {
	struct file_system_type *fs_type;
};

struct fs_parameter {
	const char *key;
};

struct user_namespace {
	int level;
};

struct kernfs_node {
	__u64 id;
	unsigned short flags;
	const char *name;
	void *priv; /* a cgroup's directory: the cgroup */
};

struct cgroup_root;

struct cgroup {
	struct kernfs_node *kn;
	struct cgroup_root *root;
	int level;
	struct cgroup *ancestors[];
};

struct css_set {
	struct cgroup *dfl_cgrp;
};

struct sock_common {
	unsigned short skc_family;
};

struct sock {
	struct sock_common __sk_common;
	__u16 sk_protocol;
	__u16 sk_type;
};

struct socket {
	struct sock *sk;
};

struct msghdr {
	void *msg_name;
	int msg_namelen;
};

struct unix_address {
	int len;
	struct sockaddr_un name[];
};

struct unix_sock {
	struct sock sk;
	struct unix_address *addr;
};

struct file {
	struct path f_path;
	struct inode *f_inode;
	unsigned int f_flags;
	unsigned int f_mode;
};

struct linux_binprm {
	struct file *file;
	const char *filename;
};

struct task_struct {
	int tgid;
	struct fs_struct *fs;
	struct nsproxy *nsproxy;
	struct css_set *cgroups;
};

#pragma clang attribute pop

#define S_IFMT 00170000
#define S_IFBLK 0060000
#define S_IXUGO 00111
#define S_ISUID 0004000
#define S_ISGID 0002000
#define FS_REQUIRES_DEV 1
#define BPF_FS_MAGIC 0xcafe4a11
#define REISERFS_SUPER_MAGIC 0x52654973
#define KERNFS_TYPE_MASK 0x000f
#define KERNFS_DIR 0x0001
#define NAME_MAX 255
#define MAX_ERRNO 4095
#define AF_UNIX 1
#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define SOCK_TYPE_MASK 0xf
#define IPPROTO_ICMP 1
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IPPROTO_ICMPV6 58
#define SOL_SOCKET 1
#define SO_ATTACH_FILTER 26
#define SO_ATTACH_BPF 50
#define SO_ATTACH_REUSEPORT_CBPF 51
#define SO_ATTACH_REUSEPORT_EBPF 52
#define SOL_PACKET 263
#define PACKET_FANOUT_DATA 22
#define BPF_PROG_LOAD_CMD 5
#define BPF_OBJ_PIN_CMD 6
#define BPF_OBJ_GET_CMD 7
#define BPF_PROG_GET_FD_BY_ID_CMD 13
#define BPF_MAP_GET_FD_BY_ID_CMD 14
#define BPF_LINK_GET_FD_BY_ID_CMD 30
#define CAP_OPT_NOAUDIT (1 << 1)
#define MS_REMOUNT 32
#define MS_BIND 4096
#define MS_MOVE 8192
#define MS_UNBINDABLE (1 << 17)
#define MS_PRIVATE (1 << 18)
#define MS_SLAVE (1 << 19)
#define MS_SHARED (1 << 20)
#define FMODE_READ 0x1
#define FMODE_WRITE 0x2
/* FMODE_NOACCOUNT, which open_with_fake_path sets (among others). */
#define FMODE_FAKE_PATH 0x20000000
#define O_ACCMODE 03
#define O_APPEND 02000
#define PROT_EXEC 0x4
#define EPERM 1
#define EEXIST 17

#endif
