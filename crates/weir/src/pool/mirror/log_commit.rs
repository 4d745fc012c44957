//! Writing dirty-region log pages without a waiting thread: group commit.
//!
//! ```text
//!  writer: bits set in memory ──request(pages, version)──┐
//!  flush:  bits cleared ──request(pages)─────────────────┤
//!                                                         v
//!        queue ──(no write in flight)──> one image of every requested page,
//!        taken now, written to every writable copy ──last completion──> the
//!        batch's continuations run; the next batch starts from that thread
//! ```
//!
//! One write of a group's log is in flight at a time, so that an older
//! image of a page never lands after a newer one. A batch goes to the
//! device queue in the most urgent class among the writes waiting on it:
//! the log page a writeback needs is writeback too, so the adaptive mode
//! does not take it for a client's write and hold back the very writeback
//! that is waiting for it. A writer whose bits an
//! earlier durable image already carried is answered at once; writers
//! that queue behind one write share the next (sequential writers set bits
//! in the same page one after another).

use std::collections::{BTreeSet, VecDeque};
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{copy_error, PoolData, PAGE_BYTES};
use crate::device::{AlignedBuf, DeviceOp};
use crate::sched::IoClass;

/// Dirty-region bits in one 4 KiB page of the log.
pub(super) const LOG_BITS_PER_PAGE: u64 = PAGE_BYTES * 8;

pub(super) type LogDone = Box<dyn FnOnce(io::Result<()>) + Send>;

struct LogRequest {
    pages: BTreeSet<u64>,
    durable: bool,
    class: IoClass,
    /// Bits set at this log version: pages whose durable image is at
    /// least this recent need no write. None: write regardless.
    version: Option<u64>,
    done: LogDone,
}

/// One group's queue of log writes.
#[derive(Default)]
pub(super) struct LogCommits {
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    writing: bool,
    requests: VecDeque<LogRequest>,
}

/// The batch being written.
struct Batch {
    pages: Vec<u64>,
    durable: bool,
    class: IoClass,
    version: u64,
    requests: Vec<LogRequest>,
}

impl PoolData {
    /// Write the log pages holding `regions`' bits to every writable copy
    /// of `group` (durably if `durable`), then run `done`. With `version`,
    /// pages already durable at that version are skipped. `class` is that
    /// of the I/O waiting for the log.
    pub(super) fn commit_log(
        self: &Arc<Self>,
        group: usize,
        regions: &[u64],
        durable: bool,
        version: Option<u64>,
        class: IoClass,
        done: LogDone,
    ) {
        let pages = regions.iter().map(|r| r / LOG_BITS_PER_PAGE).collect();
        let request = LogRequest {
            pages,
            durable,
            class: log_class(class),
            version,
            done,
        };
        let mut queue = self.groups[group].log_commits.queue.lock();
        queue.requests.push_back(request);
        if queue.writing {
            return;
        }
        queue.writing = true;
        drop(queue);
        self.next_log_batch(group);
    }

    /// Start the next batch of the group's queue, or mark it idle.
    fn next_log_batch(self: &Arc<Self>, group_index: usize) {
        let group = &self.groups[group_index];
        loop {
            let requests: Vec<LogRequest> = {
                let mut queue = group.log_commits.queue.lock();
                if queue.requests.is_empty() {
                    queue.writing = false;
                    return;
                }
                queue.requests.drain(..).collect()
            };
            let (batch, already) = {
                let state = group.state.lock();
                let mut pages = BTreeSet::new();
                let mut durable = false;
                let mut class = IoClass::Scrub;
                let mut batched = Vec::new();
                let mut already = Vec::new();
                for request in requests {
                    let needed: Vec<u64> = request
                        .pages
                        .iter()
                        .copied()
                        .filter(|page| match request.version {
                            Some(version) => {
                                state.log_durable.get(page).is_none_or(|v| *v < version)
                            }
                            None => true,
                        })
                        .collect();
                    if needed.is_empty() {
                        already.push(request.done);
                        continue;
                    }
                    pages.extend(needed);
                    durable |= request.durable;
                    class = more_urgent(class, request.class);
                    batched.push(request);
                }
                let batch = Batch {
                    pages: pages.into_iter().collect(),
                    durable,
                    class,
                    version: state.log_version,
                    requests: batched,
                };
                (batch, already)
            };
            for done in already {
                done(Ok(()));
            }
            if batch.requests.is_empty() {
                continue;
            }
            self.write_log_batch(group_index, batch);
            return;
        }
    }

