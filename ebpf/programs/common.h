/* SPDX-License-Identifier: GPL-2.0-only */
/* Maps, target lookup, statistics and event emission shared by every hook family. */
#ifndef PALISADE_COMMON_H
#define PALISADE_COMMON_H

#include "palisade.h"

#define PATH_BUF_LEN 4096 /* PATH_MAX: bpf_d_path fails on anything longer */
/* Depth of a file, at most, that a file cut off from its mount can be placed at. */
#define PLACE_MAX_DEPTH 64

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct palisade_config);
} config SEC(".maps");

/*
 * Maps whose size is marked "sized at load" get it from the agent's configuration. Hashes the
 * programs insert into when a cgroup is armed (`targets`) stay preallocated, so arming never
 * fails for want of memory; the others allocate entries as they are written.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized at load: agent/src/bpf/sizes.rs */
	__type(key, __u64);
	__type(value, struct palisade_target);
} targets SEC(".maps");

/*
 * What hooks read before they know whether the task is a target, in the one value of one map
 * (palisade.h: its layout), so that one lookup finds all of it:
 * - `target_filter`: the cgroups that may be targets. The byte of every cgroup in `targets` (its
 *   id modulo the filter's size: ids are mostly consecutive, and spread evenly) is set before
 *   its entry is added, by the agent or by kernfs_init_security arming a staged cgroup. A clear
 *   byte answers "not a target" with one load, where `targets` would hash the id. The byte of a
 *   cgroup no longer a target stays set, costing a lookup, until the agent rebuilds the filter
 *   while nothing is staged (no program sets a byte then);
 * - the open verdict cache's generation and slots (open_cache.h), which file_open reads next.
 *   Besides its top bit (PALISADE_OPEN_CACHE_OFF_BIT), the generation only grows, by atomic
 *   adds, so that a slot's never comes back.
 * The agent writes it through a mapping, with atomic operations as the programs do. A map, not
 * global data: the loader writes a global's initial value also into a pinned copy it adopts.
 */
#define OPEN_SLOT_BITS 14
#define OPEN_SLOTS (1u << OPEN_SLOT_BITS)
struct fast_path {
	__u64 open_generation __attribute__((aligned(64)));
	__u8 target_filter[PALISADE_TARGET_FILTER_CGROUPS] __attribute__((aligned(64)));
	/* struct open_slot (open_cache.h) */
	__u8 open_slots[OPEN_SLOTS][PALISADE_OPEN_SLOT_SIZE] __attribute__((aligned(64)));
};
_Static_assert(__builtin_offsetof(struct fast_path, open_generation) ==
		       PALISADE_FAST_PATH_OPEN_GENERATION &&
		       __builtin_offsetof(struct fast_path, target_filter) ==
			       PALISADE_FAST_PATH_TARGET_FILTER &&
		       __builtin_offsetof(struct fast_path, open_slots) ==
			       PALISADE_FAST_PATH_OPEN_SLOTS &&
		       OPEN_SLOTS == PALISADE_OPEN_SLOTS,
	       "the agent maps the fast path by palisade.h's offsets");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fast_path);
} fast_path SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_inode_key);
	__type(value, __u32); /* PALISADE_PROTECT_* */
} protected_inodes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized at load */
	__type(key, struct palisade_pending_key);
	__type(value, struct palisade_target);
} pending SEC(".maps");

/*
 * Cgroups a container runtime is setting up (cgroup.bpf.c), by when they were made. A setup ends
 * at the cgroup's first exec, or RUNTIME_SETUP_NS after it was made, whichever comes first: an
 * exec the programs did not see (while no target was enforced) leaves no container spared for
 * long. Evicting an entry ends its setup early: the safe side.
 */
#define RUNTIME_SETUP_NS (30ull * 1000 * 1000 * 1000)

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64); /* bpf_ktime_get_ns() when made */
} runtime_setup SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct palisade_policy);
} policies SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_mount_type_key);
	__type(value, struct palisade_verdict);
} mount_types SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_socket_key);
	__type(value, struct palisade_verdict);
} sockets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_network_key);
	__type(value, struct palisade_verdict);
} network SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_trie_key);
	__type(value, struct palisade_path_verdict);
} path_prefixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_trie_key);
	__type(value, struct palisade_path_verdict);
} path_suffixes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_glob_key);
	__type(value, struct palisade_glob_rule);
} globs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_inode_rule_key);
	__type(value, struct palisade_inode_verdict);
} inode_rules SEC(".maps");

