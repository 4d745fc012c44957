//! Just enough of deflate (RFC 1951) to keep plots small: one block with
//! the fixed Huffman codes, and matches of two kinds only, against the
//! previous pixel and against the row above. A plot is flat colour, so
//! those two find nearly everything: a 1200 x 15670 plot went from 56 MB
//! stored to well under 1 MB. No dependency.

/// The longest match deflate can say.
const MATCH_MAX: usize = 258;
/// The shortest match worth a length and distance code.
const MATCH_MIN: usize = 3;
/// The farthest back a match may reach.
const DISTANCE_MAX: usize = 32_768;

/// A zlib stream (RFC 1950) of `data`, compressed with matches at
/// `distances` (the nearest first; those beyond 32 KiB are ignored).
pub fn zlib(data: &[u8], distances: &[usize]) -> Vec<u8> {
    let mut bits = BitWriter::default();
    bits.write(1, 1); // BFINAL: the only block
    bits.write(1, 2); // BTYPE 01: fixed Huffman codes
    let mut at = 0;
    while at < data.len() {
        let (length, distance) = longest_match(data, at, distances);
        if length >= MATCH_MIN {
            write_length(&mut bits, length);
            write_distance(&mut bits, distance);
            at += length;
        } else {
            write_literal(&mut bits, u16::from(data[at]));
            at += 1;
        }
    }
    write_literal(&mut bits, 256); // end of block
    let mut out = vec![0x78, 0x01];
    out.extend_from_slice(&bits.finish());
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

fn longest_match(data: &[u8], at: usize, distances: &[usize]) -> (usize, usize) {
    let limit = (data.len() - at).min(MATCH_MAX);
    distances
        .iter()
        .filter(|&&d| d > 0 && d <= DISTANCE_MAX && d <= at)
        .map(|&d| {
            let length = (0..limit)
                .take_while(|&i| data[at + i] == data[at + i - d])
                .count();
            (length, d)
        })
        .max_by_key(|&(length, d)| (length, std::cmp::Reverse(d)))
        .unwrap_or((0, 0))
}

/// A literal byte (0-255) or the end of block (256); lengths use 257-285.
fn write_literal(bits: &mut BitWriter, symbol: u16) {
    let (code, width) = match symbol {
        0..=143 => (0x30 + symbol, 8),
        144..=255 => (0x190 + symbol - 144, 9),
        256..=279 => (symbol - 256, 7),
        _ => (0xc0 + symbol - 280, 8),
    };
    bits.write_huffman(code, width);
}

/// Base lengths of length codes 257-285, and their extra bits.
const LENGTH_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LENGTH_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
/// Base distances of distance codes 0-29, and their extra bits.
const DISTANCE_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DISTANCE_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];

/// The code whose base is the largest not above `value`.
fn code_of(bases: &[u16], value: usize) -> usize {
    bases
        .iter()
        .rposition(|&base| usize::from(base) <= value)
        .expect("value >= the first base")
}

fn write_length(bits: &mut BitWriter, length: usize) {
    let code = code_of(&LENGTH_BASE, length);
    write_literal(bits, 257 + code as u16);
    let extra = (length - usize::from(LENGTH_BASE[code])) as u32;
    bits.write(extra, LENGTH_EXTRA[code]);
}

fn write_distance(bits: &mut BitWriter, distance: usize) {
    let code = code_of(&DISTANCE_BASE, distance);
    bits.write_huffman(code as u16, 5);
    let extra = (distance - usize::from(DISTANCE_BASE[code])) as u32;
    bits.write(extra, DISTANCE_EXTRA[code]);
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &byte in chunk {
            a += u32::from(byte);
            b += a;
        }
        a %= 65_521;
        b %= 65_521;
    }
    (b << 16) | a
}

/// Bits packed from the least significant end of each byte, as deflate
/// wants them.
#[derive(Default)]
struct BitWriter {
    out: Vec<u8>,
    pending: u64,
    count: u8,
}

