//! RBD images in a Ceph cluster, through librbd's asynchronous calls.
//!
//! librbd runs each completion on a thread of its own; weir's completion
//! runs there too, as for any device. librbd's own cache is turned off:
//! weir caches writes itself with exact FLUSH semantics, and a second cache
//! below would hide the cluster's latency from the device queue. A write
//! that must be durable is followed by a flush before it completes, so it
//! stays durable even where a pool or image setting turns librbd's cache
//! back on.

mod ffi;
pub mod spec;

use std::ffi::{c_int, c_void, CString};
use std::io;
use std::ptr;

use self::ffi::{AioCompletion, Api, Cluster, Image, IoCtx};
pub use self::spec::RbdSpec;
use super::{
    push_extent, AlignedBuf, Completion, Device, DeviceInfo, DeviceOp, Extent, Outcome, WriteBuf,
};

/// librbd takes any byte offset; 512 keeps every client's alignment valid.
const LOGICAL_BLOCK_BYTES: u32 = 512;

/// librados settings weir applies to its own connection.
const CLIENT_SETTINGS: &[(&str, &str)] = &[
    ("rbd_cache", "false"),
    // A discard must zero what it covers, even inside an object.
    ("rbd_skip_partial_discard", "false"),
    // A wrong address or key fails in seconds, not librados's five minutes.
    ("client_mount_timeout", "30"),
];

pub struct RbdDevice {
    api: &'static Api,
    cluster: Cluster,
    ioctx: IoCtx,
    image: Image,
    info: DeviceInfo,
}

// SAFETY: librados and librbd handles may be used from any thread at once.
unsafe impl Send for RbdDevice {}
unsafe impl Sync for RbdDevice {}

fn errno_error(what: &str, ret: i64) -> io::Error {
    let err = io::Error::from_raw_os_error((-ret) as i32);
    io::Error::new(err.kind(), format!("{what}: {err}"))
}

fn check(what: &str, ret: c_int) -> io::Result<()> {
    if ret < 0 {
        Err(errno_error(what, i64::from(ret)))
    } else {
        Ok(())
    }
}

fn c_string(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name holds NUL"))
}

impl RbdDevice {
    pub fn open(spec: &RbdSpec, read_only: bool) -> io::Result<RbdDevice> {
        let api = ffi::api().map_err(|err| io::Error::new(io::ErrorKind::NotFound, err))?;
        let mut device = RbdDevice {
            api,
            cluster: ptr::null_mut(),
            ioctx: ptr::null_mut(),
            image: ptr::null_mut(),
            info: DeviceInfo {
                size_bytes: 0,
                logical_block_bytes: LOGICAL_BLOCK_BYTES,
                rotational: false,
                description: format!(
                    "rbd image {}/{} (cluster {}, client.{})",
                    spec.pool, spec.image, spec.cluster, spec.id
                ),
            },
        };
        // On an error below, Drop releases whatever was set up.
        let cluster_name = c_string(&spec.cluster)?;
        let user = c_string(&format!("client.{}", spec.id))?;
        // SAFETY: every pointer passed is valid for the call; handles are
        // stored in `device` as soon as they exist.
        unsafe {
            check(
                "rados_create2",
                (api.rados_create2)(&mut device.cluster, cluster_name.as_ptr(), user.as_ptr(), 0),
            )?;
            let conf = spec
                .conf
                .as_ref()
                .map(|path| c_string(&path.to_string_lossy()))
                .transpose()?;
            let conf_ptr = conf.as_ref().map_or(ptr::null(), |path| path.as_ptr());
            let what = match &spec.conf {
                Some(path) => format!("reading {}", path.display()),
                None => format!("finding {}.conf", spec.cluster),
            };
            check(&what, (api.rados_conf_read_file)(device.cluster, conf_ptr))?;
            for (key, value) in CLIENT_SETTINGS {
                let (key, value) = (c_string(key)?, c_string(value)?);
                check(
                    "rados_conf_set",
                    (api.rados_conf_set)(device.cluster, key.as_ptr(), value.as_ptr()),
                )?;
            }
            check(
                "connecting to the cluster",
                (api.rados_connect)(device.cluster),
            )?;
            let pool = c_string(&spec.pool)?;
            check(
                &format!("opening pool {}", spec.pool),
                (api.rados_ioctx_create)(device.cluster, pool.as_ptr(), &mut device.ioctx),
            )?;
            let image = c_string(&spec.image)?;
            let open = if read_only {
                api.rbd_open_read_only
            } else {
                api.rbd_open
            };
            check(
                &format!("opening image {}/{}", spec.pool, spec.image),
                open(device.ioctx, image.as_ptr(), &mut device.image, ptr::null()),
            )?;
            check(
                "rbd_get_size",
                (api.rbd_get_size)(device.image, &mut device.info.size_bytes),
            )?;
            let mut features = 0u64;
            check(
                "rbd_get_features",
                (api.rbd_get_features)(device.image, &mut features),
            )?;
            if !read_only && features & ffi::FEATURE_EXCLUSIVE_LOCK == 0 {
                tracing::warn!(
                    image = %format!("{}/{}", spec.pool, spec.image),
                    "the image has no exclusive-lock feature: nothing stops another gateway writing it meanwhile (rbd feature enable POOL/IMAGE exclusive-lock)"
                );
            } else if !read_only {
                // Held for as long as the image is open: librbd would
                // otherwise hand the lock to another writer on request, and
                // two servers caching writes to one image would each serve
                // stale data.
                let ret = (api.rbd_lock_acquire)(device.image, ffi::LOCK_MODE_EXCLUSIVE);
                if ret < 0 {
                    let err = errno_error("", i64::from(ret));
                    return Err(io::Error::new(
                        err.kind(),
                        format!(
                            "image {}/{} is held by another client (its exclusive lock could not be taken{err})",
                            spec.pool, spec.image
                        ),
                    ));
                }
            }
        }
        device.info.size_bytes -= device.info.size_bytes % u64::from(LOGICAL_BLOCK_BYTES);
        Ok(device)
    }

