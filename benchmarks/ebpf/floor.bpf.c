// The physical floor of the allow path: an empty program on each LSM hook the agent attaches to,
// named like the agent's programs. A unit test of `kernel-bench` checks that the two sets match.

#define SEC(name) __attribute__((section(name), used))

#define EMPTY(hook)                                                                                \
	SEC("lsm/" #hook) int hook(void *ctx)                                                      \
	{                                                                                          \
		return 0;                                                                          \
	}

EMPTY(file_open)
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

char LICENSE[] SEC("license") = "GPL";