#define EVENTS_RING_SIZE (1 << 21)
/* Unread records past which every submit wakes the agent (see submit_event). */
#define EVENTS_WAKE_AT (EVENTS_RING_SIZE / 4)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	/* ~4,800 events: the fastest flood (~55,000 a second) fills a quarter in ~22 ms. */
	__uint(max_entries, EVENTS_RING_SIZE);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PALISADE_STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_rule_key);
	__type(value, struct palisade_rule_count);
} rule_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1); /* sized at load */
	__type(key, struct palisade_bucket_key);
	__type(value, struct palisade_bucket);
} audit_buckets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1); /* sized at load */
	__type(key, __u64); /* operation_hash */
	__type(value, __u8);
} reported SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PALISADE_HOOK_COUNT);
	__type(key, __u32);
	__type(value, struct palisade_hook_cost);
} hook_cost SEC(".maps");

/*
 * Never read by programs. Updating a map-in-map makes the kernel wait until every running BPF
 * program has finished (maybe_wait_bpf_programs), so user space writes `sync_barrier` to know
 * that no program still uses entries it is about to delete.
 */
struct sync_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} sync_inner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct sync_inner);
} sync_barrier SEC(".maps");

/*
 * Per-CPU working memory: too large for the 512-byte BPF stack. LSM programs only disable
 * migration, so on a fully preemptible kernel a task preempted mid-decision could find this
 * overwritten by another task's decision on the same CPU (see the note in README.md).
 */
struct scratch {
	char path[PATH_BUF_LEN];
	/* Paths built backwards by path_walk.h: room for a name of NAME_MAX bytes written at any
	 * offset below PATH_BUF_LEN. */
	char walk[PATH_BUF_LEN + NAME_MAX + 1];
	/* A file's dentry and its parents, while path_walk.h looks for a mount that holds it. */
	__u64 ancestors[PLACE_MAX_DEPTH];
	struct palisade_trie_key key;
	/* Where the last word path_match.h writes into the key's path runs past it. */
	__u8 key_overrun[8];
	struct palisade_model_key model; /* model.h */
};

_Static_assert(__builtin_offsetof(struct scratch, key.data.path) % 8 == 0,
	       "path_match.h writes the key's path a word at a time");

/* The word at `at`, aligned or not, in one load: clang splits a load it cannot prove aligned
 * into a load a byte; the verifier checks alignment only when asked to (BPF_F_STRICT_ALIGNMENT)
 * and the JITs of x86 and arm64 load unaligned words. */
static __always_inline __u64 unaligned_word(const void *at)
{
	__u64 word;
	asm volatile("%0 = *(u64 *)(%1 + 0)" : "=r"(word) : "r"(at) : "memory");
	return word;
}

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch_space SEC(".maps");

/* This CPU's scratch memory: NULL never in practice. */
static __always_inline struct scratch *scratch_memory(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&scratch_space, &zero);
}

/* A barrier between loads: no load after it is done before one before it. x86 keeps loads in
 * order (TSO): only the compiler is to be held. Elsewhere an exchange (an add whose result is
 * unused is not a barrier on arm64), on the stack so that no cache line bounces between CPUs;
 * its address escapes, so that the compiler keeps it. */
static __always_inline void load_barrier(void)
{
#ifdef __TARGET_ARCH_x86
	asm volatile("" ::: "memory");
#else
	__u64 fence = 0;
	asm volatile("" ::"r"(&fence) : "memory");
	__sync_val_compare_and_swap(&fence, 0, 0);
#endif
}

static __always_inline void stat_inc(__u32 index)
{
	__u64 *count = bpf_map_lookup_elem(&stats, &index);
	if (count)
		__sync_fetch_and_add(count, 1);
}

/*
 * Global data, a one-entry array map the programs address directly: reading it needs no lookup,
 * no null check and no stack. The loader writes this initial value also into a pinned copy it
 * adopts, so that until an agent restarting publishes the gate the programs look for targets at
 * every level.
 */
