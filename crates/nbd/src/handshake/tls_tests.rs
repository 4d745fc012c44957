//! STARTTLS and per-export access, in both TLS modes.

use super::tests::{go_data, meta_data, option};
use super::*;

/// "open" anyone may use, "secret" only over TLS, "closed" no one.
struct Guarded;

impl ExportCatalog for Guarded {
    fn export(&self, name: &str) -> Option<ExportDetails> {
        let access = match name {
            "open" => Access::Granted,
            "secret" => Access::TlsRequired,
            "closed" => Access::Refused("not on the allow list".into()),
            _ => return None,
        };
        Some(ExportDetails {
            name: name.into(),
            description: String::new(),
            size_bytes: 1 << 20,
            transmission_flags: FLAG_HAS_FLAGS,
            block_size: BlockSize {
                minimum: 1,
                preferred: 4096,
                maximum: 1 << 20,
            },
            access,
        })
    }
    fn list(&self) -> Vec<(String, String)> {
        ["open", "secret", "closed"]
            .map(|name| (name.to_string(), String::new()))
            .into()
    }
}

fn started(mode: TlsMode) -> Handshake {
    let mut hs = Handshake::with_tls(mode);
    hs.take_output();
    let flags = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
    assert_eq!(
        hs.receive(&flags.to_be_bytes(), &Guarded),
        Ok(Progress::NeedMore)
    );
    hs
}

/// `(option, reply kind)` of every reply queued, and the listed names.
fn replies(hs: &mut Handshake) -> (Vec<(u32, u32)>, Vec<String>) {
    let out = hs.take_output();
    let mut bytes = &out[..];
    let (mut kinds, mut names) = (Vec::new(), Vec::new());
    while !bytes.is_empty() {
        let mut cursor = crate::wire::Cursor::new(bytes);
        assert_eq!(cursor.u64(), Some(OPTION_REPLY_MAGIC));
        let (option, kind) = (cursor.u32().unwrap(), cursor.u32().unwrap());
        let len = cursor.u32().unwrap() as usize;
        if kind == REP_SERVER {
            let name = cursor.string_u32().unwrap();
            names.push(String::from_utf8(name.to_vec()).unwrap());
        }
        kinds.push((option, kind));
        bytes = &bytes[20 + len..];
    }
    (kinds, names)
}

fn start_tls(hs: &mut Handshake) {
    assert_eq!(
        hs.receive(&option(OPT_STARTTLS, &[]), &Guarded),
        Ok(Progress::StartTls)
    );
    assert_eq!(replies(hs).0, vec![(OPT_STARTTLS, REP_ACK)]);
    hs.tls_started();
}

#[test]
fn with_tls_off_starttls_is_unsupported_and_the_session_goes_on() {
    let mut hs = started(TlsMode::Off);
    hs.receive(&option(OPT_STARTTLS, &[]), &Guarded).unwrap();
    assert_eq!(replies(&mut hs).0, vec![(OPT_STARTTLS, REP_ERR_UNSUP)]);
    assert!(matches!(
        hs.receive(&option(OPT_GO, &go_data("open", &[])), &Guarded),
        Ok(Progress::Done(_))
    ));
}

#[test]
fn required_tls_refuses_every_option_but_starttls_and_abort() {
    let mut hs = started(TlsMode::Require);
    for (kind, data) in [
        (OPT_LIST, vec![]),
        (OPT_STRUCTURED_REPLY, vec![]),
        (OPT_INFO, go_data("open", &[])),
        (OPT_GO, go_data("open", &[])),
        (OPT_LIST_META_CONTEXT, meta_data("open", &[])),
        (0x4242, vec![]),
    ] {
        assert_eq!(
            hs.receive(&option(kind, &data), &Guarded),
            Ok(Progress::NeedMore)
        );
        assert_eq!(replies(&mut hs).0, vec![(kind, REP_ERR_TLS_REQD)]);
    }
    assert!(matches!(
        hs.receive(&option(OPT_EXPORT_NAME, b"open"), &Guarded),
        Err(HandshakeError::ExportNameRefused(_))
    ));
    let mut hs = started(TlsMode::Require);
    assert_eq!(
        hs.receive(&option(OPT_ABORT, &[]), &Guarded),
        Ok(Progress::Aborted)
    );
}

