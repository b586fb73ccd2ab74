/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Arming new cgroups. A policy may name a cgroup that does not exist yet (a pod's, a container's);
 * user space stages it in `pending` by parent and name. The kernel creates the cgroup's kernfs
 * node before mkdir returns, so before any process can be moved in: making it a target here
 * means the first instruction run inside it is already under the policy. AlwaysAllow stages too:
 * the stage may be replaced by another mode's while the cgroup is created.
 */
#include "common.h"

SEC("lsm/kernfs_init_security")
int GATED_HOOK(nothing_targeted, kernfs_init_security, struct kernfs_node *kn_dir,
	       struct kernfs_node *kn, int ret)
{
	if (ret)
		return ret;
	if ((kn->flags & KERNFS_TYPE_MASK) != KERNFS_DIR)
		return 0;
	struct palisade_pending_key key = { .parent_id = BPF_CORE_READ(kn_dir, id) };
	bpf_probe_read_kernel_str(key.name, sizeof(key.name), BPF_CORE_READ(kn, name));
	struct palisade_target *target = bpf_map_lookup_elem(&pending, &key);
	if (!target)
		return 0;
	__u64 id = BPF_CORE_READ(kn, id);
	struct palisade_target armed = *target;
	bpf_map_update_elem(&targets, &id, &armed, BPF_ANY);
	return 0;
}
