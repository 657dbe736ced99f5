//! One `mastra_messages` document (BSON) as a row: the checks of `row_from_doc`, the bytes of `recalled_row`.

use crate::canonical::canonical;

pub struct Row<'a> {
    pub id: &'a str,
    pub thread_id: &'a str,
    pub resource_id: &'a str,
    pub role: &'a str,
    pub ms: i64,
    pub kind: Option<&'a str>,
    pub content: &'a str,
}

const ROLES: [&str; 4] = ["user", "assistant", "system", "signal"]; // schemas.messages.Role

/// What a Python `datetime` holds: 0001-01-01T00:00:00.000Z ..= 9999-12-31T23:59:59.999Z (outside it the
/// driver cannot decode the document).
const MIN_MS: i64 = -62_135_596_800_000;
const MAX_MS: i64 = 253_402_300_799_999;

fn le_i32(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn le_i64(b: &[u8], at: usize) -> Option<i64> {
    Some(i64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The fields `row_from_doc` reads, when the document is exactly the plain shape; None otherwise.
pub fn parse(doc: &[u8]) -> Option<Row<'_>> {
    let len = usize::try_from(le_i32(doc, 0)?).ok()?;
    if len != doc.len() || len < 5 || doc[len - 1] != 0 {
        return None;
    }
    let end = len - 1; // the document's terminator
    let (mut id, mut thread_id, mut resource_id, mut role, mut content) =
        (None, None, None, None, None);
    let mut ms: Option<i64> = None;
    let mut kind: Option<Option<&str>> = None;
    let mut extra = false;
    let mut pos = 4;
    while pos < end {
        let tag = doc[pos];
        let name_end = pos + 1 + doc[pos + 1..end].iter().position(|&b| b == 0)?;
        let name = &doc[pos + 1..name_end];
        pos = name_end + 1;
        // The value: only the types a plain row has (anything else: not sure)
        enum Value<'a> {
            Str(&'a str),
            Date(i64),
            Null,
        }
        let value = match tag {
            0x02 => {
                let n = usize::try_from(le_i32(doc, pos)?).ok()?;
                let start = pos + 4;
                let stop = start.checked_add(n)?;
                if n < 1 || stop > end || doc[stop - 1] != 0 {
                    return None;
                }
                pos = stop;
                Value::Str(std::str::from_utf8(&doc[start..stop - 1]).ok()?)
            }
            0x09 => {
                let v = le_i64(doc, pos)?;
                pos += 8;
                Value::Date(v)
            }
            0x0A => Value::Null,
            _ => return None,
        };
        if pos > end {
            return None;
        }
        let fresh = match (name, value) {
            (b"id", Value::Str(s)) => id.replace(s).is_none(),
            (b"thread_id", Value::Str(s)) => thread_id.replace(s).is_none(),
            (b"resourceId", Value::Str(s)) => resource_id.replace(s).is_none(),
            (b"role", Value::Str(s)) => role.replace(s).is_none(),
            (b"content", Value::Str(s)) => content.replace(s).is_none(),
            (b"createdAt", Value::Date(v)) => ms.replace(v).is_none(),
            // as `message_from_doc`: an empty type or Mastra's own 'v2' is not part of the message
            (b"type", Value::Str(s)) => kind
                .replace((!s.is_empty() && s != "v2").then_some(s))
                .is_none(),
            (b"type", Value::Null) => kind.replace(None).is_none(),
            (b"_mh_extra", Value::Null) => !std::mem::replace(&mut extra, true),
            _ => return None, // another field, or a wrong type: not the plain shape
        };
        if !fresh {
            return None; // a repeated field: the driver keeps the last, leave it to the reference
        }
    }
    if pos != end {
        return None;
    }
    let role = role?;
    let ms = ms?;
    if !ROLES.contains(&role) || !(MIN_MS..=MAX_MS).contains(&ms) {
        return None;
    }
    let id = id?;
    if !carriable_id(id) {
        return None;
    }
    Some(Row {
        id,
        thread_id: thread_id?,
        resource_id: resource_id?,
        role,
        ms,
        kind: kind.flatten(),
        content: content?,
    })
}

/// `row`'s enriched JSON (source memory) into `out`, as `recalled_row` + `enriched_json("memory")` write it;
/// false when its content is not canonical (or not surely so).
pub fn write_enriched(row: &Row<'_>, out: &mut Vec<u8>) -> bool {
    if !canonical(row.content.as_bytes()) {
        return false;
    }
    out.clear();
    out.extend_from_slice(b"{\"id\":");
    write_str(out, row.id);
    out.extend_from_slice(b",\"role\":");
    write_str(out, row.role);
    out.extend_from_slice(b",\"createdAt\":\"");
    write_timestamp(out, row.ms);
    out.extend_from_slice(b"\",\"threadId\":");
    write_str(out, row.thread_id);
    out.extend_from_slice(b",\"resourceId\":");
    write_str(out, row.resource_id);
    if let Some(kind) = row.kind {
        out.extend_from_slice(b",\"type\":");
        write_str(out, kind);
    }
    out.extend_from_slice(b",\"content\":");
    out.extend_from_slice(row.content.as_bytes());
    out.extend_from_slice(b",\"source\":\"memory\"}");
    true
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A JSON string as pydantic-core (serde_json) writes it: `"` and `\` escaped, the short escapes for
/// \b \t \n \f \r, other control characters as \u00xx (lowercase), everything else as UTF-8.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0A => b"\\n",
            0x0C => b"\\f",
            0x0D => b"\\r",
            0x00..=0x1F => &[],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0xF) as usize],
            ]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// `format_timestamp`: `YYYY-MM-DDTHH:MM:SS.mmmZ` in UTC (`ms` within MIN_MS..=MAX_MS).
fn write_timestamp(out: &mut Vec<u8>, ms: i64) {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    // days since 1970-01-01 to a civil date (Howard Hinnant's `civil_from_days`)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let digits = |out: &mut Vec<u8>, v: i64, width: u32| {
        for p in (0..width).rev() {
            out.push(b'0' + ((v / 10_i64.pow(p)) % 10) as u8);
        }
    };
    digits(out, year, 4);
    out.push(b'-');
    digits(out, month, 2);
    out.push(b'-');
    digits(out, day, 2);
    out.push(b'T');
    digits(out, in_day / 3_600_000, 2);
    out.push(b':');
    digits(out, in_day / 60_000 % 60, 2);
    out.push(b':');
    digits(out, in_day / 1000 % 60, 2);
    out.push(b'.');
    digits(out, in_day % 1000, 3);
    out.push(b'Z');
}

/// An id an event can carry (`schemas.limits.id_problem`: not blank, at most 256 characters), or one this side
/// is not sure of: an id at either end of which stands a character Python may take for whitespace is left to
/// the reference, which decides it exactly.
fn carriable_id(id: &str) -> bool {
    let edge = |c: char| c.is_whitespace() || c.is_control() || ('\u{1c}'..='\u{1f}').contains(&c);
    match (id.chars().next(), id.chars().next_back()) {
        (Some(first), Some(last)) => !edge(first) && !edge(last) && id.chars().count() <= 256,
        _ => false,
    }
}
