//! A buffered reader whose buffer costs memory only once bytes land in it.
//!
//! std's `BufReader` zero-fills its whole buffer on the first read, so a
//! 256 KiB buffer is 256 KiB resident per connection, idle or not. Here the
//! buffer comes from a zeroed allocation (fresh pages the kernel maps on
//! first touch), and reads write only what arrives: an idle connection
//! that only ever received its handshake and a few requests holds a few
//! pages of it.

use std::io::{self, Read};

pub struct ReadBuffer<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
    filled: usize,
}

impl<R: Read> ReadBuffer<R> {
    pub fn with_capacity(capacity: usize, inner: R) -> ReadBuffer<R> {
        ReadBuffer {
            inner,
            // Zeroed allocation: pages stay unmapped until written.
            buf: vec![0; capacity],
            pos: 0,
            filled: 0,
        }
    }
}

impl<R: Read> Read for ReadBuffer<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.filled {
            // Nothing buffered: large reads go straight to the caller.
            if out.len() >= self.buf.len() {
                return self.inner.read(out);
            }
            self.filled = self.inner.read(&mut self.buf)?;
            self.pos = 0;
        }
        let take = out.len().min(self.filled - self.pos);
        out[..take].copy_from_slice(&self.buf[self.pos..self.pos + take]);
        self.pos += take;
        Ok(take)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out its bytes a few at a time, as a socket might.
    struct Trickle(Vec<u8>, usize);

    impl Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let take = out.len().min(self.1).min(self.0.len());
            out[..take].copy_from_slice(&self.0[..take]);
            self.0.drain(..take);
            Ok(take)
        }
    }

    #[test]
    fn bytes_come_out_in_order_whatever_the_read_sizes() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        for (capacity, chunk, piece) in [(64, 5, 3), (64, 100, 200), (16, 1000, 7), (4096, 333, 64)]
        {
            let mut reader = ReadBuffer::with_capacity(capacity, Trickle(data.clone(), chunk));
            let mut out = Vec::new();
            let mut part = vec![0; piece];
            loop {
                let got = reader.read(&mut part).unwrap();
                if got == 0 {
                    break;
                }
                out.extend_from_slice(&part[..got]);
            }
            assert_eq!(
                out, data,
                "capacity {capacity}, chunk {chunk}, piece {piece}"
            );
        }
    }
}