struct palisade_gate gate SEC(".data.gate") = {
	.levels = ((1ull << (PALISADE_MAX_LEVEL + 1)) - 1) << PALISADE_LEVELS_SHIFT, /* from 0 */
	.enforced = 1,
};

/* The gate's `levels` word. */
static __always_inline __u64 gate_levels(void)
{
	return *(volatile __u64 *)&gate.levels;
}

/* The lowest level where some target (or staged one) sits, of a gate's `levels` word. */
static __always_inline __u32 first_level(__u64 word)
{
	return word; /* the low half */
}

/* The levels where some target (or staged one) sits, from the lowest, of a gate's `levels`
 * word: bit 0 is first_level's. */
static __always_inline __u64 levels_from_first(__u64 word)
{
	return word >> PALISADE_LEVELS_SHIFT;
}

/* The levels where some target (or staged one) sits, of a gate's `levels` word. */
static __always_inline __u64 levels_of(__u64 word)
{
	return levels_from_first(word) << first_level(word);
}

/* Whether no cgroup is a target, nor staged to become one. */
static __always_inline int nothing_targeted(void)
{
	return !gate_levels();
}

/* Whether every target and stage, if any, is in AlwaysAllow: then no hook decides anything. */
static __always_inline int nothing_enforced(void)
{
	return !*(volatile __u32 *)&gate.enforced;
}

/*
 * An LSM program, declared as with BPF_PROG (the hook's arguments, then `ret`, the answer of the
 * LSMs before this one), that has nothing to do while `idle()`: it then answers `ret` after one
 * load of the gate. Its body is a function of its own, so that this path sets up no stack and
 * saves no register: the JIT gives a program one frame, and the body's (its callee-saved registers
 * and stack) would cost every idle run ~8 instructions more, where a decision pays ~9 for the
 * call.
 */
#define GATED_HOOK(idle, name, args...)                                                            \
	name(unsigned long long *ctx);                                                             \
	static __noinline int ____##name##_body(unsigned long long *ctx);                          \
	static __always_inline int ____##name(unsigned long long *ctx, ##args);                    \
	int name(unsigned long long *ctx)                                                          \
	{                                                                                          \
		if (idle())                                                                        \
			return (int)ctx[___bpf_narg(args) - 1];                                    \
		return ____##name##_body(ctx);                                                     \
	}                                                                                          \
	static __noinline int ____##name##_body(unsigned long long *ctx)                           \
	{                                                                                          \
		_Pragma("GCC diagnostic push")                                                     \
		_Pragma("GCC diagnostic ignored \"-Wint-conversion\"")                             \
		return ____##name(___bpf_ctx_cast(args));                                          \
		_Pragma("GCC diagnostic pop")                                                      \
	}                                                                                          \
	static __always_inline int ____##name(unsigned long long *ctx, ##args)

/* A program whose every decision is about a target whose policy is not AlwaysAllow. */
#define TARGET_HOOK(name, args...) GATED_HOOK(nothing_enforced, name, ##args)

/* The fast path's value (NULL never in practice). */
static __always_inline struct fast_path *fast_path_value(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&fast_path, &zero);
}

/* The target filter's byte of cgroup `id`. */
static __always_inline __u8 *filter_byte(struct fast_path *fast, __u64 id)
{
	return &fast->target_filter[id % PALISADE_TARGET_FILTER_CGROUPS];
}

/* Whether cgroup `id` may be a target, by the filter in `fast` (the fast path's value, NULL to
 * look it up): false only for one that is not. */
static __always_inline int may_be_target(struct fast_path *fast, __u64 id)
{
	if (!fast)
		fast = fast_path_value();
	if (!fast)
		return 1;
	/* Keeps the compiler from computing the filter's address, in a loop, before the test. */
	barrier_var(fast);
	return *(volatile __u8 *)filter_byte(fast, id);
}

/* Lets cgroup `id` be a target, before its entry is added (which publishes the byte with a
 * release). A byte is only ever set by programs: a store suffices. */
static __always_inline void mark_target(__u64 id)
{
	struct fast_path *fast = fast_path_value();
	if (fast)
		*(volatile __u8 *)filter_byte(fast, id) = 1;
}

/*
 * The current task's deepest candidate: of its cgroup and those above it, at the levels where
 * some target sits, the deepest the filter has a bit for. It fixes which targets the task is
 * under: tasks with the same deepest candidate share every cgroup from there up, and are under
 * no target below it.
 */
