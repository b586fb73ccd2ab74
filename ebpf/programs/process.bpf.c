/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Process hooks. A target may not signal or trace the process that loaded these programs (the
 * agent, or `palisade run`), which would end its enforcement; and a policy may forbid tracing or
 * inspecting (/proc/PID/root, mem, environ...) processes outside the target.
 */
#include "model.h"

static __always_inline int protect_process(struct task_struct *object,
					   const struct subject *subject, __u32 arg)
{
	struct palisade_event *e = record(&self_protection, subject);
	if (e) {
		e->object_pid = object->tgid;
		e->arg = arg;
		submit_event(e, subject);
	}
	return -EPERM;
}

static __always_inline int is_protected_process(struct task_struct *object)
{
	__u32 zero = 0;
	struct palisade_config *cfg = bpf_map_lookup_elem(&config, &zero);
	return cfg && cfg->protected_pid && (__u64)object->tgid == cfg->protected_pid;
}

/* Whether `task` is in the target's cgroup or below it. */
static __always_inline int in_target(struct task_struct *task, const struct subject *subject)
{
	struct cgroup *cgroup = BPF_CORE_READ(task, cgroups, dfl_cgrp);
	__u32 level = subject->target_level & PALISADE_MAX_LEVEL;
	if ((__u32)BPF_CORE_READ(cgroup, level) < level)
		return 0;
	struct cgroup *ancestor = NULL;
	if (bpf_core_read(&ancestor, sizeof(ancestor), &cgroup->ancestors[level]))
		return 0;
	return BPF_CORE_READ(ancestor, kn, id) == subject->target_cgroup_id;
}

SEC("lsm/task_kill")
int TARGET_HOOK(task_kill, struct task_struct *p, void *info, int sig, const void *cred, int ret)
{
	if (ret)
		return ret;
	/* Signal 0 only asks whether the process exists. */
	if (!sig || !is_protected_process(p))
		return 0;
	SUBJECT(subject, PALISADE_HOOK_TASK_KILL);
	if (!find_subject(&subject))
		return 0;
	return protect_process(p, &subject, sig);
}

SEC("lsm/ptrace_access_check")
int TARGET_HOOK(ptrace_access_check, struct task_struct *child, unsigned int mode, int ret)
{
	if (ret)
		return ret;
	SUBJECT(subject, PALISADE_HOOK_PTRACE_ACCESS_CHECK);
	if (!find_subject(&subject))
		return 0;
	if (modeling(&subject))
		record_operation(&subject, PALISADE_MODEL_OPERATION, mode);
	if (is_protected_process(child))
		return protect_process(child, &subject, mode);
	struct palisade_verdict d = subject.policy->ptrace_outside;
	if (d.action == PALISADE_ACTION_NONE || in_target(child, &subject))
		return 0;
	struct palisade_event *e = record(&d, &subject);
	if (e) {
		e->object_pid = child->tgid;
		e->arg = mode;
		submit_event(e, &subject);
	}
	return verdict_error(&d);
}
