//! Transmission-phase replies: simple replies and structured reply chunks.
//! Each function returns the bytes that precede (or make up) one message;
//! read data is sent after the header straight from its buffer.

use crate::consts::*;
use crate::wire::{put_u16, put_u32, put_u64};

pub const SIMPLE_REPLY_BYTES: usize = 16;
pub const CHUNK_HEADER_BYTES: usize = 20;
/// Chunk header plus the 64-bit offset of an OFFSET_DATA chunk.
pub const OFFSET_DATA_HEADER_BYTES: usize = CHUNK_HEADER_BYTES + 8;

/// A simple reply; read data (if any, and only without structured replies)
/// follows it.
pub fn simple(handle: u64, error: u32) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut out = [0u8; SIMPLE_REPLY_BYTES];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&handle.to_be_bytes());
    out
}

fn chunk_header(out: &mut Vec<u8>, done: bool, kind: u16, handle: u64, length: u32) {
    put_u32(out, STRUCTURED_REPLY_MAGIC);
    put_u16(out, if done { REPLY_FLAG_DONE } else { 0 });
    put_u16(out, kind);
    put_u64(out, handle);
    put_u32(out, length);
}

/// Header of an OFFSET_DATA chunk; `data_bytes` of data follow it.
pub fn offset_data_header(handle: u64, offset: u64, data_bytes: u32, done: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(OFFSET_DATA_HEADER_BYTES);
    chunk_header(
        &mut out,
        done,
        REPLY_TYPE_OFFSET_DATA,
        handle,
        data_bytes + 8,
    );
    put_u64(&mut out, offset);
    out
}

/// An OFFSET_HOLE chunk: the range reads as zeroes.
pub fn offset_hole(handle: u64, offset: u64, hole_bytes: u32, done: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHUNK_HEADER_BYTES + 12);
    chunk_header(&mut out, done, REPLY_TYPE_OFFSET_HOLE, handle, 12);
    put_u64(&mut out, offset);
    put_u32(&mut out, hole_bytes);
    out
}

/// A BLOCK_STATUS chunk for one context: `(length, flags)` extents.
pub fn block_status(handle: u64, context_id: u32, extents: &[(u32, u32)], done: bool) -> Vec<u8> {
    let payload = 4 + 8 * extents.len();
    let mut out = Vec::with_capacity(CHUNK_HEADER_BYTES + payload);
    chunk_header(
        &mut out,
        done,
        REPLY_TYPE_BLOCK_STATUS,
        handle,
        payload as u32,
    );
    put_u32(&mut out, context_id);
    for &(length, flags) in extents {
        put_u32(&mut out, length);
        put_u32(&mut out, flags);
    }
    out
}

/// A final ERROR chunk with a human-readable message.
pub fn error_chunk(handle: u64, error: u32, message: &str) -> Vec<u8> {
    let message = &message.as_bytes()[..message.len().min(4096)];
    let mut out = Vec::with_capacity(CHUNK_HEADER_BYTES + 6 + message.len());
    chunk_header(
        &mut out,
        true,
        REPLY_TYPE_ERROR,
        handle,
        6 + message.len() as u32,
    );
    put_u32(&mut out, error);
    put_u16(&mut out, message.len() as u16);
    out.extend_from_slice(message);
    out
}

/// A final empty chunk, closing a structured reply.
pub fn done_chunk(handle: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHUNK_HEADER_BYTES);
    chunk_header(&mut out, true, REPLY_TYPE_NONE, handle, 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_reply_layout() {
        let bytes = simple(0x0102_0304_0506_0708, 22);
        assert_eq!(&bytes[0..4], &[0x67, 0x44, 0x66, 0x98]);
        assert_eq!(&bytes[4..8], &[0, 0, 0, 22]);
        assert_eq!(&bytes[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn offset_data_header_counts_the_offset_in_its_length() {
        let bytes = offset_data_header(9, 4096, 512, true);
        assert_eq!(bytes.len(), OFFSET_DATA_HEADER_BYTES);
        assert_eq!(&bytes[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&bytes[6..8], &REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        assert_eq!(&bytes[16..20], &(520u32).to_be_bytes());
        assert_eq!(&bytes[20..28], &4096u64.to_be_bytes());
    }

    #[test]
    fn block_status_layout() {
        let bytes = block_status(1, BASE_ALLOCATION_ID, &[(4096, 0), (8192, 3)], true);
        assert_eq!(bytes.len(), CHUNK_HEADER_BYTES + 4 + 16);
        assert_eq!(&bytes[16..20], &(20u32).to_be_bytes());
        assert_eq!(&bytes[32..36], &8192u32.to_be_bytes());
        assert_eq!(&bytes[36..40], &3u32.to_be_bytes());
    }

    #[test]
    fn error_chunk_carries_message() {
        let bytes = error_chunk(1, 5, "boom");
        assert_eq!(&bytes[6..8], &REPLY_TYPE_ERROR.to_be_bytes());
        assert_eq!(&bytes[20..24], &5u32.to_be_bytes());
        assert_eq!(&bytes[24..26], &4u16.to_be_bytes());
        assert_eq!(&bytes[26..], b"boom");
    }
}