#[test]
fn after_starttls_options_work_and_a_second_starttls_is_invalid() {
    let mut hs = started(TlsMode::Require);
    start_tls(&mut hs);
    hs.receive(&option(OPT_STARTTLS, &[]), &Guarded).unwrap();
    assert_eq!(replies(&mut hs).0, vec![(OPT_STARTTLS, REP_ERR_INVALID)]);
    hs.receive(&option(OPT_LIST, &[]), &Guarded).unwrap();
    let (_, names) = replies(&mut hs);
    assert_eq!(names, ["open", "secret"]);
    assert!(matches!(
        hs.receive(&option(OPT_GO, &go_data("secret", &[])), &Guarded),
        Ok(Progress::Done(_))
    ));
}

#[test]
fn starttls_with_data_is_invalid() {
    let mut hs = started(TlsMode::On);
    hs.receive(&option(OPT_STARTTLS, b"x"), &Guarded).unwrap();
    assert_eq!(replies(&mut hs).0, vec![(OPT_STARTTLS, REP_ERR_INVALID)]);
}

#[test]
fn plaintext_sent_behind_starttls_is_refused_not_carried_into_tls() {
    let mut hs = started(TlsMode::On);
    let mut bytes = option(OPT_STARTTLS, &[]);
    bytes.extend(option(OPT_STRUCTURED_REPLY, &[]));
    assert_eq!(
        hs.receive(&bytes, &Guarded),
        Err(HandshakeError::DataAfterStartTls(16))
    );
}

#[test]
fn options_negotiated_before_tls_are_forgotten() {
    let mut hs = started(TlsMode::On);
    hs.receive(&option(OPT_STRUCTURED_REPLY, &[]), &Guarded)
        .unwrap();
    hs.receive(
        &option(OPT_SET_META_CONTEXT, &meta_data("open", &[BASE_ALLOCATION])),
        &Guarded,
    )
    .unwrap();
    hs.take_output();
    start_tls(&mut hs);
    match hs.receive(&option(OPT_GO, &go_data("open", &[])), &Guarded) {
        Ok(Progress::Done(negotiated)) => {
            assert!(!negotiated.structured_replies);
            assert!(!negotiated.base_allocation);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn selective_tls_guards_only_tls_only_exports() {
    let mut hs = started(TlsMode::On);
    hs.receive(&option(OPT_LIST, &[]), &Guarded).unwrap();
    assert_eq!(replies(&mut hs).1, ["open"]);
    hs.receive(&option(OPT_INFO, &go_data("secret", &[])), &Guarded)
        .unwrap();
    assert_eq!(replies(&mut hs).0, vec![(OPT_INFO, REP_ERR_TLS_REQD)]);
    hs.receive(&option(OPT_INFO, &go_data("open", &[])), &Guarded)
        .unwrap();
    assert_eq!(replies(&mut hs).0.last(), Some(&(OPT_INFO, REP_ACK)));
    assert!(matches!(
        hs.receive(&option(OPT_EXPORT_NAME, b"secret"), &Guarded),
        Err(HandshakeError::ExportNameRefused(_))
    ));
}

#[test]
fn refused_exports_get_err_policy_with_the_reason_in_any_mode() {
    for mode in [TlsMode::Off, TlsMode::On] {
        let mut hs = started(mode);
        for kind in [OPT_INFO, OPT_GO] {
            hs.receive(&option(kind, &go_data("closed", &[])), &Guarded)
                .unwrap();
            assert_eq!(replies(&mut hs).0, vec![(kind, REP_ERR_POLICY)]);
        }
        hs.receive(&option(OPT_STRUCTURED_REPLY, &[]), &Guarded)
            .unwrap();
        hs.take_output();
        hs.receive(
            &option(OPT_SET_META_CONTEXT, &meta_data("closed", &[])),
            &Guarded,
        )
        .unwrap();
        assert_eq!(
            replies(&mut hs).0,
            vec![(OPT_SET_META_CONTEXT, REP_ERR_POLICY)]
        );
        assert!(matches!(
            hs.receive(&option(OPT_EXPORT_NAME, b"closed"), &Guarded),
            Err(HandshakeError::ExportNameRefused(_))
        ));
    }
}
