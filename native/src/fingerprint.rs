// Generated: `python -m storage.row_codec` (storage.row_codec.codec_fingerprint()); tests/unit/test_row_codec_native.py
// checks it. A change of the models or rules this crate mirrors changes it: review the crate, then regenerate.
pub const FINGERPRINT: &str = "7d013b8787ad2a133de1fbdaeed42ed5510ebbe4795920c461d9772851902e97";
