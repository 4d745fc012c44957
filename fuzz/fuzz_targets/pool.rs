//! The pool torture run, every decision (operations, faults, crashes)
//! taken from the fuzzer's bytes (weir::fuzzing::pool_torture).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(why) = weir::fuzzing::pool_torture(data) {
        panic!("{why}");
    }
});