struct candidate {
	__u64 id; /* 0: none, the task is under no target */
	__u32 level;
};

/*
 * The id of the current task's deepest candidate at the levels of the gate's `levels` word
 * `gate_word`, 0 if none, and its level into `*level`. One helper call and one load per level
 * where some target sits, from the lowest (a Kubernetes pod's containers sit at level 4, and no
 * turn is spent above), none deeper than the task: a task under no target is told so without a
 * hash lookup. `fast`: the fast path's value, or NULL for it to be looked up at each level the
 * task sits at (a pointer that may be NULL, kept from turn to turn, would multiply the states
 * the verifier walks by the turns). Inlined: every hook runs it first, and a call would cost
 * ~20 instructions more. The loop counts from 0 and shifts the levels instead of starting at
 * the lowest: 6.1's verifier gives up on a loop of an unknown start.
 */
static __always_inline __u64 deepest_candidate(struct fast_path *fast, __u64 gate_word,
					       __u32 *level)
{
	__u32 first = first_level(gate_word);
	/* Shifted by one a turn: a shift by a register costs the x86 JIT four instructions. */
	__u64 from_here = levels_from_first(gate_word);
	if (from_here == 1) {
		/* Targets at one level (Kubernetes puts every pod's containers at one): no loop, whose
		 * variables cost stack spills around the helper call (~30 instructions). */
		*level = first;
		__u64 id = bpf_get_current_ancestor_cgroup_id(first);
		return id && may_be_target(fast, id) ? id : 0;
	}
	__u64 found = 0;
	for (__u64 turn = 0; turn <= PALISADE_MAX_LEVEL; turn++, from_here >>= 1) {
		if (!from_here)
			break; /* no target this deep */
		if (!(from_here & 1))
			continue;
		__u32 at = first + turn;
		__u64 id = bpf_get_current_ancestor_cgroup_id(at);
		if (!id)
			break; /* the task sits above this level */
		if (may_be_target(fast, id)) {
			found = id;
			*level = at;
		}
	}
	return found;
}

/*
 * The id of the deepest target above the current task's deepest candidate `candidate` (at the
 * levels `levels`), 0 if none, and its level into `*level`: where the candidate's byte is another
 * cgroup's or a former target's. A global function: the verifier checks its loop once, and the
 * states of its callers do not multiply by its levels.
 */
__noinline __u64 target_above_candidate(__u64 levels, __u64 candidate, __u32 *level)
{
	__u64 found = 0;
	if (!level)
		return 0;
	for (__u32 at = 0; at <= PALISADE_MAX_LEVEL; at++) {
		if (!(levels >> at))
			break;
		if (!((levels >> at) & 1))
			continue;
		__u64 id = bpf_get_current_ancestor_cgroup_id(at);
		if (!id || id == candidate)
			break;
		/* Keep going: a deeper target's own policy wins. */
		if (may_be_target(NULL, id) && bpf_map_lookup_elem(&targets, &id)) {
			found = id;
			*level = at;
		}
	}
	return found;
}

/* Finds the current task's deepest candidate; false when it is under no target. `fast`: the fast
 * path's value, if the hook looked it up already (NULL: looked up where needed). */
static __always_inline int find_candidate(struct candidate *who, struct fast_path *fast)
{
	who->level = 0; /* written only where a candidate is found */
	who->id = deepest_candidate(fast, gate_levels(), &who->level);
	return who->id != 0;
}

/*
 * The target covering the current task, of deepest candidate `who`: the deepest target wins.
 * Mostly the deepest candidate is the target, found by one hash lookup; the levels above are
 * probed only where it is not.
 */
static __always_inline struct palisade_target *current_target(const struct candidate *who,
							      __u64 *target_cgroup_id,
							      __u32 *target_level)
{
	__u64 id = who->id;
	__u32 level = who->level;
	struct palisade_target *found = bpf_map_lookup_elem(&targets, &id);
	if (!found) {
		id = target_above_candidate(levels_of(gate_levels()), who->id, &level);
		if (!id)
			return NULL;
		found = bpf_map_lookup_elem(&targets, &id);
		if (!found)
			return NULL; /* removed meanwhile */
	}
	*target_cgroup_id = id;
	*target_level = level;
	return found;
}

