//! Performs one operation and reports the kernel's answer, for tests that run it inside a
//! target cgroup. Prints `ok` or `errno N`; exits 0 on success and 1 otherwise.
//!
//! probe read|write|append|create PATH   (create: O_CREAT|O_EXCL)
//! probe exec PATH [ARGS...]
//! probe exec-fd PATH [ARGS...]   (execveat on an O_PATH descriptor: no name at all)
//! probe map-exec PATH            (mmap with PROT_EXEC)
//! probe pty-peer                (a new pseudo-terminal, then its peer by TIOCGPTPEER)
//! probe memfd                    (memfd_create, ftruncate, fchmod: a file with no path)
//! probe userfaultfd              (userfaultfd(2), user-mode faults only)
//! probe userfaultfd-dev DEVICE   (USERFAULTFD_IOC_NEW on DEVICE, the misc device
//!                                /dev/userfaultfd)
//! probe runtime PROCS COPY OP PATH ENTRYPOINT [ARGS...]
//!                                (a container runtime, as runc 1.1: joins the cgroup whose
//!                                cgroup.procs is PROCS, re-executes a copy of itself if COPY is
//!                                `memfd-copy` or `bind-copy`, sets the container up by opening PATH as
//!                                OP (read, write...), then executes the entrypoint; prints
//!                                `copy errno N` or `setup errno N` when a step fails)
//! probe read-reopen PATH         (an O_PATH descriptor, reopened through /proc/self/fd)
//! probe read-unlinked PATH       (an O_PATH descriptor, PATH unlinked, then reopened through
//!                                /proc/self/fd: d_path says "PATH (deleted)")
//! probe read-openat2 PATH        (openat2)
//! probe read-within DIR... FILE  (changes into each DIR in turn, then reads FILE: a file whose
//!                                path is longer than PATH_MAX)
//! probe read-in-mount-ns SOURCE TARGET PATH (in a private mount namespace of its own, with
//!                                SOURCE bind-mounted on TARGET, reads PATH; prints
//!                                `setup errno N` when the namespace or the mount fails)
//! probe read-in-mount-ns-when SOURCE TARGET READY GO PATH (the same, but creates the file READY
//!                                once SOURCE is mounted, and reads PATH once the file GO exists)
//! probe read-io-uring PATH       (IORING_OP_OPENAT, run by an io-wq worker thread)
//! probe dump-core                (raises its core size limit and aborts: the kernel writes a core)
//! probe acct PATH                (process accounting to PATH: the kernel opens it to append)
//! probe swapon PATH              (the kernel opens PATH read-write before checking it)
//! probe hold PATH                (opens and maps PATH, prints the descriptor and the mapping's
//!                                /proc/PID/map_files name, holds both until stdin closes)
//! probe read-pidfd-getfd PID FD  (pidfd_getfd: a copy of another process's descriptor)
//! probe send-fd SOCKET PATH      (listens on SOCKET, sends a descriptor of PATH with
//!                                SCM_RIGHTS to the first connection)
//! probe read-received SOCKET     (connects to SOCKET, reads the descriptor received; prints
//!                                `no-descriptor` when none came)
//! probe read-seccomp-added SOCKET (traps getppid to a seccomp listener sent to SOCKET, reads
//!                                the descriptor the supervisor adds as its answer)
//! probe seccomp-add-fd SOCKET PATH (listens on SOCKET for a seccomp listener, adds a descriptor
//!                                of PATH to the trapped process: SECCOMP_IOCTL_NOTIF_ADDFD)
//! probe uselib PATH              (uselib, a 32-bit system call: the kernel opens PATH and
//!                                reads its header)
//! probe fanotify-read PATH       (waits for an open of PATH; reads the descriptor fanotify
//!                                opens for the listener)
//! probe handle PATH               (prints PATH's file handle, in hex)
//! probe read-by-handle HANDLE MOUNT (open_by_handle_at on MOUNT's file system, then a read)
//! probe xfs-handle PATH           (prints PATH's XFS handle, in hex: XFS_IOC_PATH_TO_HANDLE)
//! probe read-by-xfs-handle HANDLE MOUNT (XFS_IOC_OPEN_BY_HANDLE on MOUNT, then a read)
//! probe kill PID SIGNAL
//! probe read-until PATH STOP   (reads until the file STOP exists; prints `ok=N eperm=N other=N`)
//! probe read-until-denied PATH (reads every millisecond until EPERM; prints the time of that
//!                               read, in ns since the Unix epoch)
//! probe read-until-allowed PATH DIR (reads until allowed, then at once makes the directory
//!                                   DIR: a cgroup, created the moment the target is released)
//! probe truncate|unlink|mkdir|readlink|chroot|mknod-block|open-ioctl PATH
//!                              (open-ioctl: access mode 3, neither read nor write: ioctls only)
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
    fs::{File, OpenOptions},
    io::{self, Read, Write},
    os::unix::{
        fs::OpenOptionsExt,
        io::{AsRawFd, FromRawFd},
        net::{UnixListener, UnixStream},
        process::CommandExt,
    },
    process::{Command, ExitCode},
};

