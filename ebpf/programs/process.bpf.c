/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Process hooks: a target may not signal or trace the process that loaded these programs (the
 * agent, or `palisade run`), which would end its enforcement.
 */
#include "common.h"

/* -EPERM (reported) when the current task is a target and `object` is the protected process. */
static __always_inline int protect_loader(struct task_struct *object, __u32 hook, __u32 signal)
{
	__u32 zero = 0;
	struct palisade_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || !cfg->protected_pid || (__u64)object->tgid != cfg->protected_pid)
		return 0;
	__u64 target_cgroup_id = 0;
	struct palisade_target *target = current_target(&target_cgroup_id);
	if (!target)
		return 0;
	struct decision d = { .action = PALISADE_ACTION_DENY,
			      .rule_id = PALISADE_RULE_SELF_PROTECTION };
	struct palisade_event *e = new_event(hook, &d, target->policy_id, target_cgroup_id, -EPERM);
	if (e) {
		e->ino = 0;
		e->dev = 0;
		e->perms = 0;
		e->object_pid = object->tgid;
		e->signal = signal;
		e->path[0] = 0;
		submit_event(e);
	}
	return -EPERM;
}

SEC("lsm/task_kill")
int BPF_PROG(task_kill, struct task_struct *p, void *info, int sig, const void *cred, int ret)
{
	if (ret)
		return ret;
	/* Signal 0 only asks whether the process exists. */
	if (!sig)
		return 0;
	return protect_loader(p, PALISADE_HOOK_TASK_KILL, sig);
}

SEC("lsm/ptrace_access_check")
int BPF_PROG(ptrace_access_check, struct task_struct *child, unsigned int mode, int ret)
{
	if (ret)
		return ret;
	return protect_loader(child, PALISADE_HOOK_PTRACE_ACCESS_CHECK, 0);
}