/* A decision in a hook about the current task: the target it is in and its policy's entry. */
struct subject {
	__u32 hook;
	__u32 target_level;
	__u64 target_cgroup_id;
	struct palisade_target *target;
	/* The target's policy id, read once: the agent repoints a target in place, and every part
	 * of one decision must be of the same policy. */
	__u32 policy_id;
	struct palisade_policy *policy;
	struct palisade_config *config;
	__u64 started_ns; /* when decisions are timed: when this one found its policy */
};

/* Adds the time of a decision on a target to its hook's cost, if decisions are timed. */
static __always_inline void account_cost(struct subject *subject)
{
	if (!subject->started_ns)
		return;
	__u32 hook = subject->hook;
	struct palisade_hook_cost *cost = bpf_map_lookup_elem(&hook_cost, &hook);
	if (cost) {
		__sync_fetch_and_add(&cost->ns, bpf_ktime_get_ns() - subject->started_ns);
		__sync_fetch_and_add(&cost->count, 1);
	}
}

/* Declares the subject of a decision in `hook_id`. Every return, after its value is computed,
 * accounts the decision's cost. */
#define SUBJECT(name, hook_id)                                                                   \
	struct subject name __attribute__((cleanup(account_cost))) = { .hook = (hook_id) }

/* Fills `subject` when the current task, of deepest candidate `who`, is a target whose policy is
 * not AlwaysAllow; false otherwise. */
static __always_inline int find_subject_from(struct subject *subject,
					      const struct candidate *who)
{
	__u32 zero = 0;
	subject->config = bpf_map_lookup_elem(&config, &zero);
	if (!subject->config)
		return 0;
	subject->target =
		current_target(who, &subject->target_cgroup_id, &subject->target_level);
	if (!subject->target)
		return 0;
	subject->policy_id = subject->target->policy_id;
	subject->policy = bpf_map_lookup_elem(&policies, &subject->policy_id);
	if (!subject->policy || (subject->policy->flags & PALISADE_POLICY_ALWAYS_ALLOW))
		return 0;
	if (subject->config->measure_cost)
		subject->started_ns = bpf_ktime_get_ns();
	return 1;
}

/* find_subject_from the current task's deepest candidate. */
static __always_inline int find_subject(struct subject *subject)
{
	struct candidate who;
	return find_candidate(&who, NULL) && find_subject_from(subject, &who);
}

/* Adds a rule's action to a decision: the stronger one wins (an allow bit is no action). */
static __always_inline void consider(struct palisade_verdict *d, __u32 action, __u32 rule_id)
{
	action &= ~PALISADE_ACTION_ALLOW;
	if (action > d->action) {
		d->action = action;
		d->rule_id = rule_id;
	}
}

/* Whether the current task is in a cgroup a container runtime is setting up: its default
 * denials and recording do not apply (cgroup.bpf.c). */
static __always_inline int in_runtime_setup(void)
{
	__u64 id = bpf_get_current_cgroup_id();
	__u64 *made = bpf_map_lookup_elem(&runtime_setup, &id);
	return made && bpf_ktime_get_ns() - *made < RUNTIME_SETUP_NS;
}

/* DefenseInDepth: adds the policy's default denial when the operation falls in one of
 * `categories` (PALISADE_DEFAULT_* or PALISADE_PERM_* bits) that the policy denies unless
 * allowed; callers pass only the categories no allow rule covered. Returns whether a denial was
 * spared because the task's container is being set up. */
static __always_inline int deny_by_default(struct palisade_verdict *d,
					   const struct subject *subject, __u32 categories)
{
	if (!(subject->policy->defaults & categories))
		return 0;
	if (in_runtime_setup())
		return 1;
	consider(d, subject->policy->default_deny.action, subject->policy->default_deny.rule_id);
	return 0;
}

static __always_inline int verdict_error(const struct palisade_verdict *d)
{
	return (d->action & PALISADE_ACTION_DENY) ? -EPERM : 0;
}

