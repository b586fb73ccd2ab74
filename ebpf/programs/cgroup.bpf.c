/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * New cgroups. A policy may name a cgroup that does not exist yet (a pod's, a container's);
 * user space stages it in `pending` by parent and name. The kernel creates the cgroup's kernfs
 * node before mkdir returns, so before any process can be moved in: making it a target here
 * means the first instruction run inside it is already under the policy. AlwaysAllow stages too:
 * the stage may be replaced by another mode's while the cgroup is created.
 *
 * A cgroup made for or under a target by a task outside the target it is made in is a container
 * being set up: a runtime (runc, crun, systemd) moves a process in, prepares the container there,
 * then executes its entrypoint. DefenseInDepth and recording policies apply to a container from
 * that exec on: what the runtime does before (mounting the container's root, pivot_root,
 * dropping capabilities: paths and mounts that change with every container, nothing the
 * workload does) is neither denied by default nor modeled, while deny rules still apply. Such a
 * cgroup is marked in `runtime_setup` until its first exec (exec.bpf.c). A cgroup a target's own
 * task makes in it is never marked.
 */
#include "common.h"

/* Whether a policy spares runtime setup: DefenseInDepth and recording policies. */
static __always_inline int spares_runtime_setup(const struct palisade_policy *policy)
{
	return policy->defaults || (policy->flags & PALISADE_POLICY_MODELING);
}

/* The nearest target at or above `cgroup`: its id and level. */
static __always_inline struct palisade_target *target_above(struct cgroup *cgroup,
							    __u64 *target_id,
							    __u32 *target_level)
{
	__u64 levels = levels_of(gate_levels());
	__u32 depth = BPF_CORE_READ(cgroup, level);
	struct palisade_target *found = NULL;
	for (__u32 level = 0; level <= PALISADE_MAX_LEVEL; level++) {
		if (level > depth || !(levels >> level))
			break;
		if (!((levels >> level) & 1))
			continue;
		struct cgroup *ancestor = NULL;
		if (bpf_core_read(&ancestor, sizeof(ancestor), &cgroup->ancestors[level]))
			break;
		__u64 id = BPF_CORE_READ(ancestor, kn, id);
		struct palisade_target *target = bpf_map_lookup_elem(&targets, &id);
		if (target) {
			/* Keep going: a deeper target's own policy wins. */
			found = target;
			*target_id = id;
			*target_level = level;
		}
	}
	return found;
}

/* Marks cgroup `id` as being set up if its target's policy spares runtime setup. */
static __always_inline void mark_runtime_setup(__u64 id, const struct palisade_target *target)
{
	struct palisade_policy *policy = bpf_map_lookup_elem(&policies, &target->policy_id);
	if (!policy || !spares_runtime_setup(policy))
		return;
	__u64 made = bpf_ktime_get_ns();
	bpf_map_update_elem(&runtime_setup, &id, &made, BPF_ANY);
}

SEC("lsm/kernfs_init_security")
int GATED_HOOK(nothing_targeted, kernfs_init_security, struct kernfs_node *kn_dir,
	       struct kernfs_node *kn, int ret)
{
	if (ret)
		return ret;
	if ((kn->flags & KERNFS_TYPE_MASK) != KERNFS_DIR)
		return 0;
	/* Only directories of the cgroup2 hierarchy, the one targets are in: a cgroup's directory
	 * points to the cgroup, which points back and to its hierarchy's root. */
	struct cgroup *parent = BPF_CORE_READ(kn_dir, priv);
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (!parent || BPF_CORE_READ(parent, kn) != kn_dir ||
	    BPF_CORE_READ(parent, root) != BPF_CORE_READ(task, cgroups, dfl_cgrp, root))
		return 0;
	__u64 id = BPF_CORE_READ(kn, id);
	/* The target the parent is in, and whether the task making the cgroup is in it too. */
	__u64 above_id = 0;
	__u32 above_level = 0;
	struct palisade_target *above = target_above(parent, &above_id, &above_level);
	int made_inside = above && bpf_get_current_ancestor_cgroup_id(above_level) == above_id;
	struct palisade_pending_key key = { .parent_id = BPF_CORE_READ(kn_dir, id) };
	bpf_probe_read_kernel_str(key.name, sizeof(key.name), BPF_CORE_READ(kn, name));
	struct palisade_target *staged = bpf_map_lookup_elem(&pending, &key);
	if (staged) {
		struct palisade_target armed = *staged;
		mark_target(id);
		bpf_map_update_elem(&targets, &id, &armed, BPF_ANY);
		if (!made_inside)
			mark_runtime_setup(id, &armed);
	} else if (above && !made_inside) {
		mark_runtime_setup(id, above);
	}
	return 0;
}
