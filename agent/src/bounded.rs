//! Reading files that others write (policy files, rule modules): never more than a limit, and
//! never from a FIFO or a device, whose reads may block or never end.

use std::{
    fs::OpenOptions,
    io::{self, Read},
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

/// The bytes of the regular file `path` (symbolic links followed), or an error of kind
/// `FileTooLarge` when it holds more than `limit` bytes: refused by its size before reading.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    // Not blocking in open: a FIFO's open waits for a writer.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let too_large = || {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("larger than {limit} bytes, its limit"),
        )
    };
    if metadata.len() > limit {
        return Err(too_large());
    }
    // One byte more than allowed: the file may have grown since.
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}