/* Decisions are counted by policy, rule, hook and whether they denied. */
static __always_inline struct palisade_rule_key rule_key(__u32 policy_id, __u32 rule_id, __u32 hook,
							 __u32 action)
{
	return (struct palisade_rule_key){
		.policy_id = policy_id,
		.rule_id = rule_id,
		.hook = hook,
		.action = (action & PALISADE_ACTION_DENY) ? PALISADE_ACTION_DENY : PALISADE_ACTION_AUDIT,
	};
}

/* Counts a decision by rule, hook and action; returns its counters (NULL if the map is full). */
static __always_inline struct palisade_rule_count *count_decision(const struct palisade_verdict *d,
								  const struct subject *subject)
{
	struct palisade_rule_key key =
		rule_key(subject->policy_id, d->rule_id, subject->hook, d->action);
	struct palisade_rule_count *count = bpf_map_lookup_elem(&rule_counts, &key);
	if (!count) {
		struct palisade_rule_count zero = {};
		bpf_map_update_elem(&rule_counts, &key, &zero, BPF_NOEXIST);
		count = bpf_map_lookup_elem(&rule_counts, &key);
		if (!count) {
			stat_inc(PALISADE_STAT_UNCOUNTED);
			return NULL;
		}
	}
	__sync_fetch_and_add(&count->decisions, 1);
	return count;
}

/* An event the audit rate suppressed: counted for its rule (`count` may be NULL) and in all. */
static __always_inline void count_throttled(struct palisade_rule_count *count)
{
	if (count)
		__sync_fetch_and_add(&count->throttled, 1);
	stat_inc(PALISADE_STAT_EVENTS_THROTTLED);
}

/* Audit rates are kept by policy and rule. */
static __always_inline struct palisade_bucket_key bucket_key(__u32 rule_id,
							     const struct subject *subject)
{
	return (struct palisade_bucket_key){
		.policy_id = subject->policy_id,
		.rule_id = rule_id,
	};
}

/*
 * Whether the audit rate of rule `rule_id` on the subject's target lets one more event
 * through (a token bucket in nanoseconds of credit). Sets `suppressed` to the events it held back
 * since the last one. Concurrent decisions may race on the bucket: the rate is approximate, the
 * counts are not.
 */
static __always_inline int audit_allowed(__u32 rule_id, const struct subject *subject,
					 __u32 *suppressed)
{
	__u64 interval = subject->config->audit_interval_ns;
	__u64 burst = subject->config->audit_burst_ns;
	if (!interval)
		return 1;
	struct palisade_bucket_key key = bucket_key(rule_id, subject);
	__u64 now = bpf_ktime_get_ns();
	struct palisade_bucket *bucket = bpf_map_lookup_elem(&audit_buckets, &key);
	if (!bucket) {
		struct palisade_bucket fresh = { .credit_ns = burst - interval, .updated_ns = now };
		bpf_map_update_elem(&audit_buckets, &key, &fresh, BPF_NOEXIST);
		return 1;
	}
	__u64 credit = bucket->credit_ns + (now - bucket->updated_ns);
	if (credit > burst)
		credit = burst;
	bucket->updated_ns = now;
	if (credit < interval) {
		bucket->credit_ns = credit;
		__sync_fetch_and_add(&bucket->suppressed, 1);
		return 0;
	}
	bucket->credit_ns = credit - interval;
	__u64 held = bucket->suppressed;
	__sync_fetch_and_add(&bucket->suppressed, -held);
	*suppressed = held;
	return 1;
}

/*
 * Records a decision: counts it, and reserves its audit event when the rule reports it and its
 * audit rate allows (for a trial's default decision, submit_event checks the rate); the caller
 * fills in what it knows and submits. NULL when there is no event to fill: not reported,
 * throttled or the ring buffer full (each counted, never silent).
 */
