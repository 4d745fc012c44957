use super::*;

struct TwoExports;

fn details(name: &str, size_bytes: u64) -> ExportDetails {
    ExportDetails {
        name: name.to_string(),
        description: format!("{name} volume"),
        size_bytes,
        transmission_flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH,
        block_size: BlockSize {
            minimum: 1,
            preferred: 4096,
            maximum: 32 << 20,
        },
        access: Access::Granted,
    }
}

impl ExportCatalog for TwoExports {
    fn export(&self, name: &str) -> Option<ExportDetails> {
        match name {
            "" | "a" => Some(details("a", 1 << 20)),
            "b" => Some(details("b", 2 << 20)),
            _ => None,
        }
    }
    fn list(&self) -> Vec<(String, String)> {
        vec![
            ("a".into(), "a volume".into()),
            ("b".into(), "b volume".into()),
        ]
    }
}

pub(super) fn option(kind: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_u64(&mut out, IHAVEOPT);
    put_u32(&mut out, kind);
    put_u32(&mut out, data.len() as u32);
    out.extend_from_slice(data);
    out
}

pub(super) fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut out = Vec::new();
    put_u32(&mut out, name.len() as u32);
    out.extend_from_slice(name.as_bytes());
    put_u16(&mut out, infos.len() as u16);
    for info in infos {
        put_u16(&mut out, *info);
    }
    out
}

pub(super) fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    put_u32(&mut out, name.len() as u32);
    out.extend_from_slice(name.as_bytes());
    put_u32(&mut out, queries.len() as u32);
    for query in queries {
        put_u32(&mut out, query.len() as u32);
        out.extend_from_slice(query.as_bytes());
    }
    out
}

/// One option reply as the client would parse it.
#[derive(Debug)]
struct Reply {
    option: u32,
    kind: u32,
    payload: Vec<u8>,
}

fn parse_replies(mut bytes: &[u8]) -> Vec<Reply> {
    let mut replies = Vec::new();
    while !bytes.is_empty() {
        let mut cursor = Cursor::new(bytes);
        assert_eq!(cursor.u64(), Some(OPTION_REPLY_MAGIC));
        let option = cursor.u32().unwrap();
        let kind = cursor.u32().unwrap();
        let len = cursor.u32().unwrap() as usize;
        let payload = cursor.take(len).unwrap().to_vec();
        bytes = &bytes[20 + len..];
        replies.push(Reply {
            option,
            kind,
            payload,
        });
    }
    replies
}

/// A handshake past the greeting and client flags.
fn started(client_flags: u32) -> Handshake {
    let mut hs = Handshake::new();
    let greeting = hs.take_output();
    assert_eq!(greeting.len(), 18);
    assert_eq!(
        &greeting[16..18],
        &(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes()
    );
    assert_eq!(
        hs.receive(&client_flags.to_be_bytes(), &TwoExports),
        Ok(Progress::NeedMore)
    );
    hs
}

#[test]
fn unknown_client_flags_disconnect() {
    let mut hs = Handshake::new();
    let result = hs.receive(&0x80u32.to_be_bytes(), &TwoExports);
    assert_eq!(result, Err(HandshakeError::UnknownClientFlags(0x80)));
}

#[test]
fn wrong_option_magic_disconnects() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let mut bytes = option(OPT_LIST, &[]);
    bytes[0] = b'X';
    assert!(matches!(
        hs.receive(&bytes, &TwoExports),
        Err(HandshakeError::BadOptionMagic(_))
    ));
}

#[test]
fn input_arriving_one_byte_at_a_time_is_reassembled() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let bytes = option(OPT_GO, &go_data("b", &[]));
    let (last, head) = bytes.split_last().unwrap();
    for byte in head {
        assert_eq!(hs.receive(&[*byte], &TwoExports), Ok(Progress::NeedMore));
    }
    match hs.receive(&[*last], &TwoExports) {
        Ok(Progress::Done(negotiated)) => assert_eq!(negotiated.export.name, "b"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn list_returns_every_export_then_ack() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(
        hs.receive(&option(OPT_LIST, &[]), &TwoExports),
        Ok(Progress::NeedMore)
    );
    let replies = parse_replies(&hs.take_output());
    let kinds: Vec<u32> = replies.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![REP_SERVER, REP_SERVER, REP_ACK]);
    assert_eq!(&replies[1].payload[..], b"\0\0\0\x01bb volume");
}

