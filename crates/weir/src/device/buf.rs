//! Page-aligned I/O buffers, recycled through a bounded pool.
//!
//! O_DIRECT needs the memory address aligned too, so every buffer starts on
//! a 4 KiB boundary. Large aligned allocations are expensive (fresh pages
//! fault in one by one), so freed buffers go back to a per-size-class free
//! list. The lists are memory no budget accounts for, so together they
//! keep at most half of the bytes that buffers in use hold (and at least
//! `POOL_BYTES_FLOOR`): in proportion to the working set, which the
//! dirty budget, the read-ahead budget and the queues' depths bound.
//! A fixed 16 MiB bound let a mirror pool taking 128 KiB writes from many
//! connections free and fault in fresh pages for most buffers: zeroing
//! them took a sixth of the server's CPU time.
//!
//! When the lists are full, a freed buffer takes the room of a size class
//! no one has asked for in the last `STALE_AFTER_MS`: the lists follow
//! the sizes in use now. Kept full of one workload's sizes, they made
//! every buffer of the next workload fresh pages (a 1 MiB QD8 reader after
//! a reader with read-ahead ran at 0.55-0.75 of its rate). Classes in use
//! keep their buffers however seldom each is asked for: a large buffer
//! allocated afresh costs more page faults and zeroing than a small one.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::Arc;

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

/// Alignment of every buffer; covers the logical block size of any device.
pub const BUF_ALIGN_BYTES: usize = 4096;
const CLASS_MIN_SHIFT: u32 = 12; // 4 KiB
const CLASS_MAX_SHIFT: u32 = 26; // 64 MiB
const CLASS_COUNT: usize = (CLASS_MAX_SHIFT - CLASS_MIN_SHIFT + 1) as usize;
const POOL_BYTES_FLOOR: usize = 16 << 20;

/// Bytes held by all free lists together.
static POOL_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Bytes held by buffers in use.
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// How many bytes the free lists may hold now.
fn pool_bytes_max() -> usize {
    (LIVE_BYTES.load(Ordering::Relaxed) / 2).max(POOL_BYTES_FLOOR)
}

struct FreeList {
    buffers: Vec<NonNull<u8>>,
}

/// Per class: when a buffer of it was last asked for (`coarse_now_ms`).
static LAST_TAKE_MS: [AtomicUsize; CLASS_COUNT] = [const { AtomicUsize::new(0) }; CLASS_COUNT];
/// A class no one asked for in this long is stale: its listed buffers
/// give way to the classes in use. A class asked for less often pays at
/// most ten fresh buffers a second, which costs little; at a second, a
/// 1 MiB QD8 reader on the NVMe model after a read-ahead stream (whose
/// 512 KiB buffers filled the lists) ran at 0.6 of its rate for that
/// second, faulting in fresh pages for every buffer.
const STALE_AFTER_MS: usize = 100;

/// Milliseconds of the system's coarse monotonic clock (a few ns to read,
/// where a precise clock would be paid on every buffer).
fn coarse_now_ms() -> usize {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as usize * 1000 + ts.tv_nsec as usize / 1_000_000
}

// SAFETY: the pointers are owned allocations no one else references while
// they sit in the free list.
unsafe impl Send for FreeList {}

static POOL: [Mutex<FreeList>; CLASS_COUNT] = [const {
    Mutex::new(FreeList {
        buffers: Vec::new(),
    })
}; CLASS_COUNT];

fn class_of(capacity: usize) -> Option<usize> {
    let shift = capacity
        .next_power_of_two()
        .trailing_zeros()
        .max(CLASS_MIN_SHIFT);
    (shift <= CLASS_MAX_SHIFT).then(|| (shift - CLASS_MIN_SHIFT) as usize)
}

fn class_bytes(class: usize) -> usize {
    1 << (class as u32 + CLASS_MIN_SHIFT)
}

