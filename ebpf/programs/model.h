/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * BehaviorModeling: what a modeled target does is counted and de-duplicated here, one
 * `model_records` entry per distinct thing done (never an event per operation); the agent takes
 * the entries out as it reads them, so the map only holds what was done since its last read.
 * What finds the map full is counted in the model's overflow record, which the agent creates
 * with the model and never takes out: a loss is never silent.
 */
#ifndef PALISADE_MODEL_H
#define PALISADE_MODEL_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized at load */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct palisade_model_key);
	__type(value, __u64);
} model_records SEC(".maps");

/* Whether the subject's policy records what its targets do, and the subject is not a runtime
 * setting a container up. */
static __always_inline int modeling(const struct subject *subject)
{
	return (subject->policy->flags & PALISADE_POLICY_MODELING) && !in_runtime_setup();
}

/* A zeroed key for a record of `kind` by the subject, in per-CPU memory (too large for the
 * stack next to the hooks' own); NULL never in practice. */
static __always_inline struct palisade_model_key *new_record(const struct subject *subject,
							     __u32 kind)
{
	struct scratch *s = scratch_memory();
	if (!s)
		return NULL;
	struct palisade_model_key *key = &s->model;
	__builtin_memset(key, 0, sizeof(*key));
	key->model_id = subject->policy->model_id;
	key->kind = kind;
	key->hook = subject->hook;
	return key;
}

/* Counts one more time the record `key` stands for (the model's overflow record when the map is
 * full; `key` is then overwritten). */
static __always_inline void count_record(struct palisade_model_key *key)
{
	__u64 *count = bpf_map_lookup_elem(&model_records, key);
	if (!count) {
		__u64 first = 0;
		/* Fails when another CPU added it meanwhile (found below) or the map is full. */
		bpf_map_update_elem(&model_records, key, &first, BPF_NOEXIST);
		count = bpf_map_lookup_elem(&model_records, key);
	}
	if (!count) {
		__u32 model_id = key->model_id;
		__builtin_memset(key, 0, sizeof(*key));
		key->model_id = model_id;
		key->kind = PALISADE_MODEL_OVERFLOW;
		count = bpf_map_lookup_elem(&model_records, key);
	}
	if (count)
		__sync_fetch_and_add(count, 1);
	else
		stat_inc(PALISADE_STAT_MODEL_DROPPED);
}

/* Records that the subject asked `perms` of the file whose path (`len` bytes with its NUL) is in
 * s->path; a file with no path (`len` an error) is recorded with an empty one. */
static __always_inline void record_file(const struct subject *subject, struct scratch *s,
					long len, __u32 perms)
{
	struct palisade_model_key *key = new_record(subject, PALISADE_MODEL_FILE);
	if (!key)
		return;
	key->arg = perms;
	if (len > 0 && len <= PATH_BUF_LEN) {
		key->cut = len > PALISADE_MODEL_DATA_LEN;
		bpf_probe_read_kernel_str(key->data, sizeof(key->data), s->path);
	}
	count_record(key);
}

/* Records an operation of `kind` with only an argument to tell it apart (capabilities, other
 * operations). */
static __always_inline void record_operation(const struct subject *subject, __u32 kind, __u32 arg)
{
	struct palisade_model_key *key = new_record(subject, kind);
	if (!key)
		return;
	key->arg = arg;
	count_record(key);
}

#endif