    /// Starts one librbd call with a completion that finishes `pending`.
    fn start(&self, pending: Box<Pending>, call: impl FnOnce(AioCompletion) -> c_int) {
        let api = self.api;
        let arg = Box::into_raw(pending);
        let mut completion: AioCompletion = ptr::null_mut();
        // SAFETY: `arg` is a leaked Box that `on_complete` takes back
        // exactly once: from the callback, or here when the call fails.
        unsafe {
            let ret = (api.rbd_aio_create_completion)(arg.cast(), on_complete, &mut completion);
            let ret = if ret < 0 { ret } else { call(completion) };
            if ret < 0 {
                if !completion.is_null() {
                    (api.rbd_aio_release)(completion);
                }
                let pending = Box::from_raw(arg);
                (pending.done)(Outcome::done(Err(errno_error("rbd", i64::from(ret)))));
            }
        }
    }
}

/// One call in flight: what it must keep alive, and what to run at the end.
struct Pending {
    api: &'static Api,
    image: Image,
    stage: Stage,
    done: Completion,
}

enum Stage {
    Read(AlignedBuf),
    /// The buffer must live until librbd is done with it; `flush_after`
    /// makes the write durable before it completes.
    Write {
        _buf: WriteBuf,
        flush_after: bool,
    },
    Other,
}

unsafe extern "C" fn on_complete(completion: AioCompletion, arg: *mut c_void) {
    // SAFETY: `arg` is the Box that `start` leaked for this completion.
    let mut pending = unsafe { Box::from_raw(arg.cast::<Pending>()) };
    let api = pending.api;
    // SAFETY: the completion is finished and released once, here.
    let ret = unsafe {
        let ret = (api.rbd_aio_get_return_value)(completion);
        (api.rbd_aio_release)(completion);
        ret
    };
    if ret < 0 {
        (pending.done)(Outcome::done(Err(errno_error("rbd", ret as i64))));
        return;
    }
    match std::mem::replace(&mut pending.stage, Stage::Other) {
        // An image shrunk by another client under weir reads short.
        Stage::Read(buf) if (ret as usize) < buf.len() => {
            (pending.done)(Outcome::done(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("rbd read {ret} of {} bytes: the image shrank", buf.len()),
            ))))
        }
        Stage::Read(buf) => (pending.done)(Outcome {
            result: Ok(()),
            buf: Some(buf),
            hole: false,
        }),
        Stage::Write {
            flush_after: true, ..
        } => {
            let image = pending.image;
            let mut flush: AioCompletion = ptr::null_mut();
            let arg = Box::into_raw(pending);
            // SAFETY: as in `RbdDevice::start`.
            unsafe {
                let mut ret = (api.rbd_aio_create_completion)(arg.cast(), on_complete, &mut flush);
                if ret >= 0 {
                    ret = (api.rbd_aio_flush)(image, flush);
                }
                if ret < 0 {
                    if !flush.is_null() {
                        (api.rbd_aio_release)(flush);
                    }
                    let pending = Box::from_raw(arg);
                    (pending.done)(Outcome::done(Err(errno_error("rbd flush", i64::from(ret)))));
                }
            }
        }
        Stage::Write { .. } | Stage::Other => (pending.done)(Outcome::done(Ok(()))),
    }
}

