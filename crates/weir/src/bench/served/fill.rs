//! Filling a served volume before a run, so a scrub has data to read (it
//! skips chunks never written).

use std::io::Write;

use anyhow::bail;
use weir_nbd::consts::CMD_WRITE;

use crate::bench::nbd_client::{self, read_reply, request_header};

const FILL_BLOCK_BYTES: u32 = 1 << 20;
const FILL_IN_FLIGHT: u64 = 8;

/// Write every byte of the export once, with data the scrub must check.
pub fn fill(uri: &str) -> anyhow::Result<()> {
    let mut connection = nbd_client::connect(uri)?;
    let size = connection.size_bytes;
    let block = u64::from(FILL_BLOCK_BYTES);
    let blocks = size / block;
    let data: Vec<u8> = (0..FILL_BLOCK_BYTES).map(|i| (i % 251) as u8 | 1).collect();
    let socket = &mut connection.socket;
    let mut sent = 0u64;
    let mut done = 0u64;
    while done < blocks {
        while sent < blocks && sent - done < FILL_IN_FLIGHT {
            socket.write_all(&request_header(
                CMD_WRITE,
                sent,
                sent * block,
                FILL_BLOCK_BYTES,
            ))?;
            socket.write_all(&data)?;
            sent += 1;
        }
        let (error, handle) = read_reply(socket)?;
        if error != 0 {
            bail!("filling the volume: write {handle} failed with NBD error {error}");
        }
        done += 1;
    }
    Ok(())
}
