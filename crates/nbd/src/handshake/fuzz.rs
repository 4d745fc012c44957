//! Randomised handshakes: valid option sequences, then damaged (bytes
//! flipped, lengths that lie, pieces cut out or repeated, junk inserted)
//! and fed in chunks of random size. Whatever arrives, the machine must not
//! panic, must hold no more input than one bounded option, must answer
//! only in well-formed option replies, each for an option that was sent,
//! and may finish only on an export that exists.

use super::tests::{go_data, meta_data, option};
use super::*;

/// The catalog the fuzzed server offers.
struct Catalog;

impl ExportCatalog for Catalog {
    fn export(&self, name: &str) -> Option<ExportDetails> {
        (name.is_empty() || name == "disk").then(|| ExportDetails {
            name: "disk".into(),
            description: "the only export".into(),
            size_bytes: 1 << 30,
            transmission_flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH,
            block_size: BlockSize {
                minimum: 1,
                preferred: 4096,
                maximum: 32 << 20,
            },
            access: Access::Granted,
        })
    }
    fn list(&self) -> Vec<(String, String)> {
        vec![("disk".into(), "the only export".into())]
    }
}

/// xorshift64*: reproducible without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// Client flags and a plausible run of options, ending (usually) with one
/// that finishes the handshake.
fn valid_transcript(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    put_u32(&mut out, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let names = ["", "disk", "nope"];
    for _ in 0..rng.below(6) {
        let name = names[rng.below(names.len())];
        let infos = [INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE];
        out.extend(match rng.below(7) {
            0 => option(OPT_LIST, &[]),
            1 => option(OPT_STRUCTURED_REPLY, &[]),
            2 => option(OPT_INFO, &go_data(name, &infos)),
            3 => option(OPT_LIST_META_CONTEXT, &meta_data(name, &["base:"])),
            4 => option(OPT_SET_META_CONTEXT, &meta_data(name, &["base:allocation"])),
            5 => option(OPT_STARTTLS, &[]),
            _ => option(1000 + rng.below(1000) as u32, &[7; 9]),
        });
    }
    let name = names[rng.below(names.len())];
    out.extend(match rng.below(4) {
        0 => option(OPT_GO, &go_data(name, &[INFO_BLOCK_SIZE])),
        1 => option(OPT_EXPORT_NAME, name.as_bytes()),
        2 => option(OPT_ABORT, &[]),
        _ => Vec::new(),
    });
    out
}

/// One to four kinds of damage.
fn damage(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        if bytes.is_empty() {
            bytes.push(rng.next() as u8);
            continue;
        }
        let at = rng.below(bytes.len());
        match rng.below(6) {
            0 => bytes[at] ^= 1 << rng.below(8),
            1 => {
                // A length (or count) field that lies.
                let lie = match rng.below(4) {
                    0 => 0,
                    1 => u32::MAX,
                    2 => OPTION_DATA_BYTES_MAX + 1,
                    _ => rng.next() as u32 % 64,
                };
                let end = (at + 4).min(bytes.len());
                bytes[at..end].copy_from_slice(&lie.to_be_bytes()[..end - at]);
            }
            2 => bytes.truncate(at),
            3 => {
                let end = (at + 1 + rng.below(32)).min(bytes.len());
                bytes.drain(at..end);
            }
            4 => {
                let junk: Vec<u8> = (0..1 + rng.below(64)).map(|_| rng.next() as u8).collect();
                bytes.splice(at..at, junk);
            }
            _ => {
                let end = (at + 1 + rng.below(64)).min(bytes.len());
                let piece = bytes[at..end].to_vec();
                bytes.splice(at..at, piece);
            }
        }
    }
}

/// The option numbers named in the client's option headers, in order
/// (as far as they can be read off the stream: a reply may only name one
/// of these).
fn options_sent(bytes: &[u8]) -> Vec<u32> {
    let mut sent = Vec::new();
    let mut at = 4;
    while at + 16 <= bytes.len() {
        let kind = u32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap());
        let length = u32::from_be_bytes(bytes[at + 12..at + 16].try_into().unwrap());
        sent.push(kind);
        at += 16 + length as usize;
    }
    sent
}

/// Checks one batch of output: option replies, then (only when the
/// handshake finished through NBD_OPT_EXPORT_NAME) the export's size and
/// flags.
fn check_output(output: &[u8], finished: bool, sent: &[u32]) {
    let mut cursor = Cursor::new(output);
    while cursor.remaining() > 0 {
        if cursor.remaining() == 10 && finished {
            return; // NBD_OPT_EXPORT_NAME's answer, without the zeroes
        }
        let magic = cursor.u64().expect("a reply header");
        assert_eq!(magic, OPTION_REPLY_MAGIC, "output is not an option reply");
        let option = cursor.u32().expect("reply option");
        let _kind = cursor.u32().expect("reply type");
        let length = cursor.u32().expect("reply length");
        cursor
            .take(length as usize)
            .expect("reply payload as long as its header says");
        // `options_sent` walks the headers as the server does, lying
        // lengths included, so every answer names one of them.
        assert!(
            sent.contains(&option),
            "reply for option {option} never sent"
        );
    }
}

#[test]
fn damaged_handshakes_are_answered_or_refused_never_mishandled() {
    let mut rng = Rng(0x5eed_0f_f00d);
    let mut outcomes = [0u32; 4]; // need more, done, aborted, refused
    for _ in 0..4000 {
        let mut bytes = valid_transcript(&mut rng);
        if rng.chance(85) {
            damage(&mut rng, &mut bytes);
        }
        let sent = options_sent(&bytes);
        let mode = [TlsMode::Off, TlsMode::On, TlsMode::Require][rng.below(3)];
        let mut hs = Handshake::with_tls(mode);
        assert_eq!(hs.take_output().len(), 18, "greeting");
        let mut rest = &bytes[..];
        let mut outcome = 0;
        while !rest.is_empty() {
            let chunk = (1 + rng.below(200)).min(rest.len());
            let result = hs.receive(&rest[..chunk], &Catalog);
            rest = &rest[chunk..];
            assert!(
                hs.input.len() <= OPTION_DATA_BYTES_MAX as usize + OPTION_HEADER_BYTES + 200,
                "input held: {} bytes",
                hs.input.len()
            );
            let finished = matches!(result, Ok(Progress::Done(_)));
            check_output(&hs.take_output(), finished, &sent);
            match result {
                Ok(Progress::NeedMore) => continue,
                Ok(Progress::StartTls) => {
                    // As if the TLS handshake succeeded: the rest of the
                    // transcript arrives decrypted.
                    assert_ne!(mode, TlsMode::Off);
                    hs.tls_started();
                    continue;
                }
                Ok(Progress::Done(negotiated)) => {
                    assert_eq!(negotiated.export.name, "disk");
                    assert!(!negotiated.base_allocation || negotiated.structured_replies);
                    outcome = 1;
                }
                Ok(Progress::Aborted) => outcome = 2,
                Err(_) => outcome = 3,
            }
            // Finished one way or another: more input is refused.
            assert_eq!(
                hs.receive(b"more", &Catalog),
                Err(HandshakeError::AlreadyFinished)
            );
            break;
        }
        outcomes[outcome] += 1;
    }
    // The damage must reach every way out, or the test proves little.
    assert!(outcomes.iter().all(|n| *n >= 100), "outcomes: {outcomes:?}");
}
