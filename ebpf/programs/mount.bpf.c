/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Mount hooks, for both mount APIs. mount(2) passes sb_mount; a new superblock being mounted,
 * by mount(2) or by fsconfig(FSCONFIG_CMD_CREATE), passes sb_kern_mount, which sees the real file
 * system type and device; fsconfig passes fs_context_parse_param; attaching a mount made by
 * fsmount or open_tree passes move_mount. (fsmount and open_tree have no hook of their own: an
 * fsmount needs the superblock fsconfig created, and a detached copy of a tree the caller can
 * already see gives it nothing new.)
 */
#include "model.h"

/* The policy's rule on file systems of type `fs_type`, if it has rules on mount types (a policy
 * that denies mounts by default has). */
static __always_inline const struct palisade_verdict *
mount_type_rule(const struct subject *subject, const __u8 fs_type[PALISADE_FS_TYPE_LEN])
{
	if (!(subject->policy->lookups & PALISADE_LOOKUP_MOUNT_TYPES))
		return NULL;
	struct palisade_mount_type_key key = { .policy_id = subject->policy_id };
	__builtin_memcpy(key.fs_type, fs_type, PALISADE_FS_TYPE_LEN);
	return bpf_map_lookup_elem(&mount_types, &key);
}

/* Considers the rules on mounting a file system of type `name` (on a block device or not), whose
 * name it copies to `fs_type`; returns the rule on the type. */
static __always_inline const struct palisade_verdict *
consider_fs_type(struct palisade_verdict *d, const struct subject *subject, const char *name,
		 int block_device, __u8 fs_type[PALISADE_FS_TYPE_LEN])
{
	if (block_device)
		consider(d, subject->policy->mount_block_device.action,
			 subject->policy->mount_block_device.rule_id);
	bpf_probe_read_kernel_str(fs_type, PALISADE_FS_TYPE_LEN, name);
	const struct palisade_verdict *rule = mount_type_rule(subject, fs_type);
	if (rule)
		consider(d, rule->action, rule->rule_id);
	return rule;
}

/* Records (when modeling) and decides a mount hook's operation on a file system of `fs_type`
 * (`rule` the policy's rule on it). DefenseInDepth denies by default a type no allow rule names,
 * or no type: a bind mount, a remount. */
static __always_inline int decide_mount(struct palisade_verdict *d, const struct subject *subject,
					const __u8 fs_type[PALISADE_FS_TYPE_LEN],
					const struct palisade_verdict *rule)
{
	if (modeling(subject)) {
		struct palisade_model_key *record = new_record(subject, PALISADE_MODEL_MOUNT);
		if (record) {
			__builtin_memcpy(record->data, fs_type, PALISADE_FS_TYPE_LEN);
			count_record(record);
		}
	}
	if (!rule || !(rule->action & PALISADE_ACTION_ALLOW))
		deny_by_default(d, subject, PALISADE_DEFAULT_MOUNT);
	if (d->action == PALISADE_ACTION_NONE)
		return 0;
	struct palisade_event *e = record(d, subject);
	if (e) {
		__builtin_memcpy(e->fs_type, fs_type, PALISADE_FS_TYPE_LEN);
		submit_event(e, subject);
	}
	return verdict_error(d);
}

/* Rules on a superblock being mounted or a mount being attached. */
static __always_inline int check_superblock(__u32 hook, struct super_block *sb)
{
	SUBJECT(subject, hook);
	if (!find_subject(&subject))
		return 0;
	struct palisade_verdict d = subject.policy->mount;
	__u8 fs_type[PALISADE_FS_TYPE_LEN] = {};
	const struct palisade_verdict *rule =
		consider_fs_type(&d, &subject, BPF_CORE_READ(sb, s_type, name),
				 BPF_CORE_READ(sb, s_bdev) != NULL, fs_type);
	return decide_mount(&d, &subject, fs_type, rule);
}

SEC("lsm/sb_mount")
int TARGET_HOOK(sb_mount, const char *dev_name, const struct path *path, const char *type,
	     unsigned long flags, void *data, int ret)
{
	if (ret)
		return ret;
	SUBJECT(subject, PALISADE_HOOK_SB_MOUNT);
	if (!find_subject(&subject))
		return 0;
	/* The type names the file system only of a new mount: the kernel ignores it otherwise. */
	const unsigned long not_new = MS_REMOUNT | MS_BIND | MS_MOVE | MS_UNBINDABLE | MS_PRIVATE |
				      MS_SLAVE | MS_SHARED;
	__u8 fs_type[PALISADE_FS_TYPE_LEN] = {};
	if (type && !(flags & not_new))
		bpf_probe_read_kernel_str(fs_type, sizeof(fs_type), type);
	struct palisade_verdict d = subject.policy->mount;
	return decide_mount(&d, &subject, fs_type, mount_type_rule(&subject, fs_type));
}

SEC("lsm/sb_kern_mount")
int TARGET_HOOK(sb_kern_mount, struct super_block *sb, int ret)
{
	if (ret)
		return ret;
	return check_superblock(PALISADE_HOOK_SB_KERN_MOUNT, sb);
}

SEC("lsm/move_mount")
int TARGET_HOOK(move_mount, const struct path *from_path, const struct path *to_path, int ret)
{
	if (ret)
		return ret;
	return check_superblock(PALISADE_HOOK_MOVE_MOUNT, from_path->mnt->mnt_sb);
}

SEC("lsm/fs_context_parse_param")
int TARGET_HOOK(fs_context_parse_param, struct fs_context *fc, struct fs_parameter *param, int ret)
{
	/* 0 from this hook would mean "consumed": only an error is passed on. */
	if (ret)
		return ret;
	SUBJECT(subject, PALISADE_HOOK_FS_CONTEXT_PARSE_PARAM);
	if (!find_subject(&subject))
		return 0;
	struct palisade_verdict d = subject.policy->mount;
	__u8 fs_type[PALISADE_FS_TYPE_LEN] = {};
	struct file_system_type *type = BPF_CORE_READ(fc, fs_type);
	const struct palisade_verdict *rule =
		consider_fs_type(&d, &subject, BPF_CORE_READ(type, name),
				 BPF_CORE_READ(type, fs_flags) & FS_REQUIRES_DEV, fs_type);
	return decide_mount(&d, &subject, fs_type, rule);
}

SEC("lsm/sb_umount")
int TARGET_HOOK(sb_umount, struct vfsmount *mnt, int flags, int ret)
{
	if (ret)
		return ret;
	SUBJECT(subject, PALISADE_HOOK_SB_UMOUNT);
	if (!find_subject(&subject))
		return 0;
	__u8 fs_type[PALISADE_FS_TYPE_LEN] = {};
	bpf_probe_read_kernel_str(fs_type, sizeof(fs_type), BPF_CORE_READ(mnt, mnt_sb, s_type, name));
	struct palisade_verdict d = subject.policy->umount;
	return decide_mount(&d, &subject, fs_type, mount_type_rule(&subject, fs_type));
}
