use super::*;

fn mirror_label(device: u128, generation: u64) -> Label {
    Label {
        pool_id: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
        pool_name: "tank".into(),
        device_id: device,
        generation,
        device_bytes: 1 << 30,
        block_bytes: 4096,
        layout: Layout {
            groups: vec![vec![11, 12], vec![21, 22]],
        },
        resilvering: false,
    }
}

#[test]
fn labels_round_trip() {
    let label = mirror_label(21, 7);
    let bytes = label.encode(None).unwrap();
    assert_eq!(bytes.len(), LABEL_BYTES);
    assert_eq!(Label::decode(&bytes).unwrap(), label);
    assert_eq!(label.layout.place_of(21), Some((1, 0)));
}

#[test]
fn the_resilvering_flag_round_trips_and_unknown_flags_are_refused() {
    let mut label = mirror_label(12, 3);
    label.resilvering = true;
    let mut bytes = label.encode(None).unwrap();
    assert_eq!(Label::decode(&bytes).unwrap(), label);
    bytes[137] |= 0x80;
    let crc = crc32c::crc32c(&bytes[..LABEL_BYTES - 4]);
    bytes[LABEL_BYTES - 4..].copy_from_slice(&crc.to_be_bytes());
    assert!(matches!(Label::decode(&bytes), Err(LabelError::Layout(_))));
}

#[test]
fn one_flipped_bit_makes_a_label_corrupt() {
    let mut bytes = mirror_label(11, 1).encode(None).unwrap();
    bytes[100] ^= 0x04;
    assert_eq!(Label::decode(&bytes), Err(LabelError::Corrupt));
    assert_eq!(
        Label::decode(&[0u8; LABEL_BYTES]),
        Err(LabelError::NotALabel)
    );
    assert_eq!(Label::decode(&bytes[..100]), Err(LabelError::NotALabel));
}

#[test]
fn impossible_layouts_are_refused() {
    let mut label = mirror_label(11, 1);
    label.layout.groups = vec![vec![11, 12], vec![21]];
    assert!(matches!(label.encode(None), Err(LabelError::Layout(_))));
    label.layout.groups = vec![vec![11, 11]];
    assert!(matches!(label.encode(None), Err(LabelError::Layout(why)) if why.contains("twice")));
    label.layout.groups = vec![vec![12, 13]];
    assert!(
        matches!(label.encode(None), Err(LabelError::Layout(why)) if why.contains("own layout"))
    );
    label.layout.groups = vec![vec![11]];
    label.pool_name = "x".repeat(65);
    assert!(label.encode(None).is_err());
}

#[test]
fn the_newer_valid_copy_wins_and_the_other_is_stale() {
    let old = mirror_label(12, 3);
    let new = mirror_label(12, 4);
    let chosen = choose([Ok(old.clone()), Ok(new.clone())]).unwrap();
    assert_eq!(chosen.label, new);
    assert_eq!(chosen.stale, vec![0]);
    let chosen = choose([Err(LabelError::Corrupt), Ok(old.clone())]).unwrap();
    assert_eq!(chosen.label, old);
    assert_eq!(chosen.stale, vec![0]);
    let chosen = choose([Ok(new.clone()), Ok(new.clone())]).unwrap();
    assert!(chosen.stale.is_empty());
    assert_eq!(
        choose([Err(LabelError::NotALabel), Err(LabelError::NotALabel)]),
        Err(LabelError::NotALabel)
    );
    assert_eq!(
        choose([Err(LabelError::NotALabel), Err(LabelError::Corrupt)]),
        Err(LabelError::Corrupt)
    );
}

#[test]
fn copies_sit_at_both_ends() {
    assert_eq!(label_offsets(1 << 30), [0, (1 << 30) - 4096]);
    assert_eq!(label_offsets(10_000), [0, 4096]);
}

#[test]
fn a_holder_stamp_rides_beside_the_largest_layout_without_touching_it() {
    let ids: Vec<u128> = (1..=MEMBERS_MAX as u128).collect();
    let label = Label {
        device_id: 1,
        layout: Layout {
            groups: ids.chunks(2).map(<[u128]>::to_vec).collect(),
        },
        ..mirror_label(11, 2)
    };
    let holder = crate::pool::holder::Holder {
        machine_id: u128::MAX,
        boot_id: u128::MAX,
        pid_namespace: u64::MAX,
        pid: u32::MAX,
        interval_ms: 5000,
        beat: u64::MAX,
        host: "h".repeat(80),
    };
    let bytes = label.encode(Some(&holder)).unwrap();
    assert_eq!(Label::decode(&bytes).unwrap(), label);
    let stamp = decode_holder(&bytes).expect("stamped");
    assert_eq!(stamp.beat, u64::MAX);
    assert!(stamp.same_holder(&holder));
    let bare = label.encode(None).unwrap();
    assert_eq!(decode_holder(&bare), None);
    assert_eq!(Label::decode(&bare).unwrap(), label);
}
