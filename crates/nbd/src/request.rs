//! Transmission-phase requests: decoding the 28-byte header and validating
//! it against what was negotiated. This is the edge: everything past
//! `validate` may assume a well-formed, in-range command.

use crate::consts::*;
use crate::errno::Errno;

/// A request header exactly as it came off the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// The header did not start with the request magic: the stream is out of
/// step and the only safe answer is a disconnect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadRequestMagic(pub u32);

impl std::fmt::Display for BadRequestMagic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad request magic {:#010x}", self.0)
    }
}

impl RequestHeader {
    pub fn decode(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<Self, BadRequestMagic> {
        let be32 = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let be64 = |at: usize| (u64::from(be32(at)) << 32) | u64::from(be32(at + 4));
        let magic = be32(0);
        if magic != REQUEST_MAGIC {
            return Err(BadRequestMagic(magic));
        }
        Ok(RequestHeader {
            flags: u16::from_be_bytes([bytes[4], bytes[5]]),
            kind: u16::from_be_bytes([bytes[6], bytes[7]]),
            handle: be64(8),
            offset: be64(16),
            length: be32(24),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut out = [0u8; REQUEST_HEADER_BYTES];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.handle.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_bytes(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.length
        } else {
            0
        }
    }
}

/// What the connection agreed to, as far as request validation cares.
#[derive(Clone, Copy, Debug)]
pub struct Session {
    pub size_bytes: u64,
    pub read_only: bool,
    /// Largest READ or WRITE payload accepted.
    pub payload_bytes_max: u32,
    pub structured_replies: bool,
    pub base_allocation: bool,
}

/// A validated command. Offsets and lengths are in range of the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        may_trim: bool,
        fast_only: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        one_extent: bool,
    },
    Disconnect,
}

/// What to do with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Run(Command),
    /// Answer with an error. The payload (if any) must be read and dropped
    /// first so the stream stays in step.
    Reject {
        errno: Errno,
        reason: &'static str,
        discard_bytes: u32,
    },
    /// Close the connection without reading the payload: a write larger
    /// than the maximum block size announces bytes no request may carry,
    /// and reading gigabytes to stay in step with such a client only
    /// holds its thread.
    Disconnect {
        reason: &'static str,
    },
}