static __always_inline struct palisade_event *record(const struct palisade_verdict *d,
						      const struct subject *subject)
{
	if (d->action == PALISADE_ACTION_NONE)
		return NULL;
	struct palisade_rule_count *count = count_decision(d, subject);
	if (!(d->action & PALISADE_ACTION_AUDIT))
		return NULL;
	/* A trial's default decisions are reported once per operation: their audit rate is
	 * applied to operations not reported before (submit_event). */
	int once = (subject->policy->flags & PALISADE_POLICY_REPORT_ONCE) &&
		   d->rule_id == subject->policy->default_deny.rule_id;
	__u32 suppressed = 0;
	if (!once && !audit_allowed(d->rule_id, subject, &suppressed)) {
		count_throttled(count);
		return NULL;
	}
	struct palisade_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		stat_inc(PALISADE_STAT_EVENTS_DROPPED);
		return NULL;
	}
	/* Ring buffer memory is not zeroed. */
	__builtin_memset(e, 0, __builtin_offsetof(struct palisade_event, comm));
	e->path[0] = 0;
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	e->time_ns = bpf_ktime_get_boot_ns();
	e->cgroup_id = bpf_get_current_cgroup_id();
	e->target_cgroup_id = subject->target_cgroup_id;
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->uid = (__u32)bpf_get_current_uid_gid();
	e->hook = subject->hook;
	e->action = d->action;
	e->rule_id = d->rule_id;
	e->policy_id = subject->policy_id;
	e->error = verdict_error(d);
	e->suppressed = suppressed;
	e->once = once;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	return e;
}

/* FNV-1a over the policy and what an event says its operation was, whichever hook saw it (an exec
 * is decided at bprm_check and again at the mapping of the program): the fields of every hook's
 * operation (unused ones are zero) and the path up to its NUL, eight bytes at a time (a loop of
 * one branch per byte made up a third of what the verifier checks at an agent's start on 6.1).
 * Not who did it, nor when. */
