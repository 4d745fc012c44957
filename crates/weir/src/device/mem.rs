//! A sparse device in RAM. Pages are allocated on first write and freed by
//! discard, so `mem:2G` costs only what is written, and unwritten ranges
//! report as holes.
//!
//! Most ops run on the caller's thread. Large writes run on two copier
//! threads, as a disk's DMA would: copying 1 MiB into cold memory takes
//! longer than receiving it from the socket, and on the caller's thread
//! that copy holds up the next request on the connection (measured: 1 MiB
//! writes at depth 8 went from about 1.8k to 2.1k IOPS). Large reads stay
//! inline: their completion then stays on the connection's thread, which
//! sends the reply without waking another (measured: moving them lost up
//! to half their rate).

use std::io;
use std::sync::Arc;

use parking_lot::RwLock;

use super::workers::Workers;
use super::{push_extent, AlignedBuf, Completion, Device, DeviceInfo, DeviceOp, Extent, Outcome};

const PAGE_BYTES: u64 = 64 * 1024;
/// Writes at least this large go to the copier threads.
const COPIER_WRITE_BYTES_MIN: usize = 256 * 1024;
const COPIER_THREADS: usize = 2;

type Page = RwLock<Option<Box<[u8]>>>;

pub struct MemDevice {
    pages: Arc<Pages>,
    info: DeviceInfo,
    /// None if the threads could not be started: everything runs inline.
    copiers: Option<Workers>,
}

struct Pages(Box<[Page]>);

impl MemDevice {
    pub fn new(size_bytes: u64) -> MemDevice {
        Self::with_block_bytes(size_bytes, 1)
    }

    /// A memory device that insists on `block_bytes` alignment, like a disk.
    pub fn with_block_bytes(size_bytes: u64, block_bytes: u32) -> MemDevice {
        let count = size_bytes.div_ceil(PAGE_BYTES) as usize;
        let pages = Arc::new(Pages((0..count).map(|_| RwLock::new(None)).collect()));
        let info = DeviceInfo {
            size_bytes,
            logical_block_bytes: block_bytes,
            rotational: false,
            description: format!("memory, {size_bytes} bytes"),
        };
        let copiers = Workers::start("weir-mem", COPIER_THREADS)
            .inspect_err(|err| tracing::warn!(error = %err, "memory device copies run inline"))
            .ok();
        MemDevice {
            pages,
            info,
            copiers,
        }
    }
}

impl Pages {
    /// Call `visit(page, offset_in_page, range_in_request)` for each page
    /// piece of `[offset, offset + length)`.
    fn for_each_piece(
        &self,
        offset: u64,
        length: u64,
        mut visit: impl FnMut(&Page, usize, std::ops::Range<usize>),
    ) {
        let mut at = offset;
        let end = offset + length;
        while at < end {
            let in_page = (at % PAGE_BYTES) as usize;
            let piece = (PAGE_BYTES - in_page as u64).min(end - at) as usize;
            let start = (at - offset) as usize;
            visit(
                &self.0[(at / PAGE_BYTES) as usize],
                in_page,
                start..start + piece,
            );
            at += piece as u64;
        }
    }

    fn read(&self, offset: u64, buf: &mut AlignedBuf) -> bool {
        let mut all_hole = true;
        let out = buf.as_mut_slice();
        self.for_each_piece(offset, out.len() as u64, |page, in_page, range| match page
            .read()
            .as_deref()
        {
            Some(data) => {
                all_hole = false;
                out[range.clone()].copy_from_slice(&data[in_page..in_page + range.len()]);
            }
            None => out[range].fill(0),
        });
        all_hole
    }

    fn write(&self, offset: u64, data: &[u8]) {
        self.for_each_piece(offset, data.len() as u64, |page, in_page, range| {
            let mut page = page.write();
            let bytes =
                page.get_or_insert_with(|| vec![0u8; PAGE_BYTES as usize].into_boxed_slice());
            copy_streaming(&mut bytes[in_page..in_page + range.len()], &data[range]);
        });
    }

    fn zero(&self, offset: u64, length: u64) {
        self.for_each_piece(offset, length, |page, in_page, range| {
            let mut page = page.write();
            if range.len() as u64 == PAGE_BYTES {
                *page = None;
            } else if let Some(bytes) = page.as_mut() {
                bytes[in_page..in_page + range.len()].fill(0);
            }
        });
    }

    fn execute(&self, op: DeviceOp) -> Outcome {
        match op {
            DeviceOp::Read { offset, mut buf } => {
                let hole = self.read(offset, &mut buf);
                Outcome {
                    result: Ok(()),
                    buf: Some(buf),
                    hole,
                }
            }
            DeviceOp::Write { offset, buf, .. } => {
                self.write(offset, buf.as_slice());
                Outcome::done(Ok(()))
            }
            DeviceOp::Flush => Outcome::done(Ok(())),
            DeviceOp::Discard { offset, length } | DeviceOp::WriteZeroes { offset, length, .. } => {
                self.zero(offset, length);
                Outcome::done(Ok(()))
            }
        }
    }
}

impl Device for MemDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, op: DeviceOp, done: Completion) {
        op.assert_valid(&self.info);
        let large =
            matches!(&op, DeviceOp::Write { buf, .. } if buf.len() >= COPIER_WRITE_BYTES_MIN);
        match &self.copiers {
            Some(copiers) if large => {
                let pages = Arc::clone(&self.pages);
                copiers.run(Box::new(move || done(pages.execute(op))));
            }
            _ => done(self.pages.execute(op)),
        }
    }

    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>> {
        let mut extents = Vec::new();
        self.pages.for_each_piece(offset, length, |page, _, range| {
            if extents.len() <= extents_max {
                push_extent(&mut extents, range.len() as u64, page.read().is_none());
            }
        });
        extents.truncate(extents_max);
        Ok(extents)
    }
}

