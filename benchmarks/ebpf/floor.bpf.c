// The physical floor of the allow path: an empty program on each LSM hook the agent attaches to,
// named like the agent's programs. A unit test of `kernel-bench` checks that the two sets match.
// One more program, `file_open_path`, stands in for the empty `file_open` in the "d_path" state.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "kernel_types.h"

#define EMPTY(hook)                                                                                \
	SEC("lsm/" #hook) int hook(void *ctx)                                                      \
	{                                                                                          \
		return 0;                                                                          \
	}

EMPTY(file_open)
EMPTY(d_instantiate)
EMPTY(file_receive)
EMPTY(bprm_check_security)
EMPTY(mmap_file)
EMPTY(task_kill)
EMPTY(ptrace_access_check)
EMPTY(path_truncate)
EMPTY(path_unlink)
EMPTY(path_rmdir)
EMPTY(path_mknod)
EMPTY(path_mkdir)
EMPTY(path_symlink)
EMPTY(path_link)
EMPTY(path_rename)
EMPTY(path_chmod)
EMPTY(sb_mount)
EMPTY(sb_kern_mount)
EMPTY(move_mount)
EMPTY(fs_context_parse_param)
EMPTY(sb_umount)
EMPTY(capable)
EMPTY(userns_create)
EMPTY(bpf)
EMPTY(socket_create)
EMPTY(socket_connect)
EMPTY(socket_sendmsg)
EMPTY(socket_setsockopt)
EMPTY(unix_stream_connect)
EMPTY(kernfs_init_security)
EMPTY(inode_init_security_anon)

// The floor, but resolving the opened file's path as the agent's file_open does (bpf_d_path into
// a per-CPU buffer of PATH_MAX bytes): the least any decision by path costs.
struct path_buffer {
	char bytes[4096];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct path_buffer);
} path_buffer SEC(".maps");

SEC("lsm/file_open")
int BPF_PROG(file_open_path, struct file *file)
{
	__u32 zero = 0;
	struct path_buffer *buffer = bpf_map_lookup_elem(&path_buffer, &zero);

	if (buffer)
		bpf_d_path(&file->f_path, buffer->bytes, sizeof(buffer->bytes));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
