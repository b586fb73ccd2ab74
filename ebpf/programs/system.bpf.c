/* SPDX-License-Identifier: GPL-2.0-only */
/* Privilege hooks: capabilities, user namespaces, the bpf() system call, userfaultfd. */
#include "model.h"

SEC("lsm/capable")
int TARGET_HOOK(capable, const void *cred, struct user_namespace *ns, int cap, unsigned int opts,
	     int ret)
{
	if (ret)
		return ret;
	SUBJECT(subject, PALISADE_HOOK_CAPABLE);
	if (!find_subject(&subject))
		return 0;
	/* What the kernel only probes without auditing is no use of the capability. */
	if (modeling(&subject) && !(opts & CAP_OPT_NOAUDIT))
		record_operation(&subject, PALISADE_MODEL_CAPABILITY, cap);
	struct palisade_verdict d = {};
	__u32 allowed = 0;
	if (cap >= 0 && cap < PALISADE_CAP_COUNT) {
		struct palisade_verdict *rule =
			&subject.policy->capability[cap & (PALISADE_CAP_COUNT - 1)];
		consider(&d, rule->action, rule->rule_id);
		allowed = rule->action & PALISADE_ACTION_ALLOW;
	}
	/* A capability held in a user namespace the target created (or entered). */
	if (BPF_CORE_READ(ns, level) > 0)
		consider(&d, subject.policy->userns_capability.action,
			 subject.policy->userns_capability.rule_id);
	deny_by_default(&d, &subject, allowed ? 0 : PALISADE_DEFAULT_CAPABILITIES);
	if (d.action == PALISADE_ACTION_NONE)
		return 0;
	/* Checks the kernel makes without auditing (probes, not uses) are denied unreported. */
	if (opts & CAP_OPT_NOAUDIT)
		d.action &= ~PALISADE_ACTION_AUDIT;
	return decide(&d, &subject, cap);
}

SEC("lsm/userns_create")
int TARGET_HOOK(userns_create, const void *cred, int ret)
{
	if (ret)
		return ret;
	SUBJECT(subject, PALISADE_HOOK_USERNS_CREATE);
	if (!find_subject(&subject))
		return 0;
	if (modeling(&subject))
		record_operation(&subject, PALISADE_MODEL_OPERATION, 0);
	return decide(&subject.policy->userns_create, &subject, 0);
}

/* Commands that reach BPF objects already loaded (Palisade's among them) or pin into bpffs. */
static __always_inline int reaches_loaded_objects(int cmd)
{
	return cmd == BPF_OBJ_PIN_CMD || cmd == BPF_OBJ_GET_CMD ||
	       cmd == BPF_PROG_GET_FD_BY_ID_CMD || cmd == BPF_MAP_GET_FD_BY_ID_CMD ||
	       cmd == BPF_LINK_GET_FD_BY_ID_CMD;
}

SEC("lsm/bpf")
int TARGET_HOOK(bpf, int cmd, void *attr, unsigned int size, int ret)
{
	if (ret || (cmd != BPF_PROG_LOAD_CMD && !reaches_loaded_objects(cmd)))
		return ret;
	SUBJECT(subject, PALISADE_HOOK_BPF);
	if (!find_subject(&subject))
		return 0;
	if (modeling(&subject))
		record_operation(&subject, PALISADE_MODEL_OPERATION, cmd);
	if (reaches_loaded_objects(cmd))
		return decide(&self_protection, &subject, cmd);
	return decide(&subject.policy->bpf_prog_load, &subject, cmd);
}

/* The name the kernel gives a userfaultfd's anonymous inode, from userfaultfd(2) and from
 * /dev/userfaultfd's USERFAULTFD_IOC_NEW alike. */
static const char userfaultfd_name[] = "[userfaultfd]";
#define USERFAULTFD_NAME_LEN (sizeof(userfaultfd_name) - 1)

static __always_inline int is_userfaultfd(const struct qstr *name)
{
	char actual[USERFAULTFD_NAME_LEN];
	if (BPF_CORE_READ(name, len) != USERFAULTFD_NAME_LEN ||
	    bpf_probe_read_kernel(actual, sizeof(actual), BPF_CORE_READ(name, name)))
		return 0;
	for (int i = 0; i < USERFAULTFD_NAME_LEN; i++)
		if (actual[i] != userfaultfd_name[i])
			return 0;
	return 1;
}

/* Anonymous inodes the kernel labels as it creates them (userfaultfd, io_uring): the hook of
 * creating a userfaultfd, whose page faults handled in user space let an exploit pause the
 * kernel in the middle of a copy. */
SEC("lsm/inode_init_security_anon")
int TARGET_HOOK(inode_init_security_anon, struct inode *inode, const struct qstr *name,
		const struct inode *context_inode, int ret)
{
	if (ret || !is_userfaultfd(name))
		return ret;
	SUBJECT(subject, PALISADE_HOOK_INODE_INIT_SECURITY_ANON);
	if (!find_subject(&subject))
		return 0;
	if (modeling(&subject))
		record_operation(&subject, PALISADE_MODEL_OPERATION, 0);
	return decide(&subject.policy->userfaultfd, &subject, 0);
}
