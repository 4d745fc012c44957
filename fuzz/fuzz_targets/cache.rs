//! The write-back cache torture run, steered by the fuzzer's bytes
//! (weir::fuzzing::cache_torture).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(why) = weir::fuzzing::cache_torture(data) {
        panic!("{why}");
    }
});