fn open(op: &str, path: &str) -> io::Result<()> {
    let mut options = OpenOptions::new();
    match op {
        "read" => options.read(true),
        "write" => options.write(true),
        "create" => options.write(true).create_new(true),
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

/// Executes `path` through an O_PATH descriptor of it: no name at all. Returns on failure.
fn exec_fd(path: &str, args: &[&str]) -> io::Result<()> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)?;
    exec_descriptor(file.as_raw_fd(), path, args)
}

/// execveat(fd, "", AT_EMPTY_PATH): executes the file behind a descriptor, with `name` as
/// argv[0]. Returns on failure.
fn exec_descriptor(fd: i32, name: &str, args: &[&str]) -> io::Result<()> {
    let argv: Vec<CString> = std::iter::once(name)
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
            fd,
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
    Ok(to_hex(&handle[..used]))
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn from_hex(hex: &str) -> Vec<u8> {
    hex.as_bytes()
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).expect("hex"), 16).expect("hex"))
        .collect()
}

/// Opens the file of the handle `hex` (from `handle_of`) with open_by_handle_at, on the file
/// system of `mount` (a file or directory opened first), and reads it: no name is looked up.
fn read_by_handle(hex: &str, mount: &str) -> io::Result<()> {
    let mut handle: FileHandle = [0; 8 + 128];
    let bytes = from_hex(hex);
    handle[..bytes.len()].copy_from_slice(&bytes);
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
    read_one(unsafe { File::from_raw_fd(fd) })
}

/// struct xfs_fsop_handlereq (xfs_fs.h), which XFS's handle ioctls take.
#[repr(C)]
struct XfsHandleRequest {
    fd: u32,
    path: *const libc::c_char,
    oflags: u32,
    ihandle: *const u8,
    ihandlen: u32,
    ohandle: *mut u8,
    ohandlen: *mut u32,
}
const _: () = assert!(size_of::<XfsHandleRequest>() == 56);
/// _IOWR('X', 105 and 107, struct xfs_fsop_handlereq).
const XFS_IOC_PATH_TO_HANDLE: libc::c_ulong = 0xc038_5869;
const XFS_IOC_OPEN_BY_HANDLE: libc::c_ulong = 0xc038_586b;

/// An XFS handle request with nothing filled in.
fn xfs_request() -> XfsHandleRequest {
    XfsHandleRequest {
        fd: 0,
        path: std::ptr::null(),
        oflags: 0,
        ihandle: std::ptr::null(),
        ihandlen: 0,
        ohandle: std::ptr::null_mut(),
        ohandlen: std::ptr::null_mut(),
    }
}

/// The XFS handle of `path` (XFS_IOC_PATH_TO_HANDLE), in hex.
fn xfs_handle_of(path: &str) -> io::Result<String> {
    let file = File::open(path)?;
    let c_path = c_string(path);
    let (mut handle, mut len) = ([0u8; 64], 0u32);
    let request = XfsHandleRequest {
        path: c_path.as_ptr(),
        ohandle: handle.as_mut_ptr(),
        ohandlen: &raw mut len,
        ..xfs_request()
    };
    // SAFETY: a request whose buffers outlive the call; the handle fits 64 bytes.
    check(
        unsafe { libc::ioctl(file.as_raw_fd(), XFS_IOC_PATH_TO_HANDLE, &raw const request) }.into(),
    )?;
    Ok(to_hex(&handle[..len as usize]))
}

/// Opens the file of the XFS handle `hex` (XFS_IOC_OPEN_BY_HANDLE on `mount`, a file or directory
/// opened first, whose mount the new file gets) and reads it.
fn read_by_xfs_handle(hex: &str, mount: &str) -> io::Result<()> {
    let mount = File::open(mount)?;
    let handle = from_hex(hex);
    let request = XfsHandleRequest {
        oflags: libc::O_RDONLY as u32,
        ihandle: handle.as_ptr(),
        ihandlen: handle.len() as u32,
        ..xfs_request()
    };
    // SAFETY: a request whose handle outlives the call.
    let fd = fd(unsafe {
        libc::ioctl(
            mount.as_raw_fd(),
            XFS_IOC_OPEN_BY_HANDLE,
            &raw const request,
        )
    }
    .into())?;
    // SAFETY: a descriptor this function owns from here on.
    read_one(unsafe { File::from_raw_fd(fd) })
}