#[test]
fn unknown_option_is_unsup_not_a_disconnect() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(
        hs.receive(&option(0x4242, b"junk"), &TwoExports),
        Ok(Progress::NeedMore)
    );
    let replies = parse_replies(&hs.take_output());
    assert_eq!(replies[0].option, 0x4242);
    assert_eq!(replies[0].kind, REP_ERR_UNSUP);
    // The session carries on.
    assert!(matches!(
        hs.receive(&option(OPT_GO, &go_data("a", &[])), &TwoExports),
        Ok(Progress::Done(_))
    ));
}

#[test]
fn go_with_lying_name_length_is_invalid() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let mut data = go_data("a", &[]);
    data[3] = 200; // the name claims 200 bytes but the option holds 1
    assert_eq!(
        hs.receive(&option(OPT_GO, &data), &TwoExports),
        Ok(Progress::NeedMore)
    );
    assert_eq!(parse_replies(&hs.take_output())[0].kind, REP_ERR_INVALID);
}

#[test]
fn go_with_trailing_garbage_is_invalid() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let mut data = go_data("a", &[]);
    data.push(0);
    hs.receive(&option(OPT_GO, &data), &TwoExports).unwrap();
    assert_eq!(parse_replies(&hs.take_output())[0].kind, REP_ERR_INVALID);
}

#[test]
fn go_for_unknown_export_is_err_unknown() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    hs.receive(&option(OPT_GO, &go_data("nope", &[])), &TwoExports)
        .unwrap();
    assert_eq!(parse_replies(&hs.take_output())[0].kind, REP_ERR_UNKNOWN);
}

#[test]
fn info_reports_requested_items_and_export() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let data = go_data("", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE, 99]);
    assert_eq!(
        hs.receive(&option(OPT_INFO, &data), &TwoExports),
        Ok(Progress::NeedMore)
    );
    let replies = parse_replies(&hs.take_output());
    let kinds: Vec<u32> = replies.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![REP_INFO, REP_INFO, REP_INFO, REP_INFO, REP_ACK]);
    assert_eq!(
        &replies[0].payload[2..],
        b"a",
        "the default export resolves to its name"
    );
    assert_eq!(&replies[1].payload[2..], b"a volume");
    assert_eq!(
        &replies[2].payload,
        &[0, 3, 0, 0, 0, 1, 0, 0, 16, 0, 2, 0, 0, 0]
    );
    let mut export = Cursor::new(&replies[3].payload);
    assert_eq!(export.u16(), Some(INFO_EXPORT));
    assert_eq!(export.u64(), Some(1 << 20));
}

#[test]
fn export_name_without_no_zeroes_sends_padding() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let progress = hs
        .receive(&option(OPT_EXPORT_NAME, b"b"), &TwoExports)
        .unwrap();
    assert!(matches!(progress, Progress::Done(_)));
    assert_eq!(hs.take_output().len(), 8 + 2 + 124);
}

#[test]
fn export_name_with_no_zeroes_skips_padding() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    hs.receive(&option(OPT_EXPORT_NAME, b"b"), &TwoExports)
        .unwrap();
    assert_eq!(hs.take_output().len(), 8 + 2);
}

#[test]
fn export_name_for_unknown_export_disconnects() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let result = hs.receive(&option(OPT_EXPORT_NAME, b"zz"), &TwoExports);
    assert_eq!(result, Err(HandshakeError::UnknownExport("zz".into())));
}

#[test]
fn abort_is_acked() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(
        hs.receive(&option(OPT_ABORT, &[]), &TwoExports),
        Ok(Progress::Aborted)
    );
    assert_eq!(parse_replies(&hs.take_output())[0].kind, REP_ACK);
    assert_eq!(
        hs.receive(&[0], &TwoExports),
        Err(HandshakeError::AlreadyFinished)
    );
}

#[test]
fn oversize_option_is_refused_without_reading_it() {
    for length in [OPTION_DATA_BYTES_MAX + 1, i32::MAX as u32] {
        let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
        let mut header = Vec::new();
        put_u64(&mut header, IHAVEOPT);
        put_u32(&mut header, OPT_LIST);
        put_u32(&mut header, length);
        assert_eq!(
            hs.receive(&header, &TwoExports),
            Err(HandshakeError::OptionTooLarge {
                option: OPT_LIST,
                length
            })
        );
        assert_eq!(parse_replies(&hs.take_output())[0].kind, REP_ERR_TOO_BIG);
    }
}

