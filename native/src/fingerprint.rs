// Generated: `python -m storage.row_codec` (storage.row_codec.codec_fingerprint()); tests/unit/test_row_codec_native.py
// checks it. A change of the models or rules this crate mirrors changes it: review the crate, then regenerate.
pub const FINGERPRINT: &str = "3781d2d59f98f0abdebd7ce60bb52c263293ff1d2338c66cc8659d1328c1736f";
