//! NBD error values. The protocol carries Linux errno numbers; this is the
//! one place that maps an OS error onto the subset NBD allows.

/// An error a request can be answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Errno {
    Perm,
    Io,
    NoMem,
    Inval,
    NoSpc,
    Overflow,
    NotSup,
    Shutdown,
}

impl Errno {
    /// The number sent on the wire.
    pub fn wire(self) -> u32 {
        match self {
            Errno::Perm => 1,
            Errno::Io => 5,
            Errno::NoMem => 12,
            Errno::Inval => 22,
            Errno::NoSpc => 28,
            Errno::Overflow => 75,
            Errno::NotSup => 95,
            Errno::Shutdown => 108,
        }
    }

    /// Map an OS errno onto the nearest NBD error. Anything the protocol has
    /// no name for becomes EIO, which clients treat as a failed request.
    pub fn from_os(code: i32) -> Errno {
        match code {
            1 | 13 | 30 => Errno::Perm, // EPERM, EACCES, EROFS
            12 => Errno::NoMem,
            22 => Errno::Inval,
            27 | 28 | 122 => Errno::NoSpc, // EFBIG, ENOSPC, EDQUOT
            75 => Errno::Overflow,
            95 => Errno::NotSup,
            108 => Errno::Shutdown,
            _ => Errno::Io,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Errno::Perm => "EPERM",
            Errno::Io => "EIO",
            Errno::NoMem => "ENOMEM",
            Errno::Inval => "EINVAL",
            Errno::NoSpc => "ENOSPC",
            Errno::Overflow => "EOVERFLOW",
            Errno::NotSup => "ENOTSUP",
            Errno::Shutdown => "ESHUTDOWN",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_os_errors_become_eio() {
        assert_eq!(Errno::from_os(5), Errno::Io);
        assert_eq!(Errno::from_os(9999), Errno::Io);
        assert_eq!(Errno::from_os(30).wire(), 1);
        assert_eq!(Errno::from_os(28).wire(), 28);
    }
}
