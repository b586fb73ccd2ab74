#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| palisade_agent::fuzzing::policy_file(data));
