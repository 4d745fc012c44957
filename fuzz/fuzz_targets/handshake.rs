//! Any bytes, in any chunks, through the handshake in every TLS mode:
//! never a panic, and a finished handshake names an export this client
//! may use (a TLS-only one only after STARTTLS).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_nbd::consts::FLAG_HAS_FLAGS;
use weir_nbd::{
    Access, BlockSize, ExportCatalog, ExportDetails, Handshake, Progress, TlsMode,
};

struct Catalog;

impl ExportCatalog for Catalog {
    fn export(&self, name: &str) -> Option<ExportDetails> {
        let access = match name {
            "" | "disk" => Access::Granted,
            "secret" => Access::TlsRequired,
            "closed" => Access::Refused("no".into()),
            _ => return None,
        };
        Some(ExportDetails {
            name: if name.is_empty() { "disk".into() } else { name.into() },
            description: String::new(),
            size_bytes: 1 << 30,
            transmission_flags: FLAG_HAS_FLAGS,
            block_size: BlockSize { minimum: 1, preferred: 4096, maximum: 32 << 20 },
            access,
        })
    }
    fn list(&self) -> Vec<(String, String)> {
        ["disk", "secret", "closed"].map(|n| (n.to_string(), String::new())).into()
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, mut rest)) = data.split_first() else { return };
    let mode = [TlsMode::Off, TlsMode::On, TlsMode::Require][usize::from(control % 3)];
    let mut machine = Handshake::with_tls(mode);
    let mut chunk = 1 + usize::from(control >> 2);
    while !rest.is_empty() {
        let take = chunk.min(rest.len());
        let result = machine.receive(&rest[..take], &Catalog);
        rest = &rest[take..];
        chunk = chunk * 7 % 251 + 1;
        let _ = machine.take_output();
        match result {
            Ok(Progress::NeedMore) => {}
            Ok(Progress::StartTls) => {
                assert_ne!(mode, TlsMode::Off);
                machine.tls_started();
            }
            Ok(Progress::Done(negotiated)) => {
                assert!(["disk", "secret"].contains(&negotiated.export.name.as_str()));
                assert!(negotiated.export.name != "secret" || machine.tls_active());
                break;
            }
            Ok(Progress::Aborted) | Err(_) => break,
        }
    }
});
