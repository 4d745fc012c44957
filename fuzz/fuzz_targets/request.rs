//! Any request header against any session: decoding and validation never
//! panic, and what they let run is within the export and the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_nbd::consts::REQUEST_HEADER_BYTES;
use weir_nbd::{Command, RequestHeader, Session, Verdict};

fuzz_target!(|data: &[u8]| {
    if data.len() < REQUEST_HEADER_BYTES + 13 {
        return;
    }
    let (raw, rest) = data.split_at(REQUEST_HEADER_BYTES);
    let raw: &[u8; REQUEST_HEADER_BYTES] = raw.try_into().unwrap();
    let session = Session {
        size_bytes: u64::from_le_bytes(rest[..8].try_into().unwrap()),
        payload_bytes_max: u32::from_le_bytes(rest[8..12].try_into().unwrap()).max(1),
        read_only: rest[12] & 1 != 0,
        structured_replies: rest[12] & 2 != 0,
        base_allocation: rest[12] & 6 == 6,
    };
    let Ok(header) = RequestHeader::decode(raw) else { return };
    let in_export = |offset: u64, length: u32| {
        offset.checked_add(u64::from(length)).is_some_and(|end| end <= session.size_bytes)
    };
    match weir_nbd::request::validate(&header, &session) {
        Verdict::Run(command) => match command {
            Command::Read { offset, length } => {
                assert!(in_export(offset, length) && length <= session.payload_bytes_max)
            }
            Command::Write { offset, length, .. } => {
                assert!(!session.read_only);
                assert!(in_export(offset, length) && length <= session.payload_bytes_max)
            }
            Command::Trim { offset, length, .. } | Command::WriteZeroes { offset, length, .. } => {
                assert!(!session.read_only && in_export(offset, length))
            }
            Command::Cache { offset, length } => assert!(in_export(offset, length)),
            Command::BlockStatus { offset, length, .. } => {
                assert!(session.base_allocation && in_export(offset, length))
            }
            Command::Flush | Command::Disconnect => {}
        },
        Verdict::Reject { discard_bytes, .. } => {
            // Only a write's payload is discarded, and never more than a request may carry.
            assert!(discard_bytes == 0 || discard_bytes == header.length);
            assert!(discard_bytes <= session.payload_bytes_max);
        }
        Verdict::Disconnect { .. } => assert!(header.length > session.payload_bytes_max),
    }
});