/// An owned, aligned byte buffer holding `len` valid bytes.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `len` bytes. Contents are initialised but unspecified
    /// (zero or a previous user's data); callers overwrite all of it.
    pub fn new(len: usize) -> Self {
        let class = class_of(len.max(1));
        let capacity = match class {
            Some(class) => class_bytes(class),
            None => len.next_multiple_of(BUF_ALIGN_BYTES),
        };
        if let Some(class) = class {
            // Written once a millisecond at most: every thread takes
            // buffers, and a line they all write would bounce between CPUs.
            let now_ms = coarse_now_ms();
            if LAST_TAKE_MS[class].load(Ordering::Relaxed) != now_ms {
                LAST_TAKE_MS[class].store(now_ms, Ordering::Relaxed);
            }
            if let Some(ptr) = POOL[class].lock().buffers.pop() {
                POOL_BYTES.fetch_sub(capacity, Ordering::Relaxed);
                LIVE_BYTES.fetch_add(capacity, Ordering::Relaxed);
                return AlignedBuf { ptr, capacity, len };
            }
        }
        LIVE_BYTES.fetch_add(capacity, Ordering::Relaxed);
        let layout = Layout::from_size_align(capacity, BUF_ALIGN_BYTES).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, capacity, len }
    }

    /// A buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let mut buf = Self::new(len);
        buf.as_mut_slice().fill(0);
        buf
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity >= len initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        LIVE_BYTES.fetch_sub(self.capacity, Ordering::Relaxed);
        if let Some(class) = class_of(self.capacity).filter(|c| class_bytes(*c) == self.capacity) {
            let reserved = POOL_BYTES.fetch_add(self.capacity, Ordering::Relaxed);
            if reserved + self.capacity <= pool_bytes_max() || release_stale(class) {
                POOL[class].lock().buffers.push(self.ptr);
                return;
            }
            POOL_BYTES.fetch_sub(self.capacity, Ordering::Relaxed);
        }
        free_pages(self.ptr, self.capacity);
    }
}

fn free_pages(ptr: NonNull<u8>, capacity: usize) {
    let layout = Layout::from_size_align(capacity, BUF_ALIGN_BYTES).expect("buffer layout");
    // SAFETY: allocated in `AlignedBuf::new` with this exact layout and
    // not freed since; no one else holds the pointer.
    unsafe { dealloc(ptr.as_ptr(), layout) }
}

/// A class other than `class` with listed buffers that no one asked for
/// in the last `STALE_AFTER_MS` (`last_takes[c]`: when class `c` was
/// last asked for, if it has listed buffers), the stalest first.
fn stale_class(last_takes: &[Option<usize>], class: usize, now_ms: usize) -> Option<usize> {
    last_takes
        .iter()
        .enumerate()
        .filter(|&(c, _)| c != class)
        .filter_map(|(c, last)| last.map(|t| (t, c)))
        .filter(|&(t, _)| now_ms.saturating_sub(t) >= STALE_AFTER_MS)
        .min()
        .map(|(_, c)| c)
}

/// Make room for a buffer of `class` (already counted in `POOL_BYTES`) by
/// releasing the listed buffers of a stale class. Returns whether there
/// is room now.
fn release_stale(class: usize) -> bool {
    let last_takes: Vec<Option<usize>> = (0..CLASS_COUNT)
        .map(|c| {
            let listed = POOL[c]
                .try_lock()
                .is_some_and(|list| !list.buffers.is_empty());
            listed.then(|| LAST_TAKE_MS[c].load(Ordering::Relaxed))
        })
        .collect();
    let Some(stale) = stale_class(&last_takes, class, coarse_now_ms()) else {
        return false;
    };
    let bytes = class_bytes(stale);
    let mut list = POOL[stale].lock();
    while POOL_BYTES.load(Ordering::Relaxed) > pool_bytes_max() {
        let Some(ptr) = list.buffers.pop() else {
            break;
        };
        POOL_BYTES.fetch_sub(bytes, Ordering::Relaxed);
        free_pages(ptr, bytes);
    }
    POOL_BYTES.load(Ordering::Relaxed) <= pool_bytes_max()
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// The bytes of a write, shared and read-only: the copies of a mirrored
/// write and the pieces of a split one read the same memory instead of
/// each copying it (a mirror pool taking 128 KiB writes from 32
/// connections spent a quarter to a third more CPU per GiB with them).
#[derive(Clone)]
pub struct WriteBuf {
    buf: Arc<AlignedBuf>,
    start: usize,
    len: usize,
}

impl WriteBuf {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buf.as_slice()[self.start..self.start + self.len]
    }

    /// `len` bytes from `at` of these, sharing the memory. For O_DIRECT,
    /// `at` keeps the alignment the device needs.
    pub fn slice(&self, at: usize, len: usize) -> WriteBuf {
        assert!(at + len <= self.len, "slice past the end of a write");
        WriteBuf {
            buf: Arc::clone(&self.buf),
            start: self.start + at,
            len,
        }
    }
}

