//! Issuing device I/O for the pool: every op goes through the member's
//! device queue with its class, and the worker thread waits for it.

use std::io;
use std::sync::Arc;

use super::Attached;
use crate::device::{AlignedBuf, DeviceOp, Outcome};
use crate::sched::IoClass;

/// Run ops on several members at once and wait for all, in order.
pub(super) fn run_all(ops: Vec<(Arc<Attached>, IoClass, DeviceOp)>) -> Vec<Outcome> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let count = ops.len();
    for (index, (attached, class, op)) in ops.into_iter().enumerate() {
        let sender = sender.clone();
        attached.queue.submit(
            class,
            op,
            Box::new(move |outcome| drop(sender.send((index, outcome)))),
        );
    }
    let mut outcomes: Vec<Option<Outcome>> = (0..count).map(|_| None).collect();
    for _ in 0..count {
        let (index, outcome) = receiver.recv().expect("devices complete every op");
        outcomes[index] = Some(outcome);
    }
    outcomes
        .into_iter()
        .map(|o| o.expect("every op answered"))
        .collect()
}

pub(super) fn run_one(attached: &Arc<Attached>, class: IoClass, op: DeviceOp) -> Outcome {
    run_all(vec![(Arc::clone(attached), class, op)])
        .pop()
        .expect("one op, one outcome")
}

pub(super) fn read_at(
    attached: &Arc<Attached>,
    class: IoClass,
    offset: u64,
    length: u64,
) -> io::Result<AlignedBuf> {
    let op = DeviceOp::Read {
        offset,
        buf: AlignedBuf::new(length as usize),
    };
    let outcome = run_one(attached, class, op);
    outcome.result?;
    Ok(outcome.buf.expect("reads return their buffer"))
}

pub(super) fn write_op(offset: u64, bytes: &[u8], durable: bool) -> DeviceOp {
    let mut buf = AlignedBuf::new(bytes.len());
    buf.as_mut_slice().copy_from_slice(bytes);
    DeviceOp::Write {
        offset,
        buf: buf.into(),
        durable,
    }
}

/// Start an operation with a completion and wait for its outcome, on a
/// thread that owns no ring.
#[cfg(any(test, feature = "fuzzing"))]
pub(super) fn wait(submit: impl FnOnce(crate::device::Completion)) -> Outcome {
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    crate::device::without_thread_ring(|| {
        submit(Box::new(move |outcome| drop(sender.send(outcome))));
        receiver.recv().expect("every operation completes")
    })
}