static __always_inline __u64 operation_hash(const struct palisade_event *e)
{
	const __u64 prime = 0x100000001b3ULL;
	const __u64 ones = 0x0101010101010101ULL;
	__u64 hash = 0xcbf29ce484222325ULL;
	__u32 words[] = { e->policy_id, e->perms, e->arg,     e->family,
			  e->protocol,  e->port,  e->rdev };
	for (__u32 i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		hash = (hash ^ words[i]) * prime;
	for (__u32 i = 0; i < sizeof(e->addr); i++)
		hash = (hash ^ e->addr[i]) * prime;
	for (__u32 i = 0; i < sizeof(e->fs_type); i++)
		hash = (hash ^ e->fs_type[i]) * prime;
	for (__u32 i = 0; i < sizeof(e->path) / sizeof(__u64); i++) {
		__u64 word;
		__builtin_memcpy(&word, &e->path[i * sizeof(__u64)], sizeof(word));
		/* The lowest byte flagged is the first NUL (little-endian): the bytes before it. */
		__u64 nul = (word - ones) & ~word & (ones << 7);
		if (nul)
			word &= ((nul & -nul) >> 7) - 1;
		hash = (hash ^ word) * prime;
		if (nul)
			break;
	}
	return hash;
}

/*
 * Whether a DefenseInDepth trial's event is sent: the first of its operation that the audit rate
 * lets through, remembered then. A throttled operation is not remembered, so it is reported when
 * it happens again with credit left; a full map forgets the operation least recently seen. (With
 * the ring buffer full there is no event to look at: a repeat then counts as dropped.)
 */
static __always_inline int first_report(struct palisade_event *e, const struct subject *subject)
{
	__u64 key = operation_hash(e);
	/* A lookup marks the operation recently seen; an update of an LRU map takes a free entry
	 * (evicting one when full) before it finds the key there: only for a new operation. */
	if (bpf_map_lookup_elem(&reported, &key)) {
		stat_inc(PALISADE_STAT_EVENTS_REPEATED);
		return 0;
	}
	if (!audit_allowed(e->rule_id, subject, &e->suppressed)) {
		struct palisade_rule_key rule = rule_key(subject->policy_id, e->rule_id,
							 subject->hook, e->action);
		count_throttled(bpf_map_lookup_elem(&rule_counts, &rule));
		return 0;
	}
	__u8 seen = 1;
	/* Another CPU may have remembered it since. Before 6.4 a map's error reaches the program as
	 * a 32-bit int, zero-extended. */
	if ((int)bpf_map_update_elem(&reported, &key, &seen, BPF_NOEXIST) == -EEXIST) {
		stat_inc(PALISADE_STAT_EVENTS_REPEATED);
		/* Not sent after all: the count of suppressed events it took goes back. */
		struct palisade_bucket_key bucket = bucket_key(e->rule_id, subject);
		struct palisade_bucket *held = bpf_map_lookup_elem(&audit_buckets, &bucket);
		if (held && e->suppressed)
			__sync_fetch_and_add(&held->suppressed, e->suppressed);
		return 0;
	}
	return 1;
}

/*
 * The agent is woken for a record submitted to an empty ring buffer (the kernel's default), then
 * reads at its own pace, in batches: it is woken again before then only once a quarter of the
 * ring buffer waits, so that a flood is read before the ring buffer fills. A DefenseInDepth
 * trial's event that is not its operation's first report is discarded (and counted).
 */
static __always_inline void submit_event(struct palisade_event *e, const struct subject *subject)
{
	if (e->once && !first_report(e, subject)) {
		bpf_ringbuf_discard(e, 0);
		return;
	}
	__u64 flags = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > EVENTS_WAKE_AT ?
			      BPF_RB_FORCE_WAKEUP :
			      0;
	bpf_ringbuf_submit(e, flags);
	stat_inc(PALISADE_STAT_EVENTS);
}

/* The decision of the built-in protection of Palisade itself: always denied and reported. */
static const struct palisade_verdict self_protection = {
	.action = PALISADE_ACTION_DENY | PALISADE_ACTION_AUDIT,
	.rule_id = PALISADE_RULE_SELF_PROTECTION,
};

/* The `protected_inodes` key of `inode`. */
static __always_inline struct palisade_inode_key inode_key(struct inode *inode)
{
	return (struct palisade_inode_key){ .ino = inode->i_ino, .dev = inode->i_sb->s_dev };
}

/*
 * The `protected_inodes` key of the inode of `dentry`, all zero for a negative dentry (the name
 * a hook creating a file is given). Whether it has an inode is read as a number, and the pointer
 * used only where it equals that number: 6.12's verifier takes `d_inode` of a dentry a hook was
 * given for never NULL, and may drop a test of the pointer.
 */
static __always_inline struct palisade_inode_key dentry_key(struct dentry *dentry)
{
	__u64 address = 0;
	bpf_core_read(&address, sizeof(address), &dentry->d_inode);
	struct inode *inode = dentry->d_inode;
	return address && (__u64)inode == address ? inode_key(inode) : (struct palisade_inode_key){};
}

/* The `protected_inodes` key of the directory holding `dentry`. Its parent is reached by a walk,
 * whose loads the verifier guards: a dentry's parent is never negative. */
static __always_inline struct palisade_inode_key parent_key(struct dentry *dentry)
{
	return inode_key(dentry->d_parent->d_inode);
}

/* What the agent protects the inode of `key` against (PALISADE_PROTECT_*), 0 if it is not its. */
static __always_inline __u32 protection_of(struct palisade_inode_key key)
{
	if (!key.ino)
		return 0;
	__u32 *protection = bpf_map_lookup_elem(&protected_inodes, &key);
	return protection ? *protection : 0;
}

/*
 * Self-protection overrides every rule when `perms` would change a protected file (of `dentry`,
 * its inode's key `file`), bpffs or an entry of a protected directory, or read a file the agent
 * keeps from targets (its audit trail). The key is the caller's: the open verdict cache read it
 * already.
 */
static __always_inline void protect_files(struct palisade_verdict *d, struct dentry *dentry,
					  struct palisade_inode_key file, __u32 perms)
{
	/* An exec or a mapping for exec neither changes a file nor reads one: no lookup. */
	if (!(perms & PALISADE_PERM_CONTENT))
		return;
	__u32 protection = protection_of(file);
	if ((perms & (PALISADE_PERM_WRITE | PALISADE_PERM_APPEND)) &&
	    ((protection & PALISADE_PROTECT_CHANGE) || dentry->d_sb->s_magic == BPF_FS_MAGIC ||
	     (protection_of(parent_key(dentry)) & PALISADE_PROTECT_CHANGE)))
		*d = self_protection;
	else if ((perms & PALISADE_PERM_READ) && (protection & PALISADE_PROTECT_READ))
		*d = self_protection;
}

/* Reports (if the rule says so) and returns the error for a decision with nothing to add. */
static __always_inline int decide(const struct palisade_verdict *d, const struct subject *subject,
				  __u32 arg)
{
	struct palisade_event *e = record(d, subject);
	if (e) {
		e->arg = arg;
		submit_event(e, subject);
	}
	return verdict_error(d);
}

#endif