/// Opens a new pseudo-terminal (/dev/ptmx) and then its peer with TIOCGPTPEER: the kernel opens
/// the peer's /dev/pts file for this process (dentry_open), looking up no name.
fn pty_peer() -> io::Result<()> {
    let terminal = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open("/dev/ptmx")?;
    let unlock: libc::c_int = 0;
    // SAFETY: an int, as TIOCSPTLCK takes.
    check(
        unsafe { libc::ioctl(terminal.as_raw_fd(), libc::TIOCSPTLCK, &raw const unlock) }.into(),
    )?;
    // SAFETY: plain open flags.
    let peer = fd(unsafe {
        libc::ioctl(
            terminal.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY,
        )
    }
    .into())?;
    // SAFETY: a descriptor this function owns from here on.
    drop(unsafe { File::from_raw_fd(peer) });
    Ok(())
}

/// Sizes and chmods a memfd: the path hooks see a file of a kernel-internal mount.
fn memfd() -> io::Result<()> {
    // SAFETY: a NUL-terminated name.
    let fd = fd(unsafe { libc::syscall(libc::SYS_memfd_create, c"palisade-probe".as_ptr(), 0) })?;
    // SAFETY: a descriptor this function owns from here on.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(4096)?;
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
}

/// A userfaultfd, as an exploit makes one to pause the kernel at a page fault: by the system call,
/// or (`device`) by the misc device's ioctl.
fn userfaultfd(device: Option<&str>) -> io::Result<()> {
    // UFFD_USER_MODE_ONLY: what an unprivileged process may ask for.
    const UFFD_USER_MODE_ONLY: libc::c_long = 1;
    // _IO(0xAA, 0x00)
    const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xAA00;
    let fd = match device {
        // SAFETY: flags only.
        None => fd(unsafe {
            libc::syscall(
                libc::SYS_userfaultfd,
                libc::O_CLOEXEC as libc::c_long | UFFD_USER_MODE_ONLY,
            )
        })?,
        Some(device) => {
            let device = File::open(device)?;
            // SAFETY: the ioctl takes its flags by value.
            fd(
                unsafe { libc::ioctl(device.as_raw_fd(), USERFAULTFD_IOC_NEW, libc::O_CLOEXEC) }
                    .into(),
            )?
        }
    };
    // SAFETY: a descriptor this function owns from here on.
    drop(unsafe { File::from_raw_fd(fd) });
    Ok(())
}

/// `probe runtime`: what runc 1.1 does in a container's new cgroup, in short. A `procs` of `-`
/// and a `copy` of `itself`: the sealed copy, already in the cgroup, goes on.
fn runtime(procs: &str, copy: &str, op: &str, path: &str, entrypoint: &[&str]) -> io::Result<()> {
    if procs != "-" {
        std::fs::write(procs, std::process::id().to_string())?;
    }
    let sealed = match copy {
        "memfd-copy" => Some(memfd_copy_of_self()),
        "bind-copy" => Some(bind_copy_of_self()),
        _ => None,
    };
    if let Some(sealed) = sealed {
        let sealed = sealed.unwrap_or_else(|err| {
            println!("copy errno {}", err.raw_os_error().unwrap_or(-1));
            std::process::exit(1)
        });
        let args: Vec<&str> = ["runtime", "-", "itself", op, path]
            .into_iter()
            .chain(entrypoint.iter().copied())
            .collect();
        return exec_descriptor(sealed.as_raw_fd(), "probe", &args);
    }
    if let Err(err) = open(op, path) {
        println!("setup errno {}", err.raw_os_error().unwrap_or(-1));
        std::process::exit(1);
    }
    Err(Command::new(entrypoint[0]).args(&entrypoint[1..]).exec())
}

/// A copy of this program in a memfd: a file in no mount namespace.
fn memfd_copy_of_self() -> io::Result<File> {
    // SAFETY: a NUL-terminated name.
    let fd = fd(unsafe { libc::syscall(libc::SYS_memfd_create, c"runtime".as_ptr(), 0) })?;
    // SAFETY: a descriptor this function owns from here on.
    let mut copy = unsafe { File::from_raw_fd(fd) };
    io::copy(&mut File::open("/proc/self/exe")?, &mut copy)?;
    Ok(copy)
}

