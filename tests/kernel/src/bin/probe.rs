//! Performs one operation and reports the kernel's answer, for tests that run it inside a
//! target cgroup. Prints `ok` or `errno N`; exits 0 on success and 1 otherwise.
//!
//! probe read|write|append PATH
//! probe exec PATH [ARGS...]
//! probe read-until PATH STOP   (reads until the file STOP exists; prints `ok=N eperm=N other=N`)

use std::{
    fs::OpenOptions,
    io::{self, Read, Write},
    os::unix::process::CommandExt,
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
