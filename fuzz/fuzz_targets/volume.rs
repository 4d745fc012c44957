//! NBD operations of any alignment on a volume against a byte model
//! (weir::fuzzing::volume_against_model).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(why) = weir::fuzzing::volume_against_model(data) {
        panic!("{why}");
    }
});
