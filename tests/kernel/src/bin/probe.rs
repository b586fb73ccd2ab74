//! Performs one operation and reports the kernel's answer, for tests that run it inside a
//! target cgroup. Prints `ok` or `errno N`; exits 0 on success and 1 otherwise.
//!
//! probe read|write|append PATH
//! probe exec PATH [ARGS...]
//! probe exec-fd PATH [ARGS...]   (execveat on an O_PATH descriptor: no name at all)
//! probe map-exec PATH            (mmap with PROT_EXEC)
//! probe memfd                    (memfd_create, ftruncate, fchmod: a file with no path)
//! probe handle PATH               (prints PATH's file handle, in hex)
//! probe read-by-handle HANDLE MOUNT (open_by_handle_at on MOUNT's file system, then a read)
//! probe kill PID SIGNAL
//! probe read-until PATH STOP   (reads until the file STOP exists; prints `ok=N eperm=N other=N`)
//! probe read-until-denied PATH (reads until EPERM; prints the time of that read, in ns since
//!                               the Unix epoch)
//! probe truncate|unlink|mkdir|readlink|chroot|mknod-block PATH
//! probe setuid UID
//! probe rename|link|symlink FROM TO
//! probe chmod PATH OCTAL-MODE | chown PATH UID GID
//! probe mount FSTYPE SOURCE TARGET     (mount(2))
//! probe new-mount FSTYPE TARGET        (fsopen, fsconfig, fsmount, move_mount)
//! probe detached-mount FSTYPE          (fsopen, fsconfig, fsmount: never attached)
//! probe clone-tree SOURCE TARGET       (open_tree(OPEN_TREE_CLONE), move_mount)
//! probe umount TARGET
//! probe sethostname | init-module | unshare-user | unshare-user-then-uts | unshare-uts
//! probe bpf-prog-load | bpf-map-create | attach-filter | bind-port PORT | bpf-obj-get PATH
//! probe socket FAMILY TYPE PROTOCOL
//! probe connect IP PORT | sendto IP PORT   (TCP | UDP; the IP's form picks the socket family)
//! probe unix-connect PATH|@ABSTRACT

use std::{
    ffi::CString,
    fs::OpenOptions,
    io::{self, Read, Write},
    os::unix::{
        fs::OpenOptionsExt,
        io::{AsRawFd, FromRawFd},
        process::CommandExt,
    },
    process::{Command, ExitCode},
};

fn open(op: &str, path: &str) -> io::Result<()> {
    let mut options = OpenOptions::new();
    match op {
        "read" => options.read(true),
        "write" => options.write(true),
        "append" => options.append(true),
        _ => unreachable!(),
    };
    let mut file = options.open(path)?;
    if op == "read" {
        let mut buf = [0; 1];
        let _ = file.read(&mut buf)?;
    } else {
        file.write_all(b"x")?;
    }
    Ok(())
}

fn c_string(text: &str) -> CString {
    CString::new(text).expect("no NUL in arguments")
}

/// execveat(fd, "", AT_EMPTY_PATH): executes the file behind a descriptor. Returns on failure.
fn exec_fd(path: &str, args: &[&str]) -> io::Result<()> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)?;
    let argv: Vec<CString> = std::iter::once(path)
        .chain(args.iter().copied())
        .map(c_string)
        .collect();
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|arg| arg.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // SAFETY: valid descriptor, NUL-terminated strings and NULL-terminated arrays.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            file.as_raw_fd(),
            c"".as_ptr(),
            argv_ptrs.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    Err(io::Error::last_os_error())
}

/// Maps the start of `path` executable.
fn map_exec(path: &str) -> io::Result<()> {
    let file = OpenOptions::new().read(true).open(path)?;
    let prot = libc::PROT_READ | libc::PROT_EXEC;
    // SAFETY: a fresh private mapping of an open file, unmapped at once.
    unsafe {
        let address = libc::mmap(
            std::ptr::null_mut(),
            4096,
            prot,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        );
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        libc::munmap(address, 4096);
    }
    Ok(())
}

/// struct file_handle: handle_bytes (u32), handle_type (i32), then up to MAX_HANDLE_SZ (128)
/// bytes of handle.
type FileHandle = [u8; 8 + 128];

