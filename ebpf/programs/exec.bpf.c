/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Exec hooks: decided on the file really executed (bprm->file, and the interpreter of a script,
 * which the kernel checks in turn), and on every new executable mapping of a file, so that
 * loading a program through the dynamic loader (`ld.so /usr/bin/curl`) is an exec of that program
 * too. The name the program was started by is checked as well: a multi-call binary such as
 * busybox is a shell when started as /bin/sh. (mprotect to PROT_EXEC is not covered: bpf_d_path
 * is not allowed in file_mprotect.)
 */
#include "path_walk.h"

/* Decides an exec, by a task of deepest candidate `who`, by the absolute name the caller used. */
static __always_inline int check_exec_name(struct linux_binprm *bprm, const struct candidate *who)
{
	SUBJECT(subject, PALISADE_HOOK_BPRM_CHECK);
	struct scratch *s = find_path_subject_from(&subject, who);
	if (!s || !has_paths(&subject))
		return 0;
	long len = bpf_probe_read_kernel_str(s->path, PATH_BUF_LEN, bprm->filename);
	if (len <= 1 || s->path[0] != '/')
		return 0; /* relative names and fds: the resolved file was checked */
	struct palisade_verdict d = {};
	match_path(subject.policy_id, s, len, PALISADE_PERM_EXEC, &d);
	if (d.action == PALISADE_ACTION_NONE)
		return 0;
	return decide_path(&d, &subject, s, bprm->file->f_inode, PALISADE_PERM_EXEC, 0);
}

/*
 * The first exec in a cgroup a runtime is setting up ends the setup, and is decided as the
 * container's. Except the exec of a file in no mount namespace: runc 1.1 re-executing a sealed
 * copy of itself (a memfd, or a bind mount it detached) is still setting up.
 */
static __always_inline void end_runtime_setup(struct linux_binprm *bprm)
{
	__u64 id = bpf_get_current_cgroup_id();
	if (!bpf_map_lookup_elem(&runtime_setup, &id))
		return;
	if (internal_mount((__u64)BPF_CORE_READ(bprm, file, f_path.mnt)))
		return;
	bpf_map_delete_elem(&runtime_setup, &id);
}

SEC("lsm/bprm_check_security")
int TARGET_HOOK(bprm_check_security, struct linux_binprm *bprm, int ret)
{
	if (ret)
		return ret;
	end_runtime_setup(bprm);
	struct candidate who;
	if (!find_candidate(&who, NULL))
		return 0;
	int error =
		check_file(bprm->file, PALISADE_HOOK_BPRM_CHECK, PALISADE_PERM_EXEC, &who, NULL);
	if (error)
		return error;
	return check_exec_name(bprm, &who);
}

SEC("lsm/mmap_file")
int TARGET_HOOK(mmap_file, struct file *file, unsigned long reqprot, unsigned long prot,
	     unsigned long flags, int ret)
{
	if (ret)
		return ret;
	/* Anonymous mappings have no file; only executable mappings are an exec. */
	if (!file || !(prot & PROT_EXEC))
		return 0;
	struct candidate who;
	if (!find_candidate(&who, NULL))
		return 0;
	return check_file(file, PALISADE_HOOK_MMAP_FILE, PALISADE_PERM_EXEC, &who, NULL);
}