/// This program through a bind mount of it, opened, then detached (runc 1.1's bindfd): a file
/// whose mount is in no mount namespace.
fn bind_copy_of_self() -> io::Result<File> {
    let place = format!("/tmp/runtime-copy-{}", std::process::id());
    File::create(&place)?;
    let (source, target) = (c_string("/proc/self/exe"), c_string(&place));
    // SAFETY: NUL-terminated paths, no file system type or data for a bind mount.
    check(
        unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        }
        .into(),
    )?;
    let copy = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(&place)?;
    // SAFETY: a NUL-terminated path.
    check(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }.into())?;
    std::fs::remove_file(&place)?;
    Ok(copy)
}

/// Reads the first byte of an open file.
fn read_one(mut file: File) -> io::Result<()> {
    let mut buf = [0; 1];
    file.read(&mut buf).map(drop)
}

/// Opens `path` with O_PATH (no open for reading: no file_open), unlinks it if `unlink`, then
/// reopens it for reading through its /proc/self/fd link.
fn read_reopen(path: &str, unlink: bool) -> io::Result<()> {
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)?;
    if unlink {
        std::fs::remove_file(path)?;
    }
    read_one(File::open(format!("/proc/self/fd/{}", handle.as_raw_fd()))?)
}

fn read_openat2(path: &str) -> io::Result<()> {
    // struct open_how: flags, mode, resolve.
    let how: [u64; 3] = [(libc::O_RDONLY | libc::O_CLOEXEC) as u64, 0, 0];
    let c_path = c_string(path);
    // SAFETY: NUL-terminated path, an open_how of the size given.
    let fd = fd(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            how.as_ptr(),
            size_of_val(&how),
        )
    })?;
    // SAFETY: a descriptor this function owns from here on.
    read_one(unsafe { File::from_raw_fd(fd) })
}

/// Opens `path` with io_uring (IORING_OP_OPENAT, forced to the async worker threads with
/// IOSQE_ASYNC) and reads it. The rings are laid out as io_uring_setup(2) describes.
fn read_io_uring(path: &str) -> io::Result<()> {
    // struct io_uring_params as u32 words: sq_entries 0, cq_entries 1, features 5, sq_off from 10
    // (tail 11, array 16), cq_off from 20 (head 20, ring_mask 22, cqes 25).
    let mut params = [0u32; 30];
    // SAFETY: an io_uring_params the kernel fills in.
    let ring_fd = fd(unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) })?;
    // SAFETY: a descriptor this function owns from here on.
    let ring_file = unsafe { File::from_raw_fd(ring_fd) };
    const FEAT_SINGLE_MMAP: u32 = 1;
    assert!(
        params[5] & FEAT_SINGLE_MMAP != 0,
        "kernels since 5.4 map both rings at once"
    );
    let (sq_entries, cq_entries) = (params[0] as usize, params[1] as usize);
    let ring_len =
        (params[16] as usize + sq_entries * 4).max(params[25] as usize + cq_entries * 16);
    let map = |len: usize, offset: libc::off_t| -> io::Result<*mut u8> {
        // SAFETY: mapping the ring descriptor as io_uring_setup(2) says; never unmapped (the
        // probe exits).
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                ring_fd,
                offset,
            )
        };
        if address == libc::MAP_FAILED {
            Err(io::Error::last_os_error())
        } else {
            Ok(address.cast())
        }
    };
    let ring = map(ring_len, 0)?;
    let sqes = map(sq_entries * 64, 0x1000_0000)?;
    let c_path = c_string(path);
    // SAFETY: writes within the mapped rings at the offsets the kernel gave, one SQE of 64 bytes.
    unsafe {
        const OP_OPENAT: u8 = 18;
        const SQE_ASYNC: u8 = 1 << 4;
        std::ptr::write_bytes(sqes, 0, 64);
        *sqes = OP_OPENAT;
        *sqes.add(1) = SQE_ASYNC;
        sqes.add(4).cast::<i32>().write(libc::AT_FDCWD);
        sqes.add(16).cast::<u64>().write(c_path.as_ptr() as u64);
        sqes.add(28)
            .cast::<u32>()
            .write((libc::O_RDONLY | libc::O_CLOEXEC) as u32);
        ring.add(params[16] as usize).cast::<u32>().write(0);
        let tail = ring.add(params[11] as usize).cast::<u32>();
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        tail.write_volatile(tail.read_volatile() + 1);
    }
    const ENTER_GETEVENTS: u32 = 1;
    // SAFETY: one SQE submitted, waiting for its completion.
    check(unsafe {
        libc::syscall(
            libc::SYS_io_uring_enter,
            ring_fd,
            1,
            1,
            ENTER_GETEVENTS,
            0,
            0,
        )
    })?;
    // SAFETY: reads within the mapped CQ ring; struct io_uring_cqe is user_data, res, flags.
    let res = unsafe {
        let head = ring.add(params[20] as usize).cast::<u32>().read_volatile();
        let mask = ring.add(params[22] as usize).cast::<u32>().read_volatile();
        let cqe = ring.add(params[25] as usize + ((head & mask) as usize) * 16);
        cqe.add(8).cast::<i32>().read_volatile()
    };
    drop(ring_file);
    if res < 0 {
        return Err(io::Error::from_raw_os_error(-res));
    }
    // SAFETY: the descriptor the kernel opened for this request, owned from here on.
    read_one(unsafe { File::from_raw_fd(res) })
}

