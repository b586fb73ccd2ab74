/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Exec hooks: decided on the file really executed (bprm->file), not the name the caller passed,
 * and on every new executable mapping of a file, so that loading a program through the dynamic
 * loader (`ld.so /usr/bin/curl`) is an exec of that program too. (mprotect to PROT_EXEC is not
 * covered: bpf_d_path is not allowed in file_mprotect; it needs inode identity.)
 */
#include "path_match.h"

SEC("lsm/bprm_check_security")
int BPF_PROG(bprm_check_security, struct linux_binprm *bprm, int ret)
{
	if (ret)
		return ret;
	return check_path(bprm->file, PALISADE_HOOK_BPRM_CHECK, PALISADE_PERM_EXEC);
}

SEC("lsm/mmap_file")
int BPF_PROG(mmap_file, struct file *file, unsigned long reqprot, unsigned long prot,
	     unsigned long flags, int ret)
{
	if (ret)
		return ret;
	/* Anonymous mappings have no file; only executable mappings are an exec. */
	if (!file || !(prot & PROT_EXEC))
		return 0;
	return check_path(file, PALISADE_HOOK_MMAP_FILE, PALISADE_PERM_EXEC);
}