#[test]
fn an_option_at_the_limit_is_read() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let body = vec![0u8; OPTION_DATA_BYTES_MAX as usize];
    assert_eq!(
        hs.receive(&option(0x77, &body), &TwoExports),
        Ok(Progress::NeedMore)
    );
    assert_eq!(parse_replies(&hs.take_output())[0].kind, REP_ERR_UNSUP);
}

#[test]
fn oversize_export_name_disconnects() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let mut header = Vec::new();
    put_u64(&mut header, IHAVEOPT);
    put_u32(&mut header, OPT_EXPORT_NAME);
    put_u32(&mut header, u32::MAX);
    assert_eq!(
        hs.receive(&header, &TwoExports),
        Err(HandshakeError::ExportNameTooLong(u32::MAX))
    );
}

#[test]
fn set_meta_context_needs_structured_replies() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    hs.receive(
        &option(OPT_SET_META_CONTEXT, &meta_data("a", &[BASE_ALLOCATION])),
        &TwoExports,
    )
    .unwrap();
    assert_eq!(parse_replies(&hs.take_output())[0].kind, REP_ERR_INVALID);
}

#[test]
fn base_allocation_is_negotiated_for_the_chosen_export() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    hs.receive(&option(OPT_STRUCTURED_REPLY, &[]), &TwoExports)
        .unwrap();
    let query = meta_data("a", &["qemu:dirty-bitmap:x", BASE_ALLOCATION]);
    hs.receive(&option(OPT_SET_META_CONTEXT, &query), &TwoExports)
        .unwrap();
    let replies = parse_replies(&hs.take_output());
    let kinds: Vec<u32> = replies.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, vec![REP_ACK, REP_META_CONTEXT, REP_ACK]);
    assert_eq!(&replies[1].payload[4..], BASE_ALLOCATION.as_bytes());
    match hs.receive(&option(OPT_GO, &go_data("", &[])), &TwoExports) {
        Ok(Progress::Done(n)) => assert!(n.structured_replies && n.base_allocation),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn contexts_set_for_another_export_do_not_carry_over() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    hs.receive(&option(OPT_STRUCTURED_REPLY, &[]), &TwoExports)
        .unwrap();
    hs.receive(
        &option(OPT_SET_META_CONTEXT, &meta_data("a", &[BASE_ALLOCATION])),
        &TwoExports,
    )
    .unwrap();
    match hs.receive(&option(OPT_GO, &go_data("b", &[])), &TwoExports) {
        Ok(Progress::Done(n)) => assert!(!n.base_allocation),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn list_meta_context_with_no_queries_lists_everything() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    hs.receive(
        &option(OPT_LIST_META_CONTEXT, &meta_data("a", &[])),
        &TwoExports,
    )
    .unwrap();
    let kinds: Vec<u32> = parse_replies(&hs.take_output())
        .iter()
        .map(|r| r.kind)
        .collect();
    assert_eq!(kinds, vec![REP_META_CONTEXT, REP_ACK]);
}

#[test]
fn meta_context_with_lying_query_count_is_invalid() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    hs.receive(&option(OPT_STRUCTURED_REPLY, &[]), &TwoExports)
        .unwrap();
    let mut data = meta_data("a", &[]);
    data[5..9].copy_from_slice(&u32::MAX.to_be_bytes());
    hs.receive(&option(OPT_SET_META_CONTEXT, &data), &TwoExports)
        .unwrap();
    assert_eq!(
        parse_replies(&hs.take_output()).last().unwrap().kind,
        REP_ERR_INVALID
    );
}

#[test]
fn bytes_after_go_are_handed_to_transmission() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let mut bytes = option(OPT_GO, &go_data("a", &[]));
    bytes.extend_from_slice(b"early");
    match hs.receive(&bytes, &TwoExports) {
        Ok(Progress::Done(n)) => assert_eq!(n.leftover, b"early"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn too_many_options_disconnect() {
    let mut hs = started(FLAG_C_FIXED_NEWSTYLE);
    let one = option(0x4242, &[]);
    let mut result = Ok(Progress::NeedMore);
    for _ in 0..=OPTIONS_MAX {
        result = hs.receive(&one, &TwoExports);
        let _ = hs.take_output();
        if result.is_err() {
            break;
        }
    }
    assert_eq!(result, Err(HandshakeError::TooManyOptions));
}