/// Turns process accounting on to `path` and off again.
fn acct(path: &str) -> io::Result<()> {
    let c_path = c_string(path);
    // SAFETY: NUL-terminated path; NULL turns accounting off.
    check(unsafe { libc::acct(c_path.as_ptr()) }.into())?;
    check(unsafe { libc::acct(std::ptr::null()) }.into()).map(drop)
}

fn swapon(path: &str) -> io::Result<()> {
    let c_path = c_string(path);
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::swapon(c_path.as_ptr(), 0) }.into()).map(drop)
}

/// Opens and maps `path`, prints the descriptor and the mapping's name in /proc/PID/map_files,
/// and holds both until stdin closes.
fn hold(path: &str) -> io::Result<()> {
    let file = OpenOptions::new().read(true).open(path)?;
    // SAFETY: a fresh shared read-only mapping of an open file, never touched.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if address == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let start = address as usize;
    println!("{} {start:x}-{:x}", file.as_raw_fd(), start + 4096);
    io::stdout().flush()?;
    io::stdin().read_to_end(&mut Vec::new()).map(drop)
}

/// Reads the file behind descriptor `fd` of process `pid`, copied with pidfd_getfd.
fn read_pidfd_getfd(pid: &str, fd_number: &str) -> io::Result<()> {
    let (pid, fd_number): (libc::pid_t, libc::c_int) = (
        pid.parse().expect("a pid"),
        fd_number.parse().expect("a descriptor"),
    );
    // SAFETY: plain integer arguments.
    let pidfd = fd(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: plain integer arguments.
    let copy = fd(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd_number, 0) });
    // SAFETY: the pidfd opened above.
    unsafe { libc::close(pidfd) };
    // SAFETY: a descriptor this function owns from here on.
    read_one(unsafe { File::from_raw_fd(copy?) })
}

/// The control message of one descriptor, as sendmsg and recvmsg use it.
#[repr(C)]
union FdControl {
    buf: [u8; 24], // CMSG_SPACE(sizeof(int)) on 64-bit
    _align: libc::cmsghdr,
}

/// Runs `f` on a one-byte message with room for one descriptor.
fn with_fd_message<T>(f: impl FnOnce(&mut libc::msghdr) -> io::Result<T>) -> io::Result<T> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = FdControl { buf: [0; 24] };
    // SAFETY: msghdr is plain data; all zeroes is an empty message.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &raw mut iov;
    message.msg_iovlen = 1;
    message.msg_control = (&raw mut control).cast();
    message.msg_controllen = size_of::<FdControl>();
    f(&mut message)
}

/// Sends descriptor `fd` over a connected UNIX socket (SCM_RIGHTS).
fn send_descriptor(stream: &UnixStream, fd: libc::c_int) -> io::Result<()> {
    with_fd_message(|message| {
        // SAFETY: a message over live buffers; the CMSG macros stay within its control buffer.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
            libc::CMSG_DATA(header)
                .cast::<libc::c_int>()
                .write_unaligned(fd);
            check(libc::sendmsg(stream.as_raw_fd(), message, 0) as libc::c_long).map(drop)
        }
    })
}

/// Receives a message from a connected UNIX socket and the descriptor it carries, if any.
fn receive_descriptor(stream: &UnixStream) -> io::Result<Option<File>> {
    with_fd_message(|message| {
        // SAFETY: a message over live buffers; the CMSG macros stay within its control buffer.
        unsafe {
            check(libc::recvmsg(stream.as_raw_fd(), message, 0) as libc::c_long)?;
            let header = libc::CMSG_FIRSTHDR(message);
            if header.is_null() || (*header).cmsg_type != libc::SCM_RIGHTS {
                return Ok(None);
            }
            let fd = libc::CMSG_DATA(header)
                .cast::<libc::c_int>()
                .read_unaligned();
            // The descriptor the kernel installed for this process, owned from here on.
            Ok(Some(File::from_raw_fd(fd)))
        }
    })
}