impl From<AlignedBuf> for WriteBuf {
    fn from(buf: AlignedBuf) -> WriteBuf {
        let len = buf.len();
        WriteBuf {
            buf: Arc::new(buf),
            start: 0,
            len,
        }
    }
}

impl std::fmt::Debug for WriteBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_sized() {
        for len in [1, 512, 4096, 5000, 1 << 20, 33 << 20] {
            let mut buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_mut_ptr() as usize % BUF_ALIGN_BYTES, 0);
            assert!(buf.as_slice().iter().all(|b| *b == 0));
        }
    }

    #[test]
    fn write_slices_share_the_bytes_and_outlive_the_whole() {
        let mut buf = AlignedBuf::new(3 * BUF_ALIGN_BYTES);
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = (i / BUF_ALIGN_BYTES) as u8;
        }
        let whole = WriteBuf::from(buf);
        let middle = whole.slice(BUF_ALIGN_BYTES, BUF_ALIGN_BYTES);
        assert_eq!(middle.len(), BUF_ALIGN_BYTES);
        assert_eq!(
            middle.as_slice().as_ptr(),
            whole.as_slice()[BUF_ALIGN_BYTES..].as_ptr(),
            "the same memory, not a copy"
        );
        assert!(middle.as_slice().iter().all(|b| *b == 1));
        // A slice of a slice counts from the slice's own start.
        assert_eq!(middle.slice(BUF_ALIGN_BYTES - 1, 1).as_slice(), [1]);
        drop(whole);
        assert!(
            middle.as_slice().iter().all(|b| *b == 1),
            "alive while sliced"
        );
    }

    #[test]
    fn recycled_buffers_keep_their_class() {
        let first = AlignedBuf::new(6000);
        assert_eq!(first.capacity, 8192);
        drop(first);
        let second = AlignedBuf::new(8000);
        assert_eq!(second.capacity, 8192);
    }

    #[test]
    fn room_is_taken_from_a_class_no_one_asked_for_lately() {
        let now = 10 * STALE_AFTER_MS;
        let lately = now - STALE_AFTER_MS / 2;
        let long_ago = now - 2 * STALE_AFTER_MS;
        let longer_ago = now - 3 * STALE_AFTER_MS;
        // Class 1 asked for lately, 2 long ago, 3 longer ago, 4 has
        // nothing listed.
        let last = [
            Some(now),
            Some(lately),
            Some(long_ago),
            Some(longer_ago),
            None,
        ];
        assert_eq!(stale_class(&last, 0, now), Some(3), "the stalest");
        assert_eq!(stale_class(&last, 3, now), Some(2), "never its own");
        assert_eq!(
            stale_class(&[Some(now), Some(lately)], 0, now),
            None,
            "classes in use keep their buffers"
        );
        assert_eq!(stale_class(&[Some(long_ago), None], 0, now), None);
    }

    #[test]
    fn free_lists_hold_at_most_half_the_bytes_in_use() {
        let sizes = [1 << 20, 2 << 20, 4 << 20, 8 << 20];
        let held: Vec<AlignedBuf> = (0..64)
            .map(|i| AlignedBuf::new(sizes[i % sizes.len()]))
            .collect();
        let live = LIVE_BYTES.load(Ordering::Relaxed);
        assert!(live >= 240 << 20, "the buffers held count as live");
        drop(held);
        let listed: usize = POOL
            .iter()
            .enumerate()
            .map(|(class, list)| list.lock().buffers.len() * class_bytes(class))
            .sum();
        // Other tests run in parallel and may hold or free buffers of
        // their own meanwhile: a few MiB of slack for them.
        let bound = (live / 2).max(POOL_BYTES_FLOOR) + (8 << 20);
        assert!(
            listed <= bound,
            "{listed} bytes in free lists, bound {bound}"
        );
        assert!(listed < 240 << 20, "not every freed buffer is kept");
    }
}
