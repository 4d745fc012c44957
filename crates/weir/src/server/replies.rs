//! The reply writer: one thread per connection owns the socket's write
//! side. Completions (on any thread) queue replies; the writer sends every
//! queued reply with one vectored write, then releases their budget.

use std::io::{self, IoSlice, Write};
use std::net::Shutdown;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread::JoinHandle;

use weir_nbd::{reply, Errno};

use super::budget::Budget;
use super::stream::Stream;
use crate::volume::ReadData;

/// Replies gathered into one write at most.
const BATCH_REPLIES_MAX: usize = 64;

pub enum Body {
    Ok,
    Error {
        errno: Errno,
        message: String,
    },
    Read {
        offset: u64,
        data: ReadData,
    },
    /// `(length, flags)` extents of `base:allocation`.
    BlockStatus(Vec<(u32, u32)>),
}

pub struct Reply {
    pub handle: u64,
    pub body: Body,
    /// Budget the request holds, released once the reply is sent.
    pub budget_bytes: u64,
}

pub fn spawn(
    stream: Stream,
    structured: bool,
    budget: Arc<Budget>,
    replies: Receiver<Reply>,
    peer: String,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("weir-reply".into())
        .spawn(move || run(stream, structured, &budget, &replies, &peer))
}

fn run(
    mut stream: Stream,
    structured: bool,
    budget: &Budget,
    replies: &Receiver<Reply>,
    peer: &str,
) {
    let mut alive = true;
    while let Ok(first) = replies.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_REPLIES_MAX {
            match replies.try_recv() {
                Ok(reply) => batch.push(reply),
                Err(_) => break,
            }
        }
        if alive {
            if let Err(err) = send(&mut stream, structured, &batch) {
                tracing::info!(peer, error = %err, "client went away while replies were pending");
                alive = false;
                // Unblock the reader too; it will wind the connection down.
                stream.shutdown(Shutdown::Both);
            }
        }
        for reply in batch {
            budget.release(reply.budget_bytes);
        }
    }
}

fn send(stream: &mut Stream, structured: bool, batch: &[Reply]) -> io::Result<()> {
    let headers: Vec<Vec<u8>> = batch.iter().map(|r| header(r, structured)).collect();
    let mut slices = Vec::with_capacity(batch.len() * 2);
    for (reply, header) in batch.iter().zip(&headers) {
        slices.push(IoSlice::new(header));
        if let Body::Read { data, .. } = &reply.body {
            if !(structured && data.hole) {
                slices.push(IoSlice::new(data.bytes()));
            }
        }
    }
    write_all_vectored(stream, &mut slices)
}

/// The bytes before any read data, or the whole reply.
fn header(reply: &Reply, structured: bool) -> Vec<u8> {
    let handle = reply.handle;
    match (&reply.body, structured) {
        (Body::Ok, _) => reply::simple(handle, 0).to_vec(),
        (Body::Error { errno, .. }, false) => reply::simple(handle, errno.wire()).to_vec(),
        (Body::Error { errno, message }, true) => reply::error_chunk(handle, errno.wire(), message),
        (Body::Read { .. }, false) => reply::simple(handle, 0).to_vec(),
        (Body::Read { offset, data }, true) if data.hole => {
            reply::offset_hole(handle, *offset, data.len as u32, true)
        }
        (Body::Read { offset, data }, true) => {
            reply::offset_data_header(handle, *offset, data.len as u32, true)
        }
        (Body::BlockStatus(extents), _) => {
            reply::block_status(handle, weir_nbd::consts::BASE_ALLOCATION_ID, extents, true)
        }
    }
}

fn write_all_vectored(stream: &mut Stream, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !slices.is_empty() {
        match stream.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut slices, written),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}