/// Listens on `socket` and accepts the first connection.
fn accept_first(socket: &str) -> io::Result<UnixStream> {
    let _ = std::fs::remove_file(socket);
    let (stream, _) = UnixListener::bind(socket)?.accept()?;
    Ok(stream)
}

/// Connects to `socket`, retrying while nothing listens on it yet.
fn connect_when_listening(socket: &str) -> io::Result<UnixStream> {
    loop {
        match UnixStream::connect(socket) {
            Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ECONNREFUSED)) => {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            connected => return connected,
        }
    }
}

/// Listens on `socket`, and sends a descriptor of `path` to the first process that connects.
fn send_fd(socket: &str, path: &str) -> io::Result<()> {
    let stream = accept_first(socket)?;
    send_descriptor(&stream, File::open(path)?.as_raw_fd())
}

/// Connects to `socket` and reads the descriptor it receives. Ok(false) when the message came
/// without one.
fn read_received(socket: &str) -> io::Result<bool> {
    match receive_descriptor(&connect_when_listening(socket)?)? {
        Some(file) => read_one(file).map(|()| true),
        None => Ok(false),
    }
}

/// Traps getppid to a seccomp listener, hands the listener to the supervisor on `socket`
/// (`seccomp-add-fd`), and reads the descriptor the supervisor adds to this process, whose
/// number getppid returns.
fn read_seccomp_added(socket: &str) -> io::Result<()> {
    let (load, jump_if, give) = (
        (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        (libc::BPF_RET | libc::BPF_K) as u16,
    );
    // SAFETY: the macros only build instructions.
    let filter = unsafe {
        [
            libc::BPF_STMT(load, 0), // seccomp_data.nr
            libc::BPF_JUMP(jump_if, libc::SYS_getppid as u32, 0, 1),
            libc::BPF_STMT(give, libc::SECCOMP_RET_USER_NOTIF),
            libc::BPF_STMT(give, libc::SECCOMP_RET_ALLOW),
        ]
    };
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: plain integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }.into())?;
    // SAFETY: a valid classic BPF program that outlives the call.
    let listener = fd(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &raw const program,
        )
    })?;
    // SAFETY: a descriptor this function owns from here on.
    let listener = unsafe { File::from_raw_fd(listener) };
    send_descriptor(&connect_when_listening(socket)?, listener.as_raw_fd())?;
    // SAFETY: no arguments; the supervisor answers it.
    let added = fd(unsafe { libc::syscall(libc::SYS_getppid) })?;
    // SAFETY: the descriptor the supervisor added to this process, owned from here on.
    read_one(unsafe { File::from_raw_fd(added) })
}

/// Supervises the seccomp listener received on `socket`: answers its first notification by
/// adding a descriptor of `path` to the trapped process (SECCOMP_IOCTL_NOTIF_ADDFD, which the
/// trapped process completes) and returning the new descriptor's number, or the add's error.
fn seccomp_add_fd(socket: &str, path: &str) -> io::Result<()> {
    let listener = receive_descriptor(&accept_first(socket)?)?
        .ok_or_else(|| io::Error::other("no seccomp listener came"))?;
    let listener = listener.as_raw_fd();
    // SAFETY: seccomp_notif is plain data, filled in by the kernel.
    let mut notification: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: a seccomp_notif as the ioctl expects.
    check(
        unsafe {
            libc::ioctl(
                listener,
                libc::SECCOMP_IOCTL_NOTIF_RECV,
                &raw mut notification,
            )
        }
        .into(),
    )?;
    let file = File::open(path)?;
    let add = libc::seccomp_notif_addfd {
        id: notification.id,
        flags: 0,
        srcfd: file.as_raw_fd() as u32,
        newfd: 0,
        newfd_flags: 0,
    };
    // SAFETY: a seccomp_notif_addfd as the ioctl expects.
    let added = check(
        unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &raw const add) }.into(),
    );
    let response = libc::seccomp_notif_resp {
        id: notification.id,
        val: *added.as_ref().unwrap_or(&0),
        error: added.map_or_else(|err| -err.raw_os_error().unwrap_or(libc::EIO), |_| 0),
        flags: 0,
    };
    // SAFETY: a seccomp_notif_resp as the ioctl expects.
    check(
        unsafe {
            libc::ioctl(
                listener,
                libc::SECCOMP_IOCTL_NOTIF_SEND,
                &raw const response,
            )
        }
        .into(),
    )
    .map(drop)
}