/// The file handle of `path` (name_to_handle_at), in hex.
fn handle_of(path: &str) -> io::Result<String> {
    let mut handle: FileHandle = [0; 8 + 128];
    handle[..4].copy_from_slice(&128u32.to_ne_bytes());
    let mut mount_id: libc::c_int = 0;
    let c_path = c_string(path);
    // SAFETY: NUL-terminated path, a file_handle buffer as large as handle_bytes says.
    check(unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            handle.as_mut_ptr(),
            &raw mut mount_id,
            0,
        )
    })?;
    let used = 8 + u32::from_ne_bytes(handle[..4].try_into().expect("4 bytes")) as usize;
    Ok(handle[..used]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

/// Opens the file of the handle `hex` (from `handle_of`) with open_by_handle_at, on the file
/// system of `mount` (a file or directory opened first), and reads it: no name is looked up.
fn read_by_handle(hex: &str, mount: &str) -> io::Result<()> {
    let mut handle: FileHandle = [0; 8 + 128];
    for (byte, pair) in handle.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).expect("hex"), 16).expect("hex");
    }
    let mount = OpenOptions::new().read(true).open(mount)?;
    // SAFETY: a file_handle as name_to_handle_at filled it in.
    let fd = fd(unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd(),
            handle.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: a descriptor this function owns from here on.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut buf = [0; 1];
    file.read(&mut buf).map(drop)
}

/// Sizes and chmods a memfd: the path hooks see a file of a kernel-internal mount.
fn memfd() -> io::Result<()> {
    // SAFETY: a NUL-terminated name.
    let fd = fd(unsafe { libc::syscall(libc::SYS_memfd_create, c"palisade-probe".as_ptr(), 0) })?;
    // SAFETY: a descriptor this function owns from here on.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(4096)?;
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
}

fn kill(pid: &str, signal: &str) -> io::Result<()> {
    let (pid, signal) = (
        pid.parse().expect("a pid"),
        signal.parse().expect("a signal number"),
    );
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `Ok` when a libc call returned something other than -1.
fn check(result: libc::c_long) -> io::Result<libc::c_long> {
    if result == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn path_op(op: &str, path: &str) -> io::Result<()> {
    let c_path = c_string(path);
    // SAFETY: NUL-terminated path; the calls have no other memory preconditions.
    let result = unsafe {
        match op {
            "truncate" => libc::truncate(c_path.as_ptr(), 0) as libc::c_long,
            "unlink" => libc::unlink(c_path.as_ptr()) as libc::c_long,
            "mkdir" => libc::mkdir(c_path.as_ptr(), 0o755) as libc::c_long,
            "umount" => libc::umount(c_path.as_ptr()) as libc::c_long,
            "chroot" => libc::chroot(c_path.as_ptr()) as libc::c_long,
            // A block device node for /dev/ram0.
            "mknod-block" => {
                libc::mknod(c_path.as_ptr(), libc::S_IFBLK | 0o600, libc::makedev(1, 0))
                    as libc::c_long
            }
            "readlink" => {
                let mut buf = [0u8; 256];
                libc::readlink(c_path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) as libc::c_long
            }
            _ => unreachable!(),
        }
    };
    check(result).map(drop)
}

fn two_path_op(op: &str, from: &str, to: &str) -> io::Result<()> {
    let (from, to) = (c_string(from), c_string(to));
    // SAFETY: NUL-terminated paths.
    let result = unsafe {
        match op {
            "rename" => libc::rename(from.as_ptr(), to.as_ptr()),
            "link" => libc::link(from.as_ptr(), to.as_ptr()),
            "symlink" => libc::symlink(from.as_ptr(), to.as_ptr()),
            _ => unreachable!(),
        }
    };
    check(result.into()).map(drop)
}

fn fd(result: libc::c_long) -> io::Result<libc::c_int> {
    check(result).map(|fd| fd as libc::c_int)
}

/// fsopen + fsconfig(CMD_CREATE) + fsmount: a detached mount of a new `fs_type` superblock.
fn fs_mount(fs_type: &str) -> io::Result<libc::c_int> {
    let fs_type = c_string(fs_type);
    // SAFETY: NUL-terminated strings, null pointers where the calls allow them.
    unsafe {
        let context = fd(libc::syscall(libc::SYS_fsopen, fs_type.as_ptr(), 0))?;
        fd(libc::syscall(
            libc::SYS_fsconfig,
            context,
            6, // FSCONFIG_CMD_CREATE
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        ))?;
        fd(libc::syscall(libc::SYS_fsmount, context, 0, 0))
    }
}

/// move_mount of a detached mount onto `target`.
fn attach(mount: libc::c_int, target: &str) -> io::Result<()> {
    let target = c_string(target);
    // SAFETY: NUL-terminated strings.
    let result = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            0x4, // MOVE_MOUNT_F_EMPTY_PATH
        )
    };
    check(result).map(drop)
}

