//! `schemas/canonical.py`'s `canonical_content`, on a conservative subset: is a stored `content` text exactly
//! what the models would write?
//!
//! The text is parsed once into a tree of slices of itself; it is canonical when it is in pydantic-core's
//! compact form (no whitespace, no duplicate keys, only the escapes it writes, integers as written) and the
//! structure passes the same model tables as the Python module (declared fields first, in declaration
//! order, then unknown keys; required fields present; field types). Not sure (a float, an integer of more
//! than 18 digits, deeper than MAX_DEPTH, more than MAX_VALUES values) answers false: the reference decides.

/// A JSON value, strings kept in their (canonical, so one-to-one) escaped form.
enum Json<'a> {
    Null,
    Bool,
    Int(&'a [u8]),
    Str(&'a [u8]),
    Array(Vec<Json<'a>>),
    Object(Vec<(&'a [u8], Json<'a>)>),
}

const MAX_DEPTH: usize = 64;

/// The most values (keys' values and array items, at every depth) one content may hold before this check
/// declines (not sure: the reference decides). Every step here is linear or n·log n in the content, so
/// this bounds the work per row whatever its shape (issue 31: a 60,000-key object cost 3-5 s when the
/// duplicate check was quadratic).
pub const MAX_VALUES: usize = 1 << 18;

/// Objects up to this many keys are checked for duplicates pairwise; larger ones by sorting their keys.
const PAIRWISE_KEYS: usize = 16;

struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
    budget: usize, // values still allowed (MAX_VALUES)
}

/// Two equal keys in one object (strings compare escaped: canonical escaping is one-to-one).
fn has_duplicate(items: &[(&[u8], Json<'_>)]) -> bool {
    if items.len() <= PAIRWISE_KEYS {
        return items
            .iter()
            .enumerate()
            .any(|(i, (key, _))| items[..i].iter().any(|(other, _)| other == key));
    }
    let mut keys: Vec<&[u8]> = items.iter().map(|(key, _)| *key).collect();
    keys.sort_unstable();
    keys.windows(2).any(|pair| pair[0] == pair[1])
}

impl<'a> Parser<'a> {
    fn value(&mut self, depth: usize) -> Option<Json<'a>> {
        if depth > MAX_DEPTH || self.budget == 0 {
            return None;
        }
        self.budget -= 1;
        match *self.text.get(self.pos)? {
            b'{' => {
                self.pos += 1;
                let mut items: Vec<(&'a [u8], Json<'a>)> = Vec::new();
                if self.eat(b'}') {
                    return Some(Json::Object(items));
                }
                loop {
                    let key = self.string()?;
                    if !self.eat(b':') {
                        return None;
                    }
                    let value = self.value(depth + 1)?;
                    items.push((key, value));
                    if self.eat(b'}') {
                        if has_duplicate(&items) {
                            return None; // a duplicate: the models keep one
                        }
                        return Some(Json::Object(items));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            b'[' => {
                self.pos += 1;
                let mut items = Vec::new();
                if self.eat(b']') {
                    return Some(Json::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.eat(b']') {
                        return Some(Json::Array(items));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            b'"' => Some(Json::Str(self.string()?)),
            b'n' => self.word(b"null", Json::Null),
            b't' => self.word(b"true", Json::Bool),
            b'f' => self.word(b"false", Json::Bool),
            b'-' | b'0'..=b'9' => self.integer(),
            _ => None,
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        let hit = self.text.get(self.pos) == Some(&byte);
        self.pos += usize::from(hit);
        hit
    }

    fn word(&mut self, word: &[u8], value: Json<'a>) -> Option<Json<'a>> {
        if self.text[self.pos..].starts_with(word) {
            self.pos += word.len();
            Some(value)
        } else {
            None
        }
    }

    /// `-?(0|[1-9][0-9]*)`, not `-0`, at most 18 digits (an i64 for sure); a float: not sure.
    fn integer(&mut self) -> Option<Json<'a>> {
        let start = self.pos;
        self.eat(b'-');
        let digits = self.pos;
        while matches!(self.text.get(self.pos), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        let n = self.pos - digits;
        if n == 0 || n > 18 || (self.text[digits] == b'0' && (n > 1 || digits > start)) {
            return None;
        }
        if matches!(self.text.get(self.pos), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some(Json::Int(&self.text[start..self.pos]))
    }

    /// The string's escaped body, when every escape is the one pydantic-core writes for its character.
    fn string(&mut self) -> Option<&'a [u8]> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.pos;
        loop {
            // eight bytes at a time past the ones that need no look (no quote, backslash or control
            // character): the byte-wise match below decides every other byte, so a skip is only a shortcut
            while let Some(chunk) = self.text.get(self.pos..self.pos + 8) {
                if has_special(u64::from_le_bytes(chunk.try_into().ok()?)) {
                    break;
                }
                self.pos += 8;
            }
            match *self.text.get(self.pos)? {
                b'"' => {
                    self.pos += 1;
                    return Some(&self.text[start..self.pos - 1]);
                }
                0x00..=0x1F => return None, // raw control characters are not JSON
                b'\\' => {
                    match *self.text.get(self.pos + 1)? {
                        b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => self.pos += 2,
                        b'u' => {
                            // only \u00xx (lowercase) of a control character without a short escape
                            let hex = self.text.get(self.pos + 2..self.pos + 6)?;
                            let low = |c: u8| matches!(c, b'0'..=b'9' | b'a'..=b'f');
                            if hex[0] != b'0'
                                || hex[1] != b'0'
                                || !matches!(hex[2], b'0' | b'1')
                                || !low(hex[3])
                            {
                                return None;
                            }
                            if hex[2] == b'0' && matches!(hex[3], b'8' | b'9' | b'a' | b'c' | b'd')
                            {
                                return None; // \b \t \n \f \r have short forms
                            }
                            self.pos += 6;
                        }
                        _ => return None, // `\/` and anything else
                    }
                }
                _ => self.pos += 1,
            }
        }
    }
}

/// True when one of the eight bytes of `word` is `"`, `\\` or below 0x20 (the bytes a JSON string's body
/// must look at). Exact: the zero-byte test `(x - 0x01..) & !x & 0x80..` has no false negative, and a byte
/// of 0x80 or above (UTF-8) is never counted.
#[inline]
fn has_special(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let quote = zero(word ^ (ONES * u64::from(b'"')));
    let backslash = zero(word ^ (ONES * u64::from(b'\\')));
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    (quote | backslash | control) != 0
}

/// A field check of the model tables (schemas/canonical.py's `Check`s).
#[derive(Clone, Copy)]
enum Check {
    Any,
    Str,
    OptStr,
    ListOfDicts,
    OptListOfDicts,
    OptList,
    OptDict,
    Format2,
    ToolState,
    Model(&'static [Field]),
}

/// (name, check, required), in declaration order.
type Field = (&'static str, Check, bool);

const TOOL_STATES: [&str; 7] = [
    "partial-call",
    "call",
    "result",
    "approval-requested",
    "approval-responded",
    "output-error",
    "output-denied",
];

const TOOL_INVOCATION: &[Field] = &[
    ("state", Check::ToolState, true),
    ("toolCallId", Check::Str, true),
    ("toolName", Check::Str, true),
    ("args", Check::Any, false),
    ("result", Check::Any, false),
];
const SOURCE_INFO: &[Field] = &[
    ("sourceType", Check::Str, true),
    ("id", Check::Str, true),
    ("url", Check::OptStr, false),
];
const ERROR_INFO: &[Field] = &[
    ("name", Check::OptStr, false),
    ("message", Check::Str, true),
];

const TYPE: Field = ("type", Check::Str, true);
const PARTS: [(&str, &[Field]); 8] = [
    ("text", &[TYPE, ("text", Check::Str, true)]),
    (
        "reasoning",
        &[
            TYPE,
            ("reasoning", Check::Str, false),
            ("details", Check::ListOfDicts, false),
        ],
    ),
    (
        "tool-invocation",
        &[
            TYPE,
            ("toolInvocation", Check::Model(TOOL_INVOCATION), true),
        ],
    ),
    (
        "source",
        &[TYPE, ("source", Check::Model(SOURCE_INFO), true)],
    ),
    (
        "source-document",
        &[
            TYPE,
            ("sourceId", Check::Str, true),
            ("mediaType", Check::Str, true),
            ("title", Check::Str, true),
        ],
    ),
    (
        "file",
        &[
            TYPE,
            ("mimeType", Check::Str, true),
            ("data", Check::Str, true),
        ],
    ),
    ("step-start", &[TYPE]),
    ("error", &[TYPE, ("error", Check::Model(ERROR_INFO), true)]),
];
const DATA_PART: &[Field] = &[TYPE, ("data", Check::Any, false)];
const UNKNOWN_PART: &[Field] = &[TYPE];

const CONTENT: &[Field] = &[
    ("format", Check::Format2, true), // the models always write it
    ("parts", Check::Any, true),      // checked part by part in `content_ok`
    ("content", Check::OptStr, false),
    ("toolInvocations", Check::OptListOfDicts, false),
    ("reasoning", Check::OptStr, false),
    ("annotations", Check::OptList, false),
    ("experimental_attachments", Check::OptListOfDicts, false),
    ("metadata", Check::OptDict, false),
    ("providerMetadata", Check::OptDict, false),
];

fn is_dict(v: &Json<'_>) -> bool {
    matches!(v, Json::Object(_))
}

fn check(c: Check, v: &Json<'_>) -> bool {
    match c {
        Check::Any => true,
        Check::Str => matches!(v, Json::Str(_)),
        Check::OptStr => matches!(v, Json::Null | Json::Str(_)),
        Check::ListOfDicts => matches!(v, Json::Array(items) if items.iter().all(is_dict)),
        Check::OptListOfDicts => matches!(v, Json::Null) || check(Check::ListOfDicts, v),
        Check::OptList => matches!(v, Json::Null | Json::Array(_)),
        Check::OptDict => matches!(v, Json::Null | Json::Object(_)),
        Check::Format2 => matches!(v, Json::Int(b"2")),
        // strings compare escaped: a known name has no escape, so equal bodies are equal strings
        Check::ToolState => {
            matches!(v, Json::Str(s) if TOOL_STATES.iter().any(|t| t.as_bytes() == *s))
        }
        Check::Model(fields) => model(fields, v),
    }
}

/// `_model(fields)`: declared keys in declaration order, unknown keys after them, required ones present.
fn model(fields: &[Field], v: &Json<'_>) -> bool {
    let Json::Object(items) = v else { return false };
    let mut last: Option<usize> = None;
    let mut in_extras = false;
    let mut seen = 0usize; // required fields present
    for (key, value) in items {
        let Some(position) = fields
            .iter()
            .position(|(name, _, _)| name.as_bytes() == *key)
        else {
            in_extras = true;
            continue;
        };
        if in_extras || last.is_some_and(|l| position < l) {
            return false;
        }
        last = Some(position);
        let (_, field_check, required) = fields[position];
        seen += usize::from(required);
        if !check(field_check, value) {
            return false;
        }
    }
    seen == fields.iter().filter(|(_, _, required)| *required).count()
}

/// `_part`: a known part by its model, a `data-…` part (the `^data-.+` pattern), or an unknown part.
fn part(v: &Json<'_>) -> bool {
    let Json::Object(items) = v else { return false };
    let Some((_, Json::Str(kind))) = items.iter().find(|(k, _)| *k == b"type") else {
        return false;
    };
    if let Some((_, fields)) = PARTS.iter().find(|(name, _)| name.as_bytes() == *kind) {
        return model(fields, v);
    }
    if let Some(rest) = kind.strip_prefix(b"data-") {
        // `.+` needs one character that is not a newline right after the prefix
        return !rest.is_empty() && !rest.starts_with(b"\\n") && model(DATA_PART, v);
    }
    model(UNKNOWN_PART, v)
}

fn content_ok(v: &Json<'_>) -> bool {
    if !model(CONTENT, v) {
        return false;
    }
    let Json::Object(items) = v else { return false };
    items
        .iter()
        .find(|(k, _)| *k == b"parts")
        .is_some_and(|(_, parts)| matches!(parts, Json::Array(list) if list.iter().all(part)))
}

/// True when `text` is surely `MessageContent`'s own compact dump (`canonical_content` answers it).
pub fn canonical(text: &[u8]) -> bool {
    let mut parser = Parser {
        text,
        pos: 0,
        budget: MAX_VALUES,
    };
    match parser.value(0) {
        Some(value) => parser.pos == text.len() && content_ok(&value),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::has_special;

    fn special_bytewise(word: u64) -> bool {
        word.to_le_bytes()
            .iter()
            .any(|&b| b == b'"' || b == b'\\' || b < 0x20)
    }

    #[test]
    fn has_special_is_the_bytewise_test_for_every_byte_at_every_place() {
        // fillers: plain ASCII, the neighbours of each special byte, and UTF-8 bytes
        for filler in [b'a', b' ', b'!', b'#', b'[', b']', 0x7F, 0x80, 0xC3, 0xFF] {
            for place in 0..8 {
                for byte in 0..=255u8 {
                    let mut bytes = [filler; 8];
                    bytes[place] = byte;
                    let word = u64::from_le_bytes(bytes);
                    assert_eq!(has_special(word), special_bytewise(word), "{bytes:?}");
                }
            }
        }
    }

    #[test]
    fn has_special_is_the_bytewise_test_on_many_mixed_words() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2_000_000 {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let word = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
            assert_eq!(has_special(word), special_bytewise(word), "{word:#018x}");
        }
    }
}
