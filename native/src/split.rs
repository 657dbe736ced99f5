//! A BSON array's document elements, cut out of a `find` reply's bytes.
//!
//! The native twin of `storage/raw_batches.py`'s `array_documents_py` (the reference): the same answer on any
//! bytes, including the reference's reading of a size whose four bytes run past the array (it reads what is
//! there, as `int.from_bytes` does). The recall's replies hold tens of thousands of rows; the reference's
//! per-row Python loop was about a twentieth of the recall path's CPU.

/// `int.from_bytes(b[at:at + 4], "little", signed=True)`: fewer bytes where the slice is short, 0 for none.
fn int32_prefix(b: &[u8], at: usize) -> i64 {
    if at >= b.len() {
        return 0;
    }
    let s = &b[at..b.len().min(at + 4)];
    let mut v: i64 = 0;
    for (i, &x) in s.iter().enumerate() {
        v |= i64::from(x) << (8 * i);
    }
    if s[s.len() - 1] & 0x80 != 0 {
        v -= 1i64 << (8 * s.len());
    }
    v
}

/// The `(start, end)` of each document element of the array at `p[start..end]`, or None when an element is
/// not a document or a size does not fit. The caller ensures `start <= end`, `1 <= end <= p.len()`.
pub fn array_documents(p: &[u8], start: usize, end: usize) -> Option<Vec<(usize, usize)>> {
    let last = end - 1; // the array's terminator
    if p[last] != 0 || int32_prefix(p, start) != (end - start) as i64 {
        return None;
    }
    let mut rows = Vec::new();
    let mut at = start + 4;
    while at < last {
        if p[at] != 0x03 {
            return None;
        }
        let from = at + 1;
        if from >= last {
            return None;
        }
        let key_end = from + p[from..last].iter().position(|&b| b == 0)?;
        let size = int32_prefix(p, key_end + 1);
        if size < 5 || (key_end + 1) as i64 + size > last as i64 {
            return None;
        }
        let row_start = key_end + 1;
        let row_end = row_start + size as usize;
        rows.push((row_start, row_end));
        at = row_end;
    }
    Some(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_reads_like_int_from_bytes() {
        assert_eq!(int32_prefix(&[5, 0, 0, 0], 0), 5);
        assert_eq!(int32_prefix(&[0xff, 0xff, 0xff, 0xff], 0), -1);
        assert_eq!(int32_prefix(&[0x80], 0), -128);
        assert_eq!(int32_prefix(&[1, 2], 5), 0);
    }

    #[test]
    fn an_array_of_two_documents() {
        // [{}, {}]: int32 size, then "\x03" "0" "\x00" + empty doc, "\x03" "1" "\x00" + empty doc, "\x00"
        let mut p = vec![0u8; 4];
        for key in [b'0', b'1'] {
            p.extend_from_slice(&[0x03, key, 0, 5, 0, 0, 0, 0]);
        }
        p.push(0);
        let n = p.len() as u32;
        p[..4].copy_from_slice(&n.to_le_bytes());
        assert_eq!(
            array_documents(&p, 0, p.len()),
            Some(vec![(7, 12), (15, 20)])
        );
        p[4] = 0x02;
        assert_eq!(array_documents(&p, 0, p.len()), None);
    }
}
