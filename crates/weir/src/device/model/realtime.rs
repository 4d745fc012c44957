//! A timing model run in real time, as a [`Device`] inside `weir serve`.
//!
//! ```text
//!   submit(op) ──channel──> model thread: model.submit(io, now)
//!                           sleep until the next deadline (absolute, from one epoch)
//!                           model.advance(now) ──> run the op on the store ──> done
//! ```
//!
//! Deadlines are absolute times from one epoch, so a late wake-up delays
//! one completion and never shifts the ones after it. The thread measures
//! how late it completes each op against the model's deadline and reports
//! it in the log (every `LATENESS_REPORT_INTERVAL`, and when it stops).

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::faults::FaultPlan;
use super::power_loss::UnflushedLog;
use super::spec::{ModelSpec, ModelStore};
use super::{IoKind, ModelIo, Nanos, TimingModel};
use crate::device::file::FileDevice;
use crate::device::mem::MemDevice;
use crate::device::{
    run_sync, AlignedBuf, Completion, Device, DeviceInfo, DeviceOp, Extent, IoEngine, Outcome,
    WriteBuf,
};
use crate::stats::LatencyStats;

const LATENESS_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// How often the control file is read for fault commands.
const CONTROL_POLL_INTERVAL: Duration = Duration::from_millis(100);

enum Message {
    Op(DeviceOp, Completion),
    Stop,
}

pub struct ModelDevice {
    info: DeviceInfo,
    store: Arc<dyn Device>,
    sender: Mutex<Sender<Message>>,
    thread: Option<JoinHandle<()>>,
}

impl ModelDevice {
    pub fn open(spec: &ModelSpec, read_only: bool) -> io::Result<ModelDevice> {
        let store: Arc<dyn Device> = match &spec.store {
            ModelStore::Mem => Arc::new(MemDevice::new(spec.size_bytes)),
            ModelStore::File(path) => Arc::new(open_file_store(path, spec.size_bytes, read_only)?),
        };
        let info = DeviceInfo {
            size_bytes: spec.size_bytes,
            logical_block_bytes: store.info().logical_block_bytes.max(512),
            rotational: spec.rotational(),
            description: format!("{} (real-time model)", spec.text),
        };
        let (sender, receiver) = mpsc::channel();
        let worker = Worker {
            model: spec.timing_model(),
            faults: spec.faults.clone(),
            control: spec.control.clone(),
            store: Arc::clone(&store),
            epoch: Instant::now(),
            pending: HashMap::new(),
            next_id: 1,
            lateness: LatencyStats::default(),
            name: spec.text.clone(),
            size_bytes: spec.size_bytes,
            unflushed: spec
                .power_loss
                .map(|mode| UnflushedLog::new(mode, spec.volatile_bytes())),
        };
        let thread = std::thread::Builder::new()
            .name("weir-model".into())
            .spawn(move || worker.run(&receiver))?;
        Ok(ModelDevice {
            info,
            store,
            sender: Mutex::new(sender),
            thread: Some(thread),
        })
    }
}

fn open_file_store(path: &PathBuf, size_bytes: u64, read_only: bool) -> io::Result<FileDevice> {
    if !path.exists() {
        let file = std::fs::File::create_new(path)?;
        file.set_len(size_bytes)?;
    }
    let device = FileDevice::open(path, read_only, IoEngine::Auto)?;
    if device.info().size_bytes < size_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: {} bytes, smaller than the model's {size_bytes}",
                path.display(),
                device.info().size_bytes
            ),
        ));
    }
    Ok(device)
}

impl Device for ModelDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, op: DeviceOp, done: Completion) {
        op.assert_valid(&self.info);
        if let Err(mpsc::SendError(Message::Op(_, done))) =
            self.sender.lock().send(Message::Op(op, done))
        {
            done(Outcome::done(Err(io::Error::other("model device stopped"))));
        }
    }

    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>> {
        self.store.extents(offset, length, extents_max)
    }
}