impl BitWriter {
    /// `value`'s low `width` bits, least significant first (extra bits and
    /// header fields).
    fn write(&mut self, value: u32, width: u8) {
        self.pending |= u64::from(value) << self.count;
        self.count += width;
        while self.count >= 8 {
            self.out.push(self.pending as u8);
            self.pending >>= 8;
            self.count -= 8;
        }
    }

    /// A Huffman code: deflate sends its most significant bit first.
    fn write_huffman(&mut self, code: u16, width: u8) {
        let reversed = (code.reverse_bits() >> (16 - width)) as u32;
        self.write(reversed, width);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.count > 0 {
            self.out.push(self.pending as u8);
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoder for what `zlib` writes (fixed Huffman codes only), to
    /// check the round trip without a dependency.
    fn inflate_fixed(stream: &[u8]) -> Vec<u8> {
        let data = &stream[2..stream.len() - 4];
        let mut position = 0usize;
        let mut bit = |n: u8| -> u32 {
            let mut value = 0;
            for i in 0..n {
                let b = (data[position / 8] >> (position % 8)) & 1;
                value |= u32::from(b) << i;
                position += 1;
            }
            value
        };
        assert_eq!(bit(1), 1, "one final block");
        assert_eq!(bit(2), 1, "fixed codes");
        let mut out: Vec<u8> = Vec::new();
        loop {
            // Read a code most significant bit first, growing until it
            // falls in one of the fixed code ranges.
            let mut code = 0u32;
            let mut width = 0;
            let symbol = loop {
                code = (code << 1) | bit(1);
                width += 1;
                match (width, code) {
                    (7, 0..=0x17) => break code + 256,
                    (8, 0x30..=0xbf) => break code - 0x30,
                    (8, 0xc0..=0xc7) => break code - 0xc0 + 280,
                    (9, 0x190..=0x1ff) => break code - 0x190 + 144,
                    (9, _) => panic!("not a fixed code"),
                    _ => {}
                }
            };
            match symbol {
                0..=255 => out.push(symbol as u8),
                256 => break,
                _ => {
                    let code = (symbol - 257) as usize;
                    let length = usize::from(LENGTH_BASE[code]) + bit(LENGTH_EXTRA[code]) as usize;
                    let mut d = 0u32;
                    for _ in 0..5 {
                        d = (d << 1) | bit(1);
                    }
                    let distance = usize::from(DISTANCE_BASE[d as usize])
                        + bit(DISTANCE_EXTRA[d as usize]) as usize;
                    for _ in 0..length {
                        out.push(out[out.len() - distance]);
                    }
                }
            }
        }
        let checksum = u32::from_be_bytes(stream[stream.len() - 4..].try_into().unwrap());
        assert_eq!(checksum, adler32(&out));
        out
    }

    #[test]
    fn flat_rows_round_trip_and_shrink() {
        let row: Vec<u8> = (0..3601)
            .map(|i| if i % 700 < 350 { 255 } else { (i % 3) as u8 })
            .collect();
        let data: Vec<u8> = row.iter().cycle().take(row.len() * 50).copied().collect();
        let stream = zlib(&data, &[3, row.len()]);
        assert_eq!(inflate_fixed(&stream), data);
        assert!(stream.len() * 50 < data.len(), "{} bytes", stream.len());
    }

    #[test]
    fn bytes_with_no_repeats_round_trip_and_every_length_code_decodes() {
        let mut data: Vec<u8> = (0..=255u8).collect();
        for length in [
            3, 4, 10, 11, 18, 19, 34, 35, 66, 67, 130, 131, 257, 258, 300,
        ] {
            data.extend(std::iter::repeat_n(7u8, length));
            data.extend((0..=255u8).rev());
        }
        let stream = zlib(&data, &[1, 256, 40_000]);
        assert_eq!(inflate_fixed(&stream), data);
    }

    #[test]
    fn empty_input_is_a_valid_stream() {
        assert!(inflate_fixed(&zlib(&[], &[1])).is_empty());
    }

    #[test]
    fn adler32_matches_a_known_value() {
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
    }
}
