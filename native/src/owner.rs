//! A raw `mastra_messages` document's owner: its top-level `thread_id` and `resourceId`, read from the bytes.
//!
//! The native twin of `storage/raw_owner.py`'s `RawOwner` (the Python route, itself checked against the decoded
//! document): it answers only when one walk over every top-level element makes both fields certain, as a
//! decoded document would give them (the last element of a name wins; a nested document's keys are never the
//! row's). Anything else (an element type it does not step over, a size that does not fit, a `thread_id` that
//! is not a UTF-8 string) is "not sure" and the Python route decides that row.

fn le_i32(b: &[u8], at: usize) -> Option<usize> {
    let v = i32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?);
    usize::try_from(v).ok()
}

/// A string element's value at `pos` (its int32 length, the bytes, the terminator), and where it ends.
fn string_at(doc: &[u8], pos: usize, end: usize) -> Option<(&[u8], usize)> {
    let n = le_i32(doc, pos)?;
    let start = pos + 4;
    let stop = start.checked_add(n)?;
    if n < 1 || stop > end || doc[stop - 1] != 0 {
        return None;
    }
    Some((&doc[start..stop - 1], stop))
}

/// The owner fields of one document: `(thread_id, resourceId)`, the resource None when absent or not a
/// string (a decoded document's value then equals no resource id); None when not sure.
pub fn owner(doc: &[u8]) -> Option<(&str, Option<&str>)> {
    let len = le_i32(doc, 0)?;
    if len != doc.len() || len < 5 || doc[len - 1] != 0 {
        return None;
    }
    let end = len - 1;
    let mut thread: Option<&[u8]> = None; // None: absent (a decoded document's default, "")
    let mut thread_not_string = false;
    let mut resource: Option<&[u8]> = None;
    let mut pos = 4;
    while pos < end {
        let tag = doc[pos];
        let name_end = pos + 1 + doc.get(pos + 1..end)?.iter().position(|&b| b == 0)?;
        let name = &doc[pos + 1..name_end];
        let at = name_end + 1;
        let (value, next): (Option<&[u8]>, usize) = match tag {
            0x02 => {
                let (v, stop) = string_at(doc, at, end)?;
                (Some(v), stop)
            }
            0x03 | 0x04 => {
                let size = le_i32(doc, at)?;
                (
                    None,
                    at.checked_add(size).filter(|&s| size >= 5 && s <= end)?,
                )
            }
            0x05 => {
                let n = le_i32(doc, at)?;
                (
                    None,
                    at.checked_add(5)?.checked_add(n).filter(|&s| s <= end)?,
                )
            }
            0x01 | 0x09 | 0x11 | 0x12 => (None, at + 8),
            0x07 => (None, at + 12),
            0x08 => (None, at + 1),
            0x0A => (None, at),
            0x10 => (None, at + 4),
            0x13 => (None, at + 16),
            _ => return None, // a type this walk does not step over: not sure
        };
        if next > end {
            return None;
        }
        if name == b"thread_id" {
            thread = value;
            thread_not_string = value.is_none();
        } else if name == b"resourceId" {
            resource = value; // not a string: equals no resource id, as absent
        }
        pos = next;
    }
    if pos != end || thread_not_string {
        return None; // a `thread_id` that is not a string: the Python route says what it does
    }
    let thread = match thread {
        Some(bytes) => std::str::from_utf8(bytes).ok()?,
        None => "",
    };
    let resource = match resource {
        Some(bytes) => Some(std::str::from_utf8(bytes).ok()?), // not UTF-8: the decoded document refuses it
        None => None,
    };
    Some((thread, resource))
}
