/* SPDX-License-Identifier: GPL-2.0-only */
/* Exec hooks: decided on the file really executed (bprm->file), not the name the caller passed. */
#include "path_match.h"

SEC("lsm/bprm_check_security")
int BPF_PROG(bprm_check_security, struct linux_binprm *bprm, int ret)
{
	if (ret)
		return ret;
	return check_path(bprm->file, PALISADE_HOOK_BPRM_CHECK, PALISADE_PERM_EXEC);
}
