// Generated: `python -m storage.row_codec` (storage.row_codec.codec_fingerprint()); tests/unit/test_row_codec_native.py
// checks it. A change of the models or rules this crate mirrors changes it: review the crate, then regenerate.
pub const FINGERPRINT: &str = "5c3438ae83a684f8f555068f89a298733c7767ca11391c6d06bb1f072ac15def";