impl Device for RbdDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, op: DeviceOp, done: Completion) {
        op.assert_valid(&self.info);
        let (api, image) = (self.api, self.image);
        let pending = |stage| {
            Box::new(Pending {
                api,
                image,
                stage,
                done,
            })
        };
        // SAFETY (each call): the buffers live in `Pending` until the
        // completion runs.
        match op {
            DeviceOp::Read { offset, mut buf } => {
                let (ptr, len) = (buf.as_mut_ptr(), buf.len());
                self.start(pending(Stage::Read(buf)), |c| unsafe {
                    (api.rbd_aio_read)(image, offset, len, ptr.cast(), c)
                });
            }
            DeviceOp::Write {
                offset,
                buf,
                durable,
            } => {
                let (ptr, len) = (buf.as_slice().as_ptr(), buf.len());
                let stage = Stage::Write {
                    _buf: buf,
                    flush_after: durable,
                };
                self.start(pending(stage), |c| unsafe {
                    (api.rbd_aio_write)(image, offset, len, ptr.cast(), c)
                });
            }
            DeviceOp::Flush => self.start(pending(Stage::Other), |c| unsafe {
                (api.rbd_aio_flush)(image, c)
            }),
            DeviceOp::Discard { offset, length } => self.start(pending(Stage::Other), |c| unsafe {
                (api.rbd_aio_discard)(image, offset, length, c)
            }),
            DeviceOp::WriteZeroes { offset, length, .. } => {
                // usize is 64 bits wide wherever librbd runs.
                let length = length as usize;
                self.start(pending(Stage::Other), |c| unsafe {
                    (api.rbd_aio_write_zeroes)(image, offset, length, c, 0, 0)
                })
            }
        }
    }

    fn extents(&self, offset: u64, length: u64, extents_max: usize) -> io::Result<Vec<Extent>> {
        struct Walk {
            at: u64,
            end: u64,
            extents: Vec<Extent>,
            extents_max: usize,
        }
        unsafe extern "C" fn each(
            offset: u64,
            length: usize,
            exists: c_int,
            arg: *mut c_void,
        ) -> c_int {
            // SAFETY: `arg` is the `Walk` below, alive for the whole call.
            let walk = unsafe { &mut *arg.cast::<Walk>() };
            if exists == 0 || offset >= walk.end {
                return 0;
            }
            let start = offset.max(walk.at);
            let end = (offset + length as u64).min(walk.end);
            if end <= start {
                return 0;
            }
            push_extent(&mut walk.extents, start - walk.at, true);
            push_extent(&mut walk.extents, end - start, false);
            walk.at = end;
            // Enough entries: stop the walk (librbd returns this value).
            if walk.extents.len() > walk.extents_max {
                -libc::ECANCELED
            } else {
                0
            }
        }
        let mut walk = Walk {
            at: offset,
            end: offset + length,
            extents: Vec::new(),
            extents_max,
        };
        // Whole objects: with the object map (fast-diff) the answer comes
        // from memory, not from one round trip per object; an object that
        // exists reads as data, which NBD allows, and holes stay exact.
        let (include_parent, whole_object) = (1, 1);
        // SAFETY: `walk` outlives the synchronous call.
        let ret = unsafe {
            (self.api.rbd_diff_iterate2)(
                self.image,
                ptr::null(),
                offset,
                length,
                include_parent,
                whole_object,
                each,
                (&mut walk as *mut Walk).cast(),
            )
        };
        if ret < 0 && ret != -libc::ECANCELED {
            return Err(errno_error("rbd_diff_iterate2", i64::from(ret)));
        }
        if ret != -libc::ECANCELED {
            push_extent(&mut walk.extents, walk.end - walk.at, true);
        }
        walk.extents.truncate(extents_max.max(1));
        Ok(walk.extents)
    }
}

impl Drop for RbdDevice {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this device and is released
        // once, innermost first; rbd_close waits for calls in flight.
        unsafe {
            if !self.image.is_null() {
                (self.api.rbd_close)(self.image);
            }
            if !self.ioctx.is_null() {
                (self.api.rados_ioctx_destroy)(self.ioctx);
            }
            if !self.cluster.is_null() {
                (self.api.rados_shutdown)(self.cluster);
            }
        }
    }
}