/// Check one request against the session: flags known and allowed for the
/// command, range inside the export, payload within bounds, permissions.
pub fn validate(header: &RequestHeader, session: &Session) -> Verdict {
    if header.kind == CMD_WRITE && header.length > session.payload_bytes_max {
        return Verdict::Disconnect {
            reason: "write payload larger than the maximum block size",
        };
    }
    let discard_bytes = header.payload_bytes();
    let reject = |errno, reason| Verdict::Reject {
        errno,
        reason,
        discard_bytes,
    };
    let allowed = match header.kind {
        CMD_READ | CMD_FLUSH | CMD_CACHE | CMD_DISC => CMD_FLAG_FUA,
        CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        _ => return reject(Errno::Inval, "unknown command"),
    };
    if header.flags & !allowed != 0 {
        return reject(Errno::Inval, "unknown or disallowed command flags");
    }
    let fua = header.flags & CMD_FLAG_FUA != 0;
    let (offset, length) = (header.offset, header.length);
    let is_write = matches!(header.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if is_write && session.read_only {
        return reject(Errno::Perm, "write to a read-only export");
    }
    if header.kind == CMD_READ && length > session.payload_bytes_max {
        let errno = if session.structured_replies {
            Errno::Overflow
        } else {
            Errno::Inval
        };
        return reject(errno, "request larger than the maximum block size");
    }
    if !matches!(header.kind, CMD_FLUSH | CMD_DISC) {
        if length == 0 {
            return reject(Errno::Inval, "zero-length request");
        }
        let in_range = offset
            .checked_add(u64::from(length))
            .is_some_and(|end| end <= session.size_bytes);
        if !in_range {
            let errno = if is_write { Errno::NoSpc } else { Errno::Inval };
            return reject(errno, "request beyond the end of the export");
        }
    }
    let command = match header.kind {
        CMD_READ => Command::Read { offset, length },
        CMD_WRITE => Command::Write {
            offset,
            length,
            fua,
        },
        CMD_FLUSH => Command::Flush,
        CMD_TRIM => Command::Trim {
            offset,
            length,
            fua,
        },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            offset,
            length,
            fua,
            may_trim: header.flags & CMD_FLAG_NO_HOLE == 0,
            fast_only: header.flags & CMD_FLAG_FAST_ZERO != 0,
        },
        CMD_CACHE => Command::Cache { offset, length },
        CMD_BLOCK_STATUS => {
            if !session.base_allocation {
                return reject(
                    Errno::Inval,
                    "block status without a negotiated metadata context",
                );
            }
            Command::BlockStatus {
                offset,
                length,
                one_extent: header.flags & CMD_FLAG_REQ_ONE != 0,
            }
        }
        CMD_DISC => Command::Disconnect,
        _ => unreachable!("command kinds were filtered above"),
    };
    Verdict::Run(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u32 = 1 << 20;

    fn session() -> Session {
        Session {
            size_bytes: 1 << 30,
            read_only: false,
            payload_bytes_max: 32 * MIB,
            structured_replies: true,
            base_allocation: true,
        }
    }

    fn header(kind: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            kind,
            handle: 7,
            offset,
            length,
        }
    }

    fn errno_of(verdict: Verdict) -> Errno {
        match verdict {
            Verdict::Reject { errno, .. } => errno,
            Verdict::Run(command) => panic!("expected a rejection, got {command:?}"),
            Verdict::Disconnect { reason } => panic!("expected an error reply, got {reason}"),
        }
    }

    #[test]
    fn header_round_trips() {
        let original = header(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
        assert_eq!(RequestHeader::decode(&original.encode()), Ok(original));
    }

    #[test]
    fn bad_magic_is_fatal() {
        let mut bytes = header(CMD_READ, 0, 0, 512).encode();
        bytes[0] ^= 0xff;
        assert!(RequestHeader::decode(&bytes).is_err());
    }

    #[test]
    fn read_in_range_runs() {
        let verdict = validate(&header(CMD_READ, 0, 4096, 4096), &session());
        assert_eq!(
            verdict,
            Verdict::Run(Command::Read {
                offset: 4096,
                length: 4096
            })
        );
    }

    #[test]
    fn read_past_end_is_einval() {
        let verdict = validate(&header(CMD_READ, 0, (1 << 30) - 512, 1024), &session());
        assert_eq!(errno_of(verdict), Errno::Inval);
    }

    #[test]
    fn offset_overflow_is_rejected_not_wrapped() {
        let verdict = validate(&header(CMD_READ, 0, u64::MAX - 10, 4096), &session());
        assert_eq!(errno_of(verdict), Errno::Inval);
    }

    #[test]
    fn write_past_end_is_enospc_and_discards_payload() {
        let verdict = validate(&header(CMD_WRITE, 0, 1 << 30, 4096), &session());
        assert_eq!(
            verdict,
            Verdict::Reject {
                errno: Errno::NoSpc,
                reason: "request beyond the end of the export",
                discard_bytes: 4096
            }
        );
    }

    #[test]
    fn oversize_read_is_eoverflow_with_structured_replies() {
        let verdict = validate(&header(CMD_READ, 0, 0, 33 * MIB), &session());
        assert_eq!(errno_of(verdict), Errno::Overflow);
        let simple = Session {
            structured_replies: false,
            ..session()
        };
        assert_eq!(
            errno_of(validate(&header(CMD_READ, 0, 0, 33 * MIB), &simple)),
            Errno::Inval
        );
    }

    #[test]
    fn oversize_write_disconnects_without_reading_its_payload() {
        for length in [33 * MIB, u32::MAX] {
            assert!(
                matches!(
                    validate(&header(CMD_WRITE, 0, 0, length), &session()),
                    Verdict::Disconnect { .. }
                ),
                "{length}"
            );
        }
        // At the maximum it is an ordinary write.
        assert!(matches!(
            validate(&header(CMD_WRITE, 0, 0, 32 * MIB), &session()),
            Verdict::Run(Command::Write { .. })
        ));
    }

    #[test]
    fn large_trim_is_allowed() {
        let verdict = validate(&header(CMD_TRIM, 0, 0, 64 * MIB), &session());
        assert_eq!(
            verdict,
            Verdict::Run(Command::Trim {
                offset: 0,
                length: 64 * MIB,
                fua: false
            })
        );
    }

    #[test]
    fn unknown_command_is_einval() {
        assert_eq!(
            errno_of(validate(&header(42, 0, 0, 512), &session())),
            Errno::Inval
        );
    }

    #[test]
    fn unknown_flags_are_einval() {
        assert_eq!(
            errno_of(validate(&header(CMD_READ, 1 << 9, 0, 512), &session())),
            Errno::Inval
        );
        // NO_HOLE belongs to WRITE_ZEROES only.
        assert_eq!(
            errno_of(validate(
                &header(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 512),
                &session()
            )),
            Errno::Inval
        );
        // DF is not advertised.
        assert_eq!(
            errno_of(validate(&header(CMD_READ, CMD_FLAG_DF, 0, 512), &session())),
            Errno::Inval
        );
    }

    #[test]
    fn writes_to_read_only_export_are_eperm() {
        let ro = Session {
            read_only: true,
            ..session()
        };
        for kind in [CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES] {
            assert_eq!(
                errno_of(validate(&header(kind, 0, 0, 512), &ro)),
                Errno::Perm
            );
        }
        assert!(matches!(
            validate(&header(CMD_READ, 0, 0, 512), &ro),
            Verdict::Run(_)
        ));
    }

    #[test]
    fn write_zeroes_flags_are_decoded() {
        let flags = CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA;
        let verdict = validate(&header(CMD_WRITE_ZEROES, flags, 0, 512), &session());
        assert_eq!(
            verdict,
            Verdict::Run(Command::WriteZeroes {
                offset: 0,
                length: 512,
                fua: true,
                may_trim: false,
                fast_only: true
            })
        );
    }

    #[test]
    fn block_status_needs_a_context() {
        let none = Session {
            base_allocation: false,
            ..session()
        };
        assert_eq!(
            errno_of(validate(&header(CMD_BLOCK_STATUS, 0, 0, 512), &none)),
            Errno::Inval
        );
        let verdict = validate(
            &header(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 512),
            &session(),
        );
        assert_eq!(
            verdict,
            Verdict::Run(Command::BlockStatus {
                offset: 0,
                length: 512,
                one_extent: true
            })
        );
    }

    #[test]
    fn zero_length_read_is_einval_but_flush_is_fine() {
        assert_eq!(
            errno_of(validate(&header(CMD_READ, 0, 0, 0), &session())),
            Errno::Inval
        );
        assert_eq!(
            validate(&header(CMD_FLUSH, 0, 0, 0), &session()),
            Verdict::Run(Command::Flush)
        );
        assert_eq!(
            validate(&header(CMD_DISC, 0, 0, 0), &session()),
            Verdict::Run(Command::Disconnect)
        );
    }

    /// Random headers against random sessions, weighted towards the edges
    /// (the export's end, the payload limit, every flag bit): whatever runs
    /// is inside the export and within limits, and whatever is refused
    /// says how much payload to skip.
    #[test]
    fn random_requests_run_only_inside_the_rules() {
        let mut state = 0x0dd_ba11_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut ran, mut refused) = (0u32, 0u32);
        for _ in 0..200_000 {
            let size_bytes = [0, 1, 4096, 1 << 30, u64::MAX][(next() % 5) as usize];
            let session = Session {
                size_bytes,
                read_only: next() % 2 == 0,
                payload_bytes_max: [512, 32 * MIB][(next() % 2) as usize],
                structured_replies: next() % 2 == 0,
                base_allocation: next() % 2 == 0,
            };
            let edge = |value: u64, random: u64| match random % 4 {
                0 => value,
                1 => value.wrapping_sub(random % 8),
                2 => value.wrapping_add(random % 8),
                _ => random,
            };
            let kind = (next() % 10) as u16;
            let flags = match next() % 3 {
                0 => 0,
                1 => CMD_FLAG_FUA,
                _ => 1u16.checked_shl((next() % 17) as u32).unwrap_or(0) | (next() % 4) as u16,
            };
            let length = edge(u64::from(session.payload_bytes_max), next()) as u32;
            let offset = edge(size_bytes.saturating_sub(u64::from(length)), next());
            let request = header(kind, flags, offset, length);
            match validate(&request, &session) {
                Verdict::Run(command) => {
                    ran += 1;
                    let range = match command {
                        Command::Read { offset, length } => {
                            assert!(length <= session.payload_bytes_max);
                            Some((offset, length))
                        }
                        Command::Write { offset, length, .. } => {
                            assert!(!session.read_only);
                            assert!(length <= session.payload_bytes_max);
                            Some((offset, length))
                        }
                        Command::Trim { offset, length, .. }
                        | Command::WriteZeroes { offset, length, .. } => {
                            assert!(!session.read_only);
                            Some((offset, length))
                        }
                        Command::Cache { offset, length } => Some((offset, length)),
                        Command::BlockStatus { offset, length, .. } => {
                            assert!(session.base_allocation);
                            Some((offset, length))
                        }
                        Command::Flush | Command::Disconnect => None,
                    };
                    if let Some((offset, length)) = range {
                        assert!(length > 0, "{request:?}");
                        let end = offset.checked_add(u64::from(length));
                        assert!(end.is_some_and(|end| end <= size_bytes), "{request:?}");
                    }
                    let allowed =
                        CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_REQ_ONE | CMD_FLAG_FAST_ZERO;
                    assert_eq!(flags & !allowed, 0, "{request:?}");
                }
                Verdict::Reject { discard_bytes, .. } => {
                    refused += 1;
                    let payload = if kind == CMD_WRITE { length } else { 0 };
                    assert_eq!(discard_bytes, payload, "{request:?}");
                    assert!(discard_bytes <= session.payload_bytes_max, "{request:?}");
                }
                Verdict::Disconnect { .. } => {
                    refused += 1;
                    assert_eq!(kind, CMD_WRITE, "{request:?}");
                    assert!(length > session.payload_bytes_max, "{request:?}");
                }
            }
        }
        assert!(
            ran > 10_000 && refused > 10_000,
            "ran {ran}, refused {refused}"
        );
    }
}