fn clone_tree(source: &str, target: &str) -> io::Result<()> {
    let source = c_string(source);
    // SAFETY: NUL-terminated string.
    let tree = fd(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source.as_ptr(),
            1 | libc::O_CLOEXEC, // OPEN_TREE_CLONE
        )
    })?;
    attach(tree, target)
}

fn mount(fs_type: &str, source: &str, target: &str) -> io::Result<()> {
    let (fs_type, source, target) = (c_string(fs_type), c_string(source), c_string(target));
    // SAFETY: NUL-terminated strings, no data.
    let result = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fs_type.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    check(result.into()).map(drop)
}

fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare has no memory preconditions.
    check(unsafe { libc::unshare(flags) }.into()).map(drop)
}

fn sethostname() -> io::Result<()> {
    let name = std::fs::read("/proc/sys/kernel/hostname")?;
    let name = name.trim_ascii_end();
    // SAFETY: a valid buffer and its length.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }.into()).map(drop)
}

/// A BPF program or map of the simplest kind, loaded and closed.
fn bpf(command: libc::c_long) -> io::Result<()> {
    // r0 = 0; exit
    let program: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = c"GPL";
    let mut attr = [0u8; 128];
    let words: Vec<u64> = if command == 5 {
        // BPF_PROG_LOAD: prog_type SOCKET_FILTER, insn_cnt, insns, license
        vec![
            1 | (2 << 32),
            program.as_ptr() as u64,
            license.as_ptr() as u64,
        ]
    } else {
        // BPF_MAP_CREATE: ARRAY, key 4, value 4, one entry
        vec![2 | (4 << 32), 4 | (1 << 32)]
    };
    for (index, word) in words.iter().enumerate() {
        attr[index * 8..index * 8 + 8].copy_from_slice(&word.to_ne_bytes());
    }
    // SAFETY: attr is a valid bpf_attr prefix for the command, with its size.
    let fd = fd(unsafe { libc::syscall(libc::SYS_bpf, command, attr.as_ptr(), attr.len()) })?;
    // SAFETY: closing the descriptor just created.
    unsafe { libc::close(fd) };
    Ok(())
}

/// BPF_OBJ_GET: a descriptor of the object pinned at `path`.
fn bpf_obj_get(path: &str) -> io::Result<()> {
    let path = c_string(path);
    let mut attr = [0u8; 16];
    attr[..8].copy_from_slice(&(path.as_ptr() as u64).to_ne_bytes());
    // SAFETY: attr holds a valid pathname pointer; the rest is zero.
    let fd = fd(unsafe { libc::syscall(libc::SYS_bpf, 7, attr.as_ptr(), attr.len()) })?;
    // SAFETY: closing the descriptor just obtained.
    unsafe { libc::close(fd) };
    Ok(())
}

fn socket(
    family: libc::c_int,
    kind: libc::c_int,
    protocol: libc::c_int,
) -> io::Result<libc::c_int> {
    // SAFETY: socket has no memory preconditions.
    fd(unsafe { libc::socket(family, kind, protocol) }.into())
}

fn attach_filter() -> io::Result<()> {
    let sock = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    // ret #0
    let code = [libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let program = libc::sock_fprog {
        len: 1,
        filter: code.as_ptr().cast_mut(),
    };
    // SAFETY: a valid classic BPF program and its size.
    check(
        unsafe {
            libc::setsockopt(
                sock,
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&raw const program).cast(),
                size_of::<libc::sock_fprog>() as u32,
            )
        }
        .into(),
    )
    .map(drop)
}

