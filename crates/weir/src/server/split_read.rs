//! A large client read sent to the volume in pieces, each piece answered
//! as a structured-reply chunk as soon as it lands.
//!
//! ```text
//!  READ ──> piece 1 ─> volume ─> chunk (OFFSET_DATA / OFFSET_HOLE) ─┐
//!       ──> piece 2 ─> volume ─> chunk ─────────────────────────────┼─> outbox
//!       ──> piece n ─> volume ─> last chunk (DONE), or one ERROR ───┘
//! ```
//!
//! Whole, a read's bytes go on the wire only once the device has read all
//! of them; in pieces, the first piece is on its way to the client while
//! the device reads the rest, and each piece's buffer is released as soon
//! as it is sent. The NBD spec lets chunks of one reply go in any order,
//! as long as the last one sent carries DONE and an error fails the whole
//! read: chunks are queued under one lock, so the piece that lands last
//! is also queued last.

use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use super::outbox::{Body, Reply};
use crate::volume::{ReadData, Volume};

/// Queues the chunks of one reply.
pub trait ChunkSink: Send + Sync {
    fn push(&self, reply: Reply);
}

struct Progress {
    bytes_left: u64,
    /// The first error, and the budget of the pieces that failed.
    failed: Option<(io::Error, u64)>,
}

struct SplitRead<S> {
    sink: S,
    handle: u64,
    progress: Mutex<Progress>,
}

/// Read `[offset, offset + length)` in pieces of at most `piece_bytes`
/// (fewer where the volume holds the range already); the request's budget
/// (`length` bytes) is released chunk by chunk.
pub fn read<S: ChunkSink + 'static>(
    volume: &Volume,
    sink: S,
    handle: u64,
    offset: u64,
    length: u32,
    piece_bytes: u32,
) {
    let split = Arc::new(SplitRead {
        sink,
        handle,
        progress: Mutex::new(Progress {
            bytes_left: u64::from(length),
            failed: None,
        }),
    });
    volume.read_in_pieces(
        offset,
        length,
        piece_bytes,
        Arc::new(move |at, bytes, result| split.landed(at, bytes, result)),
    );
}

impl<S: ChunkSink> SplitRead<S> {
    /// `bytes` of the read from `offset` on landed.
    fn landed(&self, offset: u64, bytes: u64, result: io::Result<ReadData>) {
        let mut progress = self.progress.lock();
        progress.bytes_left -= bytes;
        let last = progress.bytes_left == 0;
        match result {
            Ok(data) => {
                let data_is_last = last && progress.failed.is_none();
                self.sink.push(Reply {
                    handle: self.handle,
                    body: Body::Read {
                        offset,
                        data,
                        last: data_is_last,
                    },
                    budget_bytes: bytes,
                });
            }
            Err(err) => match &mut progress.failed {
                Some((_, failed_bytes)) => *failed_bytes += bytes,
                None => progress.failed = Some((err, bytes)),
            },
        }
        if last {
            if let Some((err, failed_bytes)) = progress.failed.take() {
                // One ERROR chunk, last: the client fails the whole read.
                self.sink.push(Reply {
                    handle: self.handle,
                    body: Body::failed(&err, "read"),
                    budget_bytes: failed_bytes,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::AlignedBuf;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<Reply>>>);

    impl ChunkSink for Sink {
        fn push(&self, reply: Reply) {
            self.0.lock().push(reply)
        }
    }

    fn split(pieces: u64, sink: &Sink) -> SplitRead<Sink> {
        SplitRead {
            sink: sink.clone(),
            handle: 7,
            progress: Mutex::new(Progress {
                bytes_left: pieces * 4096,
                failed: None,
            }),
        }
    }

    fn data(len: usize) -> io::Result<ReadData> {
        Ok(ReadData {
            buf: AlignedBuf::new(len),
            start: 0,
            len,
            hole: false,
        })
    }

    /// (offset or None for an error, last?, budget) of each reply, in order.
    fn replies(sink: &Sink) -> Vec<(Option<u64>, bool, u64)> {
        sink.0
            .lock()
            .iter()
            .map(|r| match &r.body {
                Body::Read { offset, last, .. } => (Some(*offset), *last, r.budget_bytes),
                Body::Error { .. } => (None, true, r.budget_bytes),
                _ => panic!("only read chunks and errors"),
            })
            .collect()
    }

    #[test]
    fn pieces_landing_in_any_order_end_with_the_last_one_queued() {
        let sink = Sink::default();
        let read = split(3, &sink);
        read.landed(4096, 4096, data(4096));
        read.landed(0, 4096, data(4096));
        read.landed(8192, 4096, data(4096));
        assert_eq!(
            replies(&sink),
            vec![
                (Some(4096), false, 4096),
                (Some(0), false, 4096),
                (Some(8192), true, 4096)
            ]
        );
    }

    #[test]
    fn a_failed_piece_ends_the_reply_with_one_error_carrying_its_budget() {
        let sink = Sink::default();
        let read = split(4, &sink);
        read.landed(0, 4096, data(4096));
        read.landed(4096, 4096, Err(io::Error::from_raw_os_error(libc::EIO)));
        read.landed(8192, 4096, Err(io::Error::from_raw_os_error(libc::EIO)));
        read.landed(12288, 4096, data(4096));
        assert_eq!(
            replies(&sink),
            vec![
                (Some(0), false, 4096),
                (Some(12288), false, 4096),
                (None, true, 8192)
            ]
        );
    }

    #[test]
    fn a_failed_last_piece_is_the_error() {
        let sink = Sink::default();
        let read = split(2, &sink);
        read.landed(0, 4096, data(4096));
        read.landed(4096, 4096, Err(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(
            replies(&sink),
            vec![(Some(0), false, 4096), (None, true, 4096)]
        );
    }
}