/// Copy `src` into `dst` (equal lengths). Where both are 16-byte aligned
/// this uses non-temporal stores: the destination is cold memory nobody
/// reads soon, and ordinary stores would first fetch every cache line they
/// overwrite. Measured on a 2-CPU VM: 4 KiB random writes to a 2 GiB memory
/// device spent a fifth of the reader thread in this copy.
fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        const LANE: usize = 16;
        let aligned =
            (dst.as_ptr() as usize).is_multiple_of(LANE) && dst.len().is_multiple_of(LANE);
        if dst.len() >= 1024 && aligned {
            let lanes = dst.len() / LANE;
            let d = dst.as_mut_ptr().cast::<__m128i>();
            let s = src.as_ptr().cast::<__m128i>();
            // SAFETY: SSE2 is part of x86_64. `d` is 16-byte aligned and both
            // slices hold `lanes * 16` bytes; loads are unaligned-safe. The
            // fence orders the streaming stores before any later access.
            unsafe {
                for lane in 0..lanes {
                    _mm_stream_si128(d.add(lane), _mm_loadu_si128(s.add(lane)));
                }
                _mm_sfence();
            }
            return;
        }
    }
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn run(device: &MemDevice, op: DeviceOp) -> Outcome {
        let (tx, rx) = mpsc::channel();
        device.submit(op, Box::new(move |outcome| tx.send(outcome).unwrap()));
        rx.recv().unwrap()
    }

    #[test]
    fn streaming_copies_match_plain_ones_aligned_or_not() {
        let src: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut page = vec![0u8; PAGE_BYTES as usize].into_boxed_slice();
        for (at, len) in [(0, 4096), (4096, 1024), (17, 4000), (64, 100), (32, 8192)] {
            copy_streaming(&mut page[at..at + len], &src[..len]);
            assert_eq!(&page[at..at + len], &src[..len], "at {at}, len {len}");
        }
    }

    #[test]
    fn unwritten_ranges_read_as_holes() {
        let device = MemDevice::new(1 << 20);
        let outcome = run(
            &device,
            DeviceOp::Read {
                offset: 4096,
                buf: AlignedBuf::new(8192),
            },
        );
        assert!(outcome.hole);
        assert!(outcome.buf.unwrap().as_slice().iter().all(|b| *b == 0));
    }

    #[test]
    fn writes_across_pages_read_back() {
        let device = MemDevice::new(1 << 20);
        let mut buf = AlignedBuf::new(100_000);
        buf.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        let expected = buf.as_slice().to_vec();
        run(
            &device,
            DeviceOp::Write {
                offset: 60_000,
                buf: buf.into(),
                durable: false,
            },
        );
        let outcome = run(
            &device,
            DeviceOp::Read {
                offset: 60_000,
                buf: AlignedBuf::new(100_000),
            },
        );
        assert!(!outcome.hole);
        assert_eq!(outcome.buf.unwrap().as_slice(), &expected[..]);
    }

    #[test]
    fn large_writes_on_copier_threads_read_back() {
        let device = MemDevice::new(8 << 20);
        let len = 2 * COPIER_WRITE_BYTES_MIN + 4096;
        let mut buf = AlignedBuf::new(len);
        buf.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8);
        let expected = buf.as_slice().to_vec();
        let caller = std::thread::current().id();
        let (tx, rx) = mpsc::channel();
        let op = DeviceOp::Write {
            offset: 4096,
            buf: buf.into(),
            durable: false,
        };
        device.submit(
            op,
            Box::new(move |outcome| tx.send((outcome, std::thread::current().id())).unwrap()),
        );
        let (outcome, completed_on) = rx.recv().unwrap();
        outcome.result.unwrap();
        assert_ne!(completed_on, caller, "a large write should run on a copier");
        let read = run(
            &device,
            DeviceOp::Read {
                offset: 4096,
                buf: AlignedBuf::new(len),
            },
        );
        assert_eq!(read.buf.unwrap().as_slice(), &expected[..]);
    }

    #[test]
    fn discard_frees_whole_pages_and_zeroes_partial_ones() {
        let device = MemDevice::new(1 << 20);
        let mut buf = AlignedBuf::new(3 * PAGE_BYTES as usize);
        buf.as_mut_slice().fill(0xaa);
        run(
            &device,
            DeviceOp::Write {
                offset: 0,
                buf: buf.into(),
                durable: false,
            },
        );
        run(
            &device,
            DeviceOp::Discard {
                offset: 100,
                length: 2 * PAGE_BYTES,
            },
        );
        let extents = device.extents(0, 3 * PAGE_BYTES, 16).unwrap();
        assert_eq!(
            extents,
            vec![
                Extent {
                    length: PAGE_BYTES,
                    hole: false
                },
                Extent {
                    length: PAGE_BYTES,
                    hole: true
                },
                Extent {
                    length: PAGE_BYTES,
                    hole: false
                }
            ]
        );
        let read = run(
            &device,
            DeviceOp::Read {
                offset: 0,
                buf: AlignedBuf::new(200),
            },
        )
        .buf
        .unwrap();
        assert!(read.as_slice()[..100].iter().all(|b| *b == 0xaa));
        assert!(read.as_slice()[100..].iter().all(|b| *b == 0));
    }
}