fn report(result: io::Result<()>) -> ExitCode {
    match result {
        Ok(()) => {
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(err) => {
            println!("errno {}", err.raw_os_error().unwrap_or(-1));
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        [op @ ("read" | "write" | "append"), path] => report(open(op, path)),
        ["exec", path, rest @ ..] => report(Err(Command::new(path).args(rest).exec())),
        ["exec-fd", path, rest @ ..] => report(exec_fd(path, rest)),
        ["map-exec", path] => report(map_exec(path)),
        ["handle", path] => match handle_of(path) {
            Ok(hex) => {
                println!("{hex}");
                ExitCode::SUCCESS
            }
            Err(err) => report(Err(err)),
        },
        ["read-by-handle", handle, mount] => report(read_by_handle(handle, mount)),
        ["memfd"] => report(memfd()),
        ["kill", pid, signal] => report(kill(pid, signal)),
        [
            op @ ("truncate" | "unlink" | "mkdir" | "readlink" | "umount" | "chroot"
            | "mknod-block"),
            path,
        ] => report(path_op(op, path)),
        ["setuid", uid] => {
            // SAFETY: setuid has no memory preconditions.
            report(check(unsafe { libc::setuid(uid.parse().expect("a uid")) }.into()).map(drop))
        }
        [op @ ("rename" | "link" | "symlink"), from, to] => report(two_path_op(op, from, to)),
        ["chmod", path, mode] => report(std::fs::set_permissions(
            path,
            std::os::unix::fs::PermissionsExt::from_mode(
                u32::from_str_radix(mode, 8).expect("an octal mode"),
            ),
        )),
        ["chown", path, uid, gid] => report(std::os::unix::fs::chown(
            path,
            Some(uid.parse().expect("a uid")),
            Some(gid.parse().expect("a gid")),
        )),
        ["mount", fs_type, source, target] => report(mount(fs_type, source, target)),
        ["new-mount", fs_type, target] => report(fs_mount(fs_type).and_then(|m| attach(m, target))),
        ["detached-mount", fs_type] => report(fs_mount(fs_type).map(drop)),
        ["clone-tree", source, target] => report(clone_tree(source, target)),
        ["sethostname"] => report(sethostname()),
        // SAFETY: an empty module image: the capability check comes first.
        ["init-module"] => report(
            check(unsafe {
                libc::syscall(
                    libc::SYS_init_module,
                    std::ptr::null::<u8>(),
                    0,
                    c"".as_ptr(),
                )
            })
            .map(drop),
        ),
        ["unshare-user"] => report(unshare(libc::CLONE_NEWUSER)),
        ["unshare-uts"] => report(unshare(libc::CLONE_NEWUTS)),
        ["unshare-user-then-uts"] => {
            report(unshare(libc::CLONE_NEWUSER).and_then(|()| unshare(libc::CLONE_NEWUTS)))
        }
        ["bpf-prog-load"] => report(bpf(5)),
        ["bpf-map-create"] => report(bpf(0)),
        ["attach-filter"] => report(attach_filter()),
        ["bpf-obj-get", path] => report(bpf_obj_get(path)),
        ["bind-port", port] => report(
            std::net::TcpListener::bind(("0.0.0.0", port.parse::<u16>().expect("a port")))
                .map(drop),
        ),
        ["socket", family, kind, protocol] => report(
            socket(
                family.parse().expect("a family"),
                kind.parse().expect("a type"),
                protocol.parse().expect("a protocol"),
            )
            .map(drop),
        ),
        ["connect", ip, port] => {
            let address = std::net::SocketAddr::new(
                ip.parse().expect("an IP"),
                port.parse().expect("a port"),
            );
            report(
                std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(5))
                    .map(drop),
            )
        }
        ["sendto", ip, port] => {
            let address = std::net::SocketAddr::new(
                ip.parse().expect("an IP"),
                port.parse().expect("a port"),
            );
            let local: std::net::SocketAddr = if address.is_ipv4() {
                "0.0.0.0:0".parse().unwrap()
            } else {
                "[::]:0".parse().unwrap()
            };
            report(
                std::net::UdpSocket::bind(local)
                    .and_then(|sock| sock.send_to(b"x", address))
                    .map(drop),
            )
        }
        ["unix-connect", name] => {
            use std::os::{linux::net::SocketAddrExt, unix::net};
            let address = match name.strip_prefix('@') {
                Some(abstract_name) => net::SocketAddr::from_abstract_name(abstract_name),
                None => net::SocketAddr::from_pathname(name),
            };
            report(
                address
                    .and_then(|address| net::UnixStream::connect_addr(&address))
                    .map(drop),
            )
        }
        ["read-until", path, stop] => {
            let (mut ok, mut eperm, mut other) = (0, 0, 0);
            while !std::path::Path::new(stop).exists() {
                match open("read", path) {
                    Ok(()) => ok += 1,
                    Err(err) if err.raw_os_error() == Some(libc::EPERM) => eperm += 1,
                    Err(_) => other += 1,
                }
            }
            println!("ok={ok} eperm={eperm} other={other}");
            ExitCode::SUCCESS
        }
        ["read-until-denied", path] => loop {
            if let Err(err) = open("read", path)
                && err.raw_os_error() == Some(libc::EPERM)
            {
                let since_epoch = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("a clock after 1970");
                println!("{}", since_epoch.as_nanos());
                return ExitCode::SUCCESS;
            }
        },
        _ => {
            eprintln!("usage: see the top of tests/kernel/src/bin/probe.rs");
            ExitCode::from(2)
        }
    }
}
