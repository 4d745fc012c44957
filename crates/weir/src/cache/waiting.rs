//! Client writes waiting for room in the dirty budget. The budget is one
//! for the whole server, so the queue is too, and whichever thread made
//! room lets writes in. Room goes first to the waiting volume that holds
//! the least of the budget, oldest write first within a volume (as Linux
//! gives each device a share of the dirty limit by its write-back, so
//! that a slow disk's writers do not hold back a fast one's). A queue per
//! volume would let each volume's write-back admit its own writers first,
//! and a writer on one volume would wait for as long as another volume's
//! writer kept the budget full; one plain queue would make it wait behind
//! every write that writer has queued. Which writes fit is the budget's
//! to say: while several volumes write, the one holding the most leaves
//! headroom to the others.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use super::budget::DirtyBudget;

/// How a waiting write goes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Into the cache: room was made for it.
    Cache,
    /// Straight to the store: the limit shrank below its size, or its
    /// volume is writing everything back.
    Through,
    /// Failed: its volume failed or is gone.
    Fail,
}

/// A write waiting for room, unanswered.
pub trait Waiter: Send {
    /// The budget it needs.
    fn bytes(&self) -> u64;
    /// The volume it is for (its cache's address).
    fn volume(&self) -> usize;
    /// The bytes of the budget its volume holds now.
    fn volume_holds(&self) -> u64;
    /// Let it in. The volume may still fail it, if it has failed since.
    fn enter(self: Box<Self>, entry: Entry);
}

thread_local! {
    /// This thread is letting writes in: one it lets in pumps its cache,
    /// which calls back here; the outer loop goes on instead.
    static ADMITTING: Cell<bool> = const { Cell::new(false) };
}

pub struct WaitingWrites {
    queue: Mutex<VecDeque<Box<dyn Waiter>>>,
    /// What counts them and says whether they fit.
    budget: Arc<DirtyBudget>,
}

impl WaitingWrites {
    pub fn new(budget: Arc<DirtyBudget>) -> WaitingWrites {
        WaitingWrites {
            queue: Mutex::new(VecDeque::new()),
            budget,
        }
    }

    /// Queue a write the budget told to wait (it counted it), then let in
    /// what fits: room may have been made since.
    pub fn wait(&self, write: Box<dyn Waiter>) {
        self.queue.lock().push_back(write);
        self.admit();
    }

    /// Let writes in while the next fits: each volume's oldest, the
    /// volume holding least first.
    pub fn admit(&self) {
        let budget = &*self.budget;
        if budget.waiting() == 0 || ADMITTING.with(|a| a.replace(true)) {
            return;
        }
        loop {
            let next = {
                let mut queue = self.queue.lock();
                next_in(&queue).and_then(|at| {
                    let bytes = queue[at].bytes();
                    let too_large = budget.too_large(bytes);
                    (too_large || budget.fits_for(bytes, queue[at].volume())).then(|| {
                        let entry = if too_large {
                            Entry::Through
                        } else {
                            Entry::Cache
                        };
                        (queue.remove(at).expect("in the queue"), entry)
                    })
                })
            };
            let Some((write, entry)) = next else { break };
            budget.admitted();
            write.enter(entry);
        }
        ADMITTING.with(|a| a.set(false));
    }

    /// Take `volume`'s writes out of the queue and let each in as `entry`,
    /// oldest first: through when it writes everything back, failed when
    /// it failed or goes away. Others' writes behind them may fit now.
    pub fn release_volume(&self, volume: usize, entry: Entry) {
        let mine: VecDeque<Box<dyn Waiter>> = {
            let mut queue = self.queue.lock();
            let (mine, others) = std::mem::take(&mut *queue)
                .into_iter()
                .partition(|w| w.volume() == volume);
            *queue = others;
            mine
        };
        if mine.is_empty() {
            return;
        }
        for write in mine {
            self.budget.admitted();
            write.enter(entry);
        }
        self.admit();
    }
}

/// Where the write to let in next stands in `queue`: the oldest of the
/// volume that holds least, the oldest of those on a tie.
fn next_in(queue: &VecDeque<Box<dyn Waiter>>) -> Option<usize> {
    let mut seen: Vec<usize> = Vec::new();
    let mut best: Option<(u64, usize)> = None;
    for (at, write) in queue.iter().enumerate() {
        let volume = write.volume();
        if seen.contains(&volume) {
            continue;
        }
        seen.push(volume);
        let holds = write.volume_holds();
        if best.is_none_or(|(least, _)| holds < least) {
            best = Some((holds, at));
        }
    }
    best.map(|(_, at)| at)
}

impl Drop for WaitingWrites {
    /// Writes still waiting when every cache is gone fail: nothing is left
    /// to write them to.
    fn drop(&mut self) {
        for write in std::mem::take(&mut *self.queue.lock()) {
            self.budget.admitted();
            write.enter(Entry::Fail);
        }
    }
}