/// uselib(2): the kernel opens `path` to read its header and map it as a library. x86-64 has it
/// only as a 32-bit system call (int 0x80, number 86), whose path pointer has 32 bits.
fn uselib(path: &str) -> io::Result<()> {
    let c_path = c_string(path);
    let bytes = c_path.as_bytes_with_nul();
    // SAFETY: a fresh anonymous mapping below 4 GiB.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_32BIT,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    assert!(bytes.len() <= 4096, "a path that fits a page");
    let result: i32;
    // SAFETY: the path is copied into the page, which outlives the call; the 32-bit system call
    // takes its argument in ebx (which Rust reserves: swapped in and out) and clobbers r8-r11.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), page.cast::<u8>(), bytes.len());
        std::arch::asm!(
            "xchg {path}, rbx",
            "int 0x80",
            "xchg {path}, rbx",
            path = inout(reg) page as u64 => _,
            inlateout("eax") 86 => result,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
        );
        libc::munmap(page, 4096);
    }
    if result < 0 {
        return Err(io::Error::from_raw_os_error(-result));
    }
    Ok(())
}

/// Marks `path` for open events and reads one: the kernel opens a descriptor of the file for
/// this listener.
fn fanotify_read(path: &str) -> io::Result<()> {
    // SAFETY: plain flags.
    let group = fd(unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC,
            libc::O_RDONLY as u32,
        )
    }
    .into())?;
    // SAFETY: a descriptor this function owns from here on.
    let mut group = unsafe { File::from_raw_fd(group) };
    let c_path = c_string(path);
    // SAFETY: NUL-terminated path.
    check(
        unsafe {
            libc::fanotify_mark(
                group.as_raw_fd(),
                libc::FAN_MARK_ADD,
                libc::FAN_OPEN,
                libc::AT_FDCWD,
                c_path.as_ptr(),
            )
        }
        .into(),
    )?;
    let mut event = [0u8; 4096];
    let len = group.read(&mut event)?;
    assert!(
        len >= size_of::<libc::fanotify_event_metadata>(),
        "a whole event"
    );
    // SAFETY: the kernel wrote at least one fanotify_event_metadata.
    let metadata: libc::fanotify_event_metadata =
        unsafe { std::ptr::read_unaligned(event.as_ptr().cast()) };
    // SAFETY: the descriptor the kernel opened for this event, owned from here on.
    read_one(unsafe { File::from_raw_fd(metadata.fd) })
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
            "open-ioctl" => libc::open(c_path.as_ptr(), libc::O_ACCMODE) as libc::c_long,
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

/// A mount namespace of its own, private (the host never sees its mounts), in which `source` is
/// bind-mounted on `target`.
fn bind_in_own_namespace(source: &str, target: &str) -> io::Result<()> {
    unshare(libc::CLONE_NEWNS)?;
    let (root, source, target) = (c_string("/"), c_string(source), c_string(target));
    let none = std::ptr::null();
    // SAFETY: NUL-terminated strings or null where mount(2) allows it, no data.
    check(
        unsafe {
            libc::mount(
                none,
                root.as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                none.cast(),
            )
        }
        .into(),
    )?;
    // SAFETY: as above.
    check(
        unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                none,
                libc::MS_BIND,
                none.cast(),
            )
        }
        .into(),
    )
    .map(drop)
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

