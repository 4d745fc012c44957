//! One server owns a file or block device: every open by weir holds a
//! `flock` on it, exclusive for writing, shared for reading, so a second
//! server, `pool import` or `pool create` elsewhere is refused while the
//! first holds it, with the holder named. The kernel drops the lock when
//! its holder exits, however it exits, so a holder that is gone never
//! blocks anyone and needs no `--force`.
//!
//! Within one process the same device may be opened more than once (a
//! member rebuilt in place is opened again while its old handle is still
//! attached), and a second flock on another descriptor would refuse the
//! process itself. So the lock is held once per process, on its own
//! descriptor, for as long as any handle needs it.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use parking_lot::Mutex;

/// (device, inode) -> the locked descriptor, whether it is exclusive, and
/// how many handles hold it.
type Held = HashMap<(u64, u64), (File, bool, usize)>;

static HELD: Mutex<Option<Held>> = Mutex::new(None);

/// Ownership of one device for as long as it lives.
#[derive(Debug)]
pub struct Ownership {
    key: (u64, u64),
}

impl Ownership {
    /// Take `path` (already opened as `file`) for this process: exclusive
    /// when `write`, shared otherwise. Fails with `WouldBlock` and the
    /// holder's pid and name when another process holds it.
    pub fn take(path: &Path, file: &File, write: bool) -> io::Result<Ownership> {
        let meta = file.metadata()?;
        let key = (meta.dev(), meta.ino());
        let mut held = HELD.lock();
        let held = held.get_or_insert_with(HashMap::new);
        if let Some((lock_file, exclusive, count)) = held.get_mut(&key) {
            if write && !*exclusive {
                // Readers here hold it shared; make it exclusive.
                lock(lock_file, true).map_err(|err| in_use(path, &meta, err))?;
                *exclusive = true;
            }
            *count += 1;
            return Ok(Ownership { key });
        }
        let lock_file = File::open(path)?;
        lock(&lock_file, write).map_err(|err| in_use(path, &meta, err))?;
        held.insert(key, (lock_file, write, 1));
        Ok(Ownership { key })
    }
}

impl Drop for Ownership {
    fn drop(&mut self) {
        let mut held = HELD.lock();
        let Some(held) = held.as_mut() else { return };
        if let Some((_, _, count)) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                // Closing the descriptor releases the lock.
                held.remove(&self.key);
            }
        }
    }
}

fn lock(file: &File, exclusive: bool) -> io::Result<()> {
    let mode = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn in_use(path: &Path, meta: &std::fs::Metadata, err: io::Error) -> io::Error {
    if err.kind() != io::ErrorKind::WouldBlock {
        return err;
    }
    let who = holder(meta)
        .map(|(pid, name)| format!("process {pid} ({name})"))
        .unwrap_or_else(|| "another process".to_string());
    io::Error::new(
        io::ErrorKind::WouldBlock,
        format!("{} is in use by {who}", path.display()),
    )
}

/// The pid and command of a process holding a flock on the file, from
/// /proc/locks (lines like `1: FLOCK ADVISORY WRITE 4242 fd:01:1234 0 EOF`).
fn holder(meta: &std::fs::Metadata) -> Option<(u32, String)> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let wanted = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    locks.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        // A blocked waiter's line starts with "->"; skip it.
        if words.get(1) != Some(&"FLOCK") || words.get(5) != Some(&wanted.as_str()) {
            return None;
        }
        let pid: u32 = words.get(4)?.parse().ok()?;
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Some((pid, name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_may_open_a_device_twice_and_holds_it_until_the_last_handle() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("member.img");
        let file = File::create(&path).unwrap();
        let first = Ownership::take(&path, &file, true).unwrap();
        let second = Ownership::take(&path, &file, true).unwrap();
        // Another open file description (as another process would have)
        // cannot take it.
        let outsider = File::open(&path).unwrap();
        assert!(lock(&outsider, false).is_err());
        drop(first);
        assert!(lock(&outsider, false).is_err(), "still held by the second");
        drop(second);
        lock(&outsider, true).expect("released with the last handle");
    }

    #[test]
    fn a_device_held_elsewhere_is_refused_with_its_holder_named() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("member.img");
        let file = File::create(&path).unwrap();
        // Stand in for another server: a separate description with the lock.
        let other = File::open(&path).unwrap();
        lock(&other, true).unwrap();
        let err = Ownership::take(&path, &file, false).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        let text = err.to_string();
        assert!(text.contains("is in use by process"), "{text}");
        assert!(text.contains(&std::process::id().to_string()), "{text}");
    }
}
