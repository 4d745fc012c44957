//! Entry points for the coverage-guided fuzz targets in `fuzz/` (built with
//! the `fuzzing` feature). Each takes the fuzzer's bytes and returns why
//! the run went wrong; the targets panic on an `Err`, so libFuzzer keeps
//! the input.
//!
//! The torture runs draw every decision from the input
//! ([`Rng::scripted`]), so the fuzzer steers the same workloads, faults and
//! crashes that the seeded tests try at random.

use std::io;
use std::sync::{mpsc, Arc};

use crate::cache::flusher::Ticked;
use crate::cache::{CachedStore, DirtyBudget, Flusher};
use crate::device::mem::MemDevice;
use crate::device::AlignedBuf;
use crate::pool::SingleDevice;
use crate::rng::Rng;
use crate::sched::DeviceQueue;
use crate::volume::{Done, Volume};

/// A mirrored pool on simulated disks under faults, power losses and
/// member changes, checked against its reference after every step.
pub fn pool_torture(data: &[u8]) -> Result<(), String> {
    crate::pool::mirror::tests::torture::run(Rng::scripted(data))
}

/// The write-back cache over a store that fails writes and loses power.
pub fn cache_torture(data: &[u8]) -> Result<(), String> {
    crate::cache::store::torture::run(Rng::scripted(data))
}

const VOLUME_BYTES: u64 = 1 << 20;

fn wait<T: Send + 'static>(start: impl FnOnce(Done<T>)) -> io::Result<T> {
    let (tx, rx) = mpsc::channel();
    start(Box::new(move |result| drop(tx.send(result))));
    rx.recv().expect("every request completes")
}

/// NBD operations of any alignment on a volume (write-back cached or not,
/// 512-byte or 4 KiB device blocks) against a byte array: reads return the
/// newest bytes, and extents reported as holes read as zeroes.
pub fn volume_against_model(data: &[u8]) -> Result<(), String> {
    let mut rng = Rng::scripted(data);
    let block_bytes = [512, 4096][rng.below(2) as usize];
    let device = Arc::new(MemDevice::with_block_bytes(VOLUME_BYTES, block_bytes));
    let store: Arc<dyn crate::pool::Store> = Arc::new(SingleDevice::new(DeviceQueue::new(device)));
    let flusher = Flusher::manual(DirtyBudget::new(Some(256 << 10)));
    let cache = (rng.below(2) == 0).then(|| CachedStore::new(Arc::clone(&store), &flusher));
    let volume = match &cache {
        Some(cache) => Volume::new(Arc::clone(cache) as Arc<dyn crate::pool::Store>, false),
        None => Volume::new(store, false),
    };
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    let failed = |what: &str, err: io::Error| format!("{what} failed: {err}");
    for step in 0..64 {
        let offset = rng.below(VOLUME_BYTES);
        let length = 1 + rng.below((VOLUME_BYTES - offset).min(96 << 10)) as u32;
        let range = offset as usize..offset as usize + length as usize;
        let fua = rng.below(4) == 0;
        match rng.below(8) {
            0..=2 => {
                let fill = rng.below(256) as u8;
                let mut buf = AlignedBuf::new(length as usize);
                for (i, byte) in buf.as_mut_slice().iter_mut().enumerate() {
                    *byte = fill.wrapping_add(i as u8);
                }
                model[range.clone()].copy_from_slice(buf.as_slice());
                wait(|done| volume.write(offset, buf, fua, done))
                    .map_err(|e| failed("write", e))?;
            }
            3 => {
                wait(|done| volume.trim(offset, length, fua, done))
                    .map_err(|e| failed("trim", e))?;
                // A trimmed range may read as zeroes or as before; the
                // model learns which from the next read.
                let found = wait(|done| volume.read(offset, length, done))
                    .map_err(|e| failed("read after trim", e))?;
                let found = found.bytes();
                for (i, (byte, was)) in found.iter().zip(&model[range.clone()]).enumerate() {
                    if byte != was && *byte != 0 {
                        return Err(format!(
                            "step {step}: trim left {byte} at {}",
                            offset as usize + i
                        ));
                    }
                }
                model[range].copy_from_slice(found);
            }
            4 => {
                let may_trim = rng.below(2) == 0;
                wait(|done| volume.write_zeroes(offset, length, fua, may_trim, false, done))
                    .map_err(|e| failed("write zeroes", e))?;
                model[range].fill(0);
            }
            5 => wait(|done| volume.flush(done)).map_err(|e| failed("flush", e))?,
            6 => {
                if let Some(cache) = &cache {
                    cache.tick();
                }
                let extents = volume
                    .extents(offset, length, 64)
                    .map_err(|e| failed("extents", e))?;
                let mut at = offset as usize;
                for extent in extents {
                    let end = (at + extent.length as usize).min(range.end);
                    if extent.hole && model[at..end].iter().any(|b| *b != 0) {
                        return Err(format!(
                            "step {step}: {at}..{end} reported a hole over data"
                        ));
                    }
                    at = end;
                }
            }
            _ => {
                let found = wait(|done| volume.read(offset, length, done))
                    .map_err(|e| failed("read", e))?;
                if found.bytes() != &model[range] {
                    return Err(format!("step {step}: read {offset}+{length} differs"));
                }
            }
        }
    }
    let whole =
        wait(|done| volume.read(0, VOLUME_BYTES as u32, done)).map_err(|e| failed("read", e))?;
    if whole.bytes() != model.as_slice() {
        return Err("the volume differs from the model at the end".into());
    }
    Ok(())
}