/// TCP Fast Open: sendto with MSG_FASTOPEN sends the SYN, data in it, to the address it is
/// given, without a connect.
fn sendto_fastopen(ip: std::net::Ipv4Addr, port: u16) -> io::Result<()> {
    let sock = socket(libc::AF_INET, libc::SOCK_STREAM, 0)?;
    let address = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid socket, buffer and address of the size given.
    let sent = check(unsafe {
        libc::sendto(
            sock,
            b"x".as_ptr().cast(),
            1,
            libc::MSG_FASTOPEN,
            (&raw const address).cast(),
            size_of::<libc::sockaddr_in>() as u32,
        )
    } as libc::c_long);
    // SAFETY: the socket is ours.
    unsafe { libc::close(sock) };
    sent.map(drop)
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
        [op @ ("read" | "write" | "append" | "create"), path] => report(open(op, path)),
        ["exec", path, rest @ ..] => report(Err(Command::new(path).args(rest).exec())),
        ["exec-fd", path, rest @ ..] => report(exec_fd(path, rest)),
        ["map-exec", path] => report(map_exec(path)),
        [op @ ("handle" | "xfs-handle"), path] => {
            let handle = if *op == "handle" {
                handle_of(path)
            } else {
                xfs_handle_of(path)
            };
            match handle {
                Ok(hex) => {
                    println!("{hex}");
                    ExitCode::SUCCESS
                }
                Err(err) => report(Err(err)),
            }
        }
        ["read-by-handle", handle, mount] => report(read_by_handle(handle, mount)),
        ["read-by-xfs-handle", handle, mount] => report(read_by_xfs_handle(handle, mount)),
        ["memfd"] => report(memfd()),
        ["userfaultfd"] => report(userfaultfd(None)),
        ["userfaultfd-dev", device] => report(userfaultfd(Some(device))),
        ["runtime", procs, copy, op, path, entrypoint @ ..] if !entrypoint.is_empty() => {
            report(runtime(procs, copy, op, path, entrypoint))
        }
        ["pty-peer"] => report(pty_peer()),
        ["read-reopen", path] => report(read_reopen(path, false)),
        ["read-unlinked", path] => report(read_reopen(path, true)),
        ["read-openat2", path] => report(read_openat2(path)),
        ["read-within", dirs @ .., file] if !dirs.is_empty() => report(
            dirs.iter()
                .try_for_each(std::env::set_current_dir)
                .and_then(|()| open("read", file)),
        ),
        ["read-in-mount-ns", source, target, path] => match bind_in_own_namespace(source, target) {
            Ok(()) => report(open("read", path)),
            Err(err) => {
                println!("setup errno {}", err.raw_os_error().unwrap_or(-1));
                ExitCode::FAILURE
            }
        },
        ["read-in-mount-ns-when", source, target, ready, go, path] => {
            match bind_in_own_namespace(source, target).and_then(|()| std::fs::write(ready, "")) {
                Ok(()) => {
                    while !std::path::Path::new(go).exists() {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    report(open("read", path))
                }
                Err(err) => {
                    println!("setup errno {}", err.raw_os_error().unwrap_or(-1));
                    ExitCode::FAILURE
                }
            }
        }
        ["read-times", count, path] => {
            report((0..count.parse::<u32>().expect("a count")).try_for_each(|_| open("read", path)))
        }
        // Reads `outside` twice (the open verdict cache remembers the second), then chroots to
        // `root` and reads `inside` (the same file, named from the new root).
        ["read-then-chrooted", outside, root, inside] => match open("read", outside)
            .and_then(|()| open("read", outside))
            .and_then(|()| std::os::unix::fs::chroot(root))
            .and_then(|()| std::env::set_current_dir("/"))
        {
            Ok(()) => report(open("read", inside)),
            Err(err) => {
                println!("setup errno {}", err.raw_os_error().unwrap_or(-1));
                ExitCode::FAILURE
            }
        },
        ["read-io-uring", path] => report(read_io_uring(path)),
        ["dump-core"] => {
            let unlimited = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            // SAFETY: a valid rlimit.
            if let Err(err) =
                check(unsafe { libc::setrlimit(libc::RLIMIT_CORE, &unlimited) }.into())
            {
                return report(Err(err));
            }
            std::process::abort()
        }
        ["acct", path] => report(acct(path)),
        ["swapon", path] => report(swapon(path)),
        ["fanotify-read", path] => report(fanotify_read(path)),
        ["hold", path] => match hold(path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => report(Err(err)),
        },
        ["read-pidfd-getfd", pid, fd] => report(read_pidfd_getfd(pid, fd)),
        ["send-fd", socket, path] => report(send_fd(socket, path)),
        ["read-seccomp-added", socket] => report(read_seccomp_added(socket)),
        ["seccomp-add-fd", socket, path] => report(seccomp_add_fd(socket, path)),
        ["uselib", path] => report(uselib(path)),
        ["read-received", socket] => match read_received(socket) {
            Ok(false) => {
                println!("no-descriptor");
                ExitCode::FAILURE
            }
            result => report(result.map(drop)),
        },
        ["kill", pid, signal] => report(kill(pid, signal)),
        [
            op @ ("truncate" | "unlink" | "mkdir" | "readlink" | "umount" | "chroot"
            | "mknod-block" | "open-ioctl"),
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
        ["sendto-fastopen", ip, port] => report(sendto_fastopen(
            ip.parse().expect("an IPv4 address"),
            port.parse().expect("a port"),
        )),
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
        // One read a millisecond: a tight loop would take half of the VM's one CPU from the
        // request and the relay that the caller times.
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
            std::thread::sleep(std::time::Duration::from_millis(1));
        },
        ["read-until-allowed", path, dir] => {
            while open("read", path).is_err() {}
            match std::fs::create_dir(dir) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("mkdir {dir}: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("usage: see the top of tests/kernel/src/bin/probe.rs");
            ExitCode::from(2)
        }
    }
}
