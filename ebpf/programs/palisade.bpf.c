/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The one BPF object aya loads. Hook families live in their own files and are compiled here as a
 * single translation unit so that they share one set of maps.
 */
#include <linux/bpf.h>
#define __PALISADE_KERNEL__
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "kernel_types.h"

#include "file.bpf.c"
#include "exec.bpf.c"
#include "process.bpf.c"
#include "mount.bpf.c"
#include "system.bpf.c"
#include "network.bpf.c"
#include "cgroup.bpf.c"

char LICENSE[] SEC("license") = "GPL";