    fn write_log_batch(self: &Arc<Self>, group_index: usize, batch: Batch) {
        let group = &self.groups[group_index];
        let images: Vec<(u64, AlignedBuf)> = {
            let state = group.state.lock();
            batch
                .pages
                .iter()
                .map(|&page| {
                    let mut image = AlignedBuf::zeroed(PAGE_BYTES as usize);
                    let first = page * LOG_BITS_PER_PAGE;
                    let bytes = image.as_mut_slice();
                    for region in state.log.dirty_regions_in(first..first + LOG_BITS_PER_PAGE) {
                        let bit = region - first;
                        bytes[(bit / 8) as usize] |= 1 << (bit % 8);
                    }
                    (page, image)
                })
                .collect()
        };
        let class = batch.class;
        let members = group.writable();
        let writes = members.len() * images.len();
        if writes == 0 {
            return self.log_batch_written(group_index, batch, Vec::new());
        }
        let durable = batch.durable;
        let countdown = Arc::new(Mutex::new((Vec::with_capacity(writes), Some(batch))));
        for (member, attached) in &members {
            for (page, image) in &images {
                let mut buf = AlignedBuf::new(PAGE_BYTES as usize);
                buf.as_mut_slice().copy_from_slice(image.as_slice());
                let op = DeviceOp::Write {
                    offset: attached.regions.dirty_log.0 + page * PAGE_BYTES,
                    buf: buf.into(),
                    durable,
                };
                let (pool, countdown, member) = (Arc::clone(self), Arc::clone(&countdown), *member);
                attached.queue.submit(
                    class,
                    op,
                    Box::new(move |outcome| {
                        let last = {
                            let mut countdown = countdown.lock();
                            countdown.0.push((member, outcome.result));
                            (countdown.0.len() == writes).then(|| {
                                let results = std::mem::take(&mut countdown.0);
                                (results, countdown.1.take().expect("finished once"))
                            })
                        };
                        if let Some((results, batch)) = last {
                            pool.log_batch_written(group_index, batch, results);
                        }
                    }),
                );
            }
        }
    }

    /// Every write of a batch completed: answer it and start the next.
    fn log_batch_written(
        self: &Arc<Self>,
        group_index: usize,
        batch: Batch,
        results: Vec<(usize, io::Result<()>)>,
    ) {
        if !results.is_empty() && results.iter().all(|(_, r)| r.is_ok()) {
            return self.log_batch_settled(group_index, batch, Ok(()));
        }
        // A copy failed: faulting it writes labels, which waits. Not on a
        // pool worker: a flush on one may be waiting for this very batch.
        let pool = Arc::clone(self);
        let settle: Box<dyn FnOnce() + Send> = Box::new(move || {
            // One result per member: its first failure, if any.
            let mut per_member: Vec<(usize, io::Result<()>)> = Vec::new();
            for (member, result) in results {
                match per_member.iter_mut().find(|(m, _)| *m == member) {
                    Some(slot) => {
                        if slot.1.is_ok() {
                            slot.1 = result;
                        }
                    }
                    None => per_member.push((member, result)),
                }
            }
            let settled = pool.settle_writes(group_index, per_member, "dirty log write");
            pool.log_batch_settled(group_index, batch, settled);
        });
        let settle = Arc::new(Mutex::new(Some(settle)));
        let run = |settle: &Mutex<Option<Box<dyn FnOnce() + Send>>>| {
            if let Some(settle) = settle.lock().take() {
                settle()
            }
        };
        let on_thread = Arc::clone(&settle);
        let spawned = std::thread::Builder::new()
            .name("weir-log-fault".into())
            .spawn(move || run(&on_thread));
        if let Err(err) = spawned {
            tracing::warn!(pool = self.name, error = %err, "cannot start a thread for a failed log write; handling it here");
            run(&settle);
        }
    }

    fn log_batch_settled(
        self: &Arc<Self>,
        group_index: usize,
        batch: Batch,
        result: io::Result<()>,
    ) {
        if result.is_ok() && batch.durable {
            let mut state = self.groups[group_index].state.lock();
            for &page in &batch.pages {
                let durable = state.log_durable.entry(page).or_default();
                *durable = (*durable).max(batch.version);
            }
        }
        for request in batch.requests {
            (request.done)(result.as_ref().map(|_| ()).map_err(copy_error));
        }
        self.next_log_batch(group_index);
    }
}

/// The class a log write takes for an I/O of `class`: a client's I/O
/// (TRIM and WRITE_ZEROES included) makes it a client write, readahead and
/// writeback make it writeback, scrub and resilver keep theirs.
fn log_class(class: IoClass) -> IoClass {
    match class {
        IoClass::SyncRead | IoClass::SyncWrite | IoClass::Trim => IoClass::SyncWrite,
        IoClass::AsyncRead | IoClass::AsyncWrite => IoClass::AsyncWrite,
        IoClass::Scrub | IoClass::Resilver => class,
    }
}

/// Of two log-write classes, the one a batch serving both must take.
fn more_urgent(a: IoClass, b: IoClass) -> IoClass {
    let rank = |class| match class {
        IoClass::SyncWrite => 0,
        IoClass::AsyncWrite => 1,
        IoClass::Resilver => 2,
        _ => 3,
    };
    if rank(b) < rank(a) {
        b
    } else {
        a
    }
}
