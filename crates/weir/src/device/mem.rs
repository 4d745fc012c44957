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
            bytes[in_page..in_page + range.len()].copy_from_slice(&data[range]);
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
                Outcome {
                    result: Ok(()),
                    buf: Some(buf),
                    hole: false,
                }
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
                buf,
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
            buf,
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
                buf,
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
