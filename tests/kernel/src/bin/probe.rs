//! Performs one operation and reports the kernel's answer, for tests that run it inside a
//! target cgroup. Prints `ok` or `errno N`; exits 0 on success and 1 otherwise.
//!
//! probe read|write|append PATH
//! probe exec PATH [ARGS...]
//! probe exec-fd PATH [ARGS...]   (execveat on an O_PATH descriptor: no name at all)
//! probe map-exec PATH            (mmap with PROT_EXEC)
//! probe kill PID SIGNAL
//! probe read-until PATH STOP   (reads until the file STOP exists; prints `ok=N eperm=N other=N`)

use std::{
    ffi::CString,
    fs::OpenOptions,
    io::{self, Read, Write},
    os::unix::{fs::OpenOptionsExt, io::AsRawFd, process::CommandExt},
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
        ["kill", pid, signal] => report(kill(pid, signal)),
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
        _ => {
            eprintln!(
                "usage: probe read|write|append PATH | exec PATH [ARGS...] | read-until PATH STOP"
            );
            ExitCode::from(2)
        }
    }
}