impl Drop for ModelDevice {
    fn drop(&mut self) {
        let _ = self.sender.lock().send(Message::Stop);
        if let Some(thread) = self.thread.take() {
            crate::join::join_unless_current(thread);
        }
    }
}

struct Worker {
    model: Box<dyn TimingModel>,
    faults: FaultPlan,
    control: Option<PathBuf>,
    store: Arc<dyn Device>,
    epoch: Instant,
    pending: HashMap<u64, (DeviceOp, Completion)>,
    next_id: u64,
    /// How late completions ran against their deadlines.
    lateness: LatencyStats,
    name: String,
    size_bytes: u64,
    /// With `power_loss=`: what unflushed writes overwrote.
    unflushed: Option<UnflushedLog>,
}

impl Worker {
    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    fn run(mut self, receiver: &Receiver<Message>) {
        set_fine_timer_slack();
        let mut last_report = Instant::now();
        let mut last_control = Instant::now();
        let mut stopping = false;
        loop {
            self.advance();
            if stopping && self.pending.is_empty() {
                break;
            }
            if last_report.elapsed() >= LATENESS_REPORT_INTERVAL {
                self.report_lateness();
                last_report = Instant::now();
            }
            if last_control.elapsed() >= CONTROL_POLL_INTERVAL {
                self.read_control();
                last_control = Instant::now();
            }
            let wait = match self.model.next_event() {
                Some(at) => Duration::from_nanos(at.saturating_sub(self.now())),
                None => CONTROL_POLL_INTERVAL,
            };
            let message = if wait.is_zero() {
                receiver.try_recv().map_err(|e| match e {
                    mpsc::TryRecvError::Empty => RecvTimeoutError::Timeout,
                    mpsc::TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                })
            } else {
                receiver.recv_timeout(wait.min(CONTROL_POLL_INTERVAL))
            };
            match message {
                Ok(Message::Op(op, completion)) => self.accept(op, completion),
                Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => stopping = true,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        self.report_lateness();
    }

    /// Run the model up to now and complete what it finished.
    fn advance(&mut self) -> Nanos {
        let now = self.now();
        self.model.set_slowdown(self.faults.latency_factor(now));
        let mut done = Vec::new();
        self.model.advance(now, &mut done);
        for (id, deadline) in done {
            self.lateness.record(now.saturating_sub(deadline));
            let (op, completion) = self
                .pending
                .remove(&id)
                .expect("model completed a pending op");
            self.execute(op, completion, now);
        }
        now
    }

    fn accept(&mut self, op: DeviceOp, completion: Completion) {
        // The model must be up to date before it sees a new request.
        let now = self.advance();
        if self.faults.vanished(now) {
            completion(Outcome::done(Err(io::Error::from_raw_os_error(
                libc::ENXIO,
            ))));
            return;
        }
        let (offset, length) = op.range();
        let kind = match &op {
            DeviceOp::Read { .. } => IoKind::Read,
            DeviceOp::Write { .. } | DeviceOp::WriteZeroes { .. } => IoKind::Write,
            DeviceOp::Flush => IoKind::Flush,
            DeviceOp::Discard { .. } => IoKind::Discard,
        };
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, (op, completion));
        self.model.submit(
            ModelIo {
                id,
                kind,
                offset,
                length,
            },
            now,
        );
    }

    /// The model says the op is done: do it to the store, with faults.
    fn execute(&mut self, op: DeviceOp, completion: Completion, now: Nanos) {
        if self.faults.vanished(now) {
            return completion(Outcome::done(Err(io::Error::from_raw_os_error(
                libc::ENXIO,
            ))));
        }
        match op {
            DeviceOp::Read { offset, buf } => self.read(offset, buf, completion),
            DeviceOp::Write {
                offset,
                buf,
                durable,
            } => self.write(offset, buf, durable, completion),
            DeviceOp::Flush => {
                if let Some(log) = &mut self.unflushed {
                    log.flushed();
                }
                self.store.submit(DeviceOp::Flush, completion)
            }
            other => self.store.submit(other, completion),
        }
    }

    fn read(&self, offset: u64, buf: AlignedBuf, completion: Completion) {
        if self.faults.read_fails(offset, buf.len() as u64) {
            return completion(Outcome::done(Err(io::Error::from_raw_os_error(libc::EIO))));
        }
        let op = DeviceOp::Read { offset, buf };
        if self.faults.flipped_bytes.is_empty() {
            return self.store.submit(op, completion);
        }
        let faults = self.faults.clone();
        self.store.submit(
            op,
            Box::new(move |mut outcome: Outcome| {
                if let Some(buf) = outcome.buf.as_mut() {
                    faults.corrupt(offset, buf.as_mut_slice());
                }
                completion(outcome)
            }),
        );
    }

    fn write(&mut self, offset: u64, buf: WriteBuf, durable: bool, completion: Completion) {
        let length = buf.len() as u64;
        let target = self.faults.write_target(offset, length, self.size_bytes);
        if target != offset {
            tracing::debug!(device = self.name, offset, target, "misdirecting a write");
        }
        let track = !durable
            && self
                .unflushed
                .as_ref()
                .is_some_and(|log| log.tracks(length));
        if track {
            let old = run_sync(
                self.store.as_ref(),
                DeviceOp::Read {
                    offset: target,
                    buf: AlignedBuf::new(length as usize),
                },
            );
            match (old.result, old.buf) {
                (Ok(()), Some(old)) => {
                    if let Some(log) = &mut self.unflushed {
                        log.record(target, old);
                    }
                }
                (Err(err), _) => return completion(Outcome::done(Err(err))),
                (Ok(()), None) => unreachable!("reads return their buffer"),
            }
        }
        let op = DeviceOp::Write {
            offset: target,
            buf,
            durable,
        };
        self.store.submit(op, completion);
    }

    /// Undo what the drive held unflushed, then stop answering, as a drive
    /// that lost power would.
    fn lose_power(&mut self, now: Nanos) {
        let mut restored = 0u64;
        if let Some(log) = &self.unflushed {
            for (offset, old) in log.restores() {
                let mut buf = AlignedBuf::new(old.len());
                buf.as_mut_slice().copy_from_slice(old);
                let outcome = run_sync(
                    self.store.as_ref(),
                    DeviceOp::Write {
                        offset,
                        buf: buf.into(),
                        durable: true,
                    },
                );
                if let Err(err) = outcome.result {
                    tracing::warn!(device = self.name, offset, error = %err, "power loss: cannot undo a write");
                }
                restored += old.len() as u64;
            }
        }
        if let Some(log) = &mut self.unflushed {
            log.flushed();
        }
        self.faults.vanish_at = Some(now);
        tracing::warn!(
            device = self.name,
            undone_bytes = restored,
            "power loss: unflushed writes undone, device gone until `heal`"
        );
    }

    fn read_control(&mut self) {
        let Some(path) = &self.control else { return };
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        if text.trim().is_empty() {
            return;
        }
        // Commands are applied once: the file is emptied after reading.
        let _ = std::fs::write(path, "");
        let now = self.now();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if line == "powerloss" {
                if self.unflushed.is_none() {
                    tracing::warn!(
                        device = self.name,
                        "powerloss needs power_loss=drop|tear in the spec"
                    );
                    continue;
                }
                self.lose_power(now);
                continue;
            }
            match self.faults.apply_command(line, now) {
                Ok(()) => {
                    tracing::info!(device = self.name, command = line, "fault command applied")
                }
                Err(err) => tracing::warn!(device = self.name, "control file: {err}"),
            }
        }
    }

    fn report_lateness(&self) {
        if self.lateness.count() == 0 {
            return;
        }
        let l = self.lateness.summary_us();
        tracing::info!(
            device = self.name,
            ops = self.lateness.count(),
            p50_us = l.p50,
            p99_us = l.p99,
            max_us = l.max,
            "model completion lateness against deadlines"
        );
    }
}

/// Ask the kernel to wake this thread close to its deadlines (the default
/// slack is 50 us).
fn set_fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only
    // this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}
