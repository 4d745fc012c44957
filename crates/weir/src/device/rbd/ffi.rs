//! librbd and librados, loaded when the first rbd device opens: weir builds
//! and runs on machines without Ceph, and only rbd devices need it.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;

pub type Cluster = *mut c_void;
pub type IoCtx = *mut c_void;
pub type Image = *mut c_void;
pub type AioCompletion = *mut c_void;
pub type AioCallback = unsafe extern "C" fn(AioCompletion, *mut c_void);
pub type DiffCallback = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;

/// `RBD_FEATURE_EXCLUSIVE_LOCK` in rbd/features.h.
pub const FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;
/// `RBD_LOCK_MODE_EXCLUSIVE` in rbd/librbd.h.
pub const LOCK_MODE_EXCLUSIVE: c_int = 0;

/// The calls weir makes, with the signatures of librados.h and librbd.h
/// (Ceph 16 and later).
pub struct Api {
    pub rados_create2:
        unsafe extern "C" fn(*mut Cluster, *const c_char, *const c_char, u64) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(Cluster, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(Cluster, *const c_char, *const c_char) -> c_int,
    pub rados_connect: unsafe extern "C" fn(Cluster) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(Cluster),
    pub rados_ioctx_create: unsafe extern "C" fn(Cluster, *const c_char, *mut IoCtx) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(IoCtx),
    pub rbd_open: unsafe extern "C" fn(IoCtx, *const c_char, *mut Image, *const c_char) -> c_int,
    pub rbd_open_read_only:
        unsafe extern "C" fn(IoCtx, *const c_char, *mut Image, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(Image) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(Image, *mut u64) -> c_int,
    pub rbd_get_features: unsafe extern "C" fn(Image, *mut u64) -> c_int,
    pub rbd_lock_acquire: unsafe extern "C" fn(Image, c_int) -> c_int,
    pub rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, AioCallback, *mut AioCompletion) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(AioCompletion) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(AioCompletion),
    pub rbd_aio_read: unsafe extern "C" fn(Image, u64, usize, *mut c_char, AioCompletion) -> c_int,
    pub rbd_aio_write:
        unsafe extern "C" fn(Image, u64, usize, *const c_char, AioCompletion) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(Image, AioCompletion) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(Image, u64, u64, AioCompletion) -> c_int,
    pub rbd_aio_write_zeroes:
        unsafe extern "C" fn(Image, u64, usize, AioCompletion, c_int, c_int) -> c_int,
    pub rbd_diff_iterate2: unsafe extern "C" fn(
        Image,
        *const c_char,
        u64,
        u64,
        u8,
        u8,
        DiffCallback,
        *mut c_void,
    ) -> c_int,
    // The function pointers above stay valid while these are loaded: for
    // the life of the process.
    _rbd: Library,
    _rados: Library,
}

/// The loaded libraries, or why they could not be loaded.
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let open = |name: &str| {
        // SAFETY: the Ceph libraries' initialisers have no preconditions.
        unsafe { Library::new(name) }
            .map_err(|err| format!("rbd devices need {name} (Debian: librbd1): {err}"))
    };
    let rbd = open("librbd.so.1")?;
    let rados = open("librados.so.2")?;
    macro_rules! symbol {
        ($lib:expr, $name:ident) => {
            // SAFETY: the field's type is the C declaration of the symbol.
            *unsafe { $lib.get(stringify!($name).as_bytes()) }
                .map_err(|err| format!("{}: {err}", stringify!($name)))?
        };
    }
    Ok(Api {
        rados_create2: symbol!(rados, rados_create2),
        rados_conf_read_file: symbol!(rados, rados_conf_read_file),
        rados_conf_set: symbol!(rados, rados_conf_set),
        rados_connect: symbol!(rados, rados_connect),
        rados_shutdown: symbol!(rados, rados_shutdown),
        rados_ioctx_create: symbol!(rados, rados_ioctx_create),
        rados_ioctx_destroy: symbol!(rados, rados_ioctx_destroy),
        rbd_open: symbol!(rbd, rbd_open),
        rbd_open_read_only: symbol!(rbd, rbd_open_read_only),
        rbd_close: symbol!(rbd, rbd_close),
        rbd_get_size: symbol!(rbd, rbd_get_size),
        rbd_get_features: symbol!(rbd, rbd_get_features),
        rbd_lock_acquire: symbol!(rbd, rbd_lock_acquire),
        rbd_aio_create_completion: symbol!(rbd, rbd_aio_create_completion),
        rbd_aio_get_return_value: symbol!(rbd, rbd_aio_get_return_value),
        rbd_aio_release: symbol!(rbd, rbd_aio_release),
        rbd_aio_read: symbol!(rbd, rbd_aio_read),
        rbd_aio_write: symbol!(rbd, rbd_aio_write),
        rbd_aio_flush: symbol!(rbd, rbd_aio_flush),
        rbd_aio_discard: symbol!(rbd, rbd_aio_discard),
        rbd_aio_write_zeroes: symbol!(rbd, rbd_aio_write_zeroes),
        rbd_diff_iterate2: symbol!(rbd, rbd_diff_iterate2),
        _rbd: rbd,
        _rados: rados,
    })
}
