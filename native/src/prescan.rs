//! `maybe_non_finite`: may a record value hold NaN, Infinity or a number too large for a double?
//!
//! The native twin of the prescan in `schemas/codec.py`'s `_refuse_non_finite` (the reference):
//! `b"NaN" in raw or b"Infinity" in raw or _MAYBE_HUGE.search(raw) is not None`, with
//! `_MAYBE_HUGE = rb"[eE][+-]?\d{3,}|(?<!\d)\d{300,}"` (`\d` on bytes: ASCII 0-9). The same answer on any
//! bytes, in one pass (each byte read at most twice: by the chunk test, then alone), no allocation. A true answer
//! only sends the value to the careful parse, which decides; the regex was two thirds of a decode.

/// A run of this many digits may not fit a double (the regex's `\d{300,}`).
const HUGE_RUN: usize = 300;
/// The bytes skipped at once when none of them can start a match (a multiple of the vector width).
const CHUNK: usize = 32;

/// Exactly the reference's answer (the module doc). Never panics: every index is checked.
///
/// Every match involves a digit, an `N` or an `I`: the literals start at `N` or `I`; an exponent match is
/// a run of at least 3 digits right after `e`, `E`, `e+`, `e-`, `E+` or `E-`; a huge one is a run of at
/// least 300. So chunks without those bytes are skipped whole (most of a value is text), and each digit
/// run is read once, from its first digit, looking back at most two bytes for the exponent's letter.
pub fn maybe_non_finite(raw: &[u8]) -> bool {
    let n = raw.len();
    let mut i = 0;
    while i < n {
        let end = (i + CHUNK).min(n);
        if let Ok(chunk) = <&[u8; CHUNK]>::try_from(&raw[i..end]) {
            if !may_start(chunk) {
                i = end; // nothing here; and no digit run crosses into the next chunk
                continue;
            }
        }
        while i < end {
            let c = raw[i];
            if c.is_ascii_digit() {
                // a run's first digit: raw[i - 1] is never a digit (runs are read to their end here)
                let start = i;
                while i < n && raw[i].is_ascii_digit() {
                    i += 1;
                    if i - start >= HUGE_RUN {
                        return true;
                    }
                }
                if i - start >= 3 && exponent_before(raw, start) {
                    return true;
                }
                continue; // raw[i] is not a digit (or i == n): read it as any other byte
            }
            let rest = &raw[i + 1..]; // i < n: empty at the end
            if (c == b'N' && rest.starts_with(b"aN")) || (c == b'I' && rest.starts_with(b"nfinity"))
            {
                return true;
            }
            i += 1;
        }
    }
    false
}

/// Any digit, `N` or `I` in the chunk: branch-free over a fixed length, so the compiler vectorizes it.
fn may_start(chunk: &[u8; CHUNK]) -> bool {
    chunk.iter().fold(false, |seen, &c| {
        seen | (c.wrapping_sub(b'0') < 10) | (c == b'N') | (c == b'I')
    })
}

/// `[eE][+-]?` right before the digit run starting at `start`. The regex backtracks from a sign to no
/// sign, but then the sign stands where a digit is needed: no other way to match.
fn exponent_before(raw: &[u8], start: usize) -> bool {
    let is_e = |at: Option<usize>| matches!(at.and_then(|j| raw.get(j)), Some(b'e' | b'E'));
    match start.checked_sub(1).and_then(|j| raw.get(j)) {
        Some(b'e' | b'E') => true,
        Some(b'+' | b'-') => is_e(start.checked_sub(2)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, position by position (quadratic, for the tests only).
    fn naive(raw: &[u8]) -> bool {
        let has = |needle: &[u8]| raw.windows(needle.len()).any(|w| w == needle);
        let digit = |i: usize| raw.get(i).is_some_and(u8::is_ascii_digit);
        let exponent = (0..raw.len()).any(|i| {
            if raw[i] != b'e' && raw[i] != b'E' {
                return false;
            }
            let signed = matches!(raw.get(i + 1), Some(b'+' | b'-'));
            let at = |j: usize| (j..j + 3).all(digit);
            at(i + 1) || (signed && at(i + 2))
        });
        let long_run =
            (0..raw.len()).any(|i| (i == 0 || !digit(i - 1)) && (i..i + HUGE_RUN).all(digit));
        has(b"NaN") || has(b"Infinity") || exponent || long_run
    }

    fn digits(n: usize) -> Vec<u8> {
        (0..n).map(|i| b'0' + (i % 10) as u8).collect()
    }

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn empty_and_plain() {
        assert!(!maybe_non_finite(b""));
        assert!(!maybe_non_finite(b"{\"a\":1.5e10,\"b\":\"none here\"}"));
    }

    #[test]
    fn the_literals_at_the_start_the_end_and_inside() {
        for lit in [&b"NaN"[..], b"Infinity"] {
            assert!(maybe_non_finite(lit));
            assert!(maybe_non_finite(&cat(&[lit, b"]"])));
            assert!(maybe_non_finite(&cat(&[b"[-", lit])));
            assert!(maybe_non_finite(&cat(&[b"\"x", lit, b"y\""])));
        }
        // cut short at the end, or split by another byte: not the literal
        for s in [
            &b"Na"[..],
            b"N",
            b"Infinit",
            b"Nan",
            b"NAN",
            b"N aN",
            b"Infin ity",
            b"infinity",
            b"nan",
        ] {
            assert!(!maybe_non_finite(s), "{:?}", std::str::from_utf8(s));
        }
        assert!(maybe_non_finite(b"NNaN"));
        assert!(maybe_non_finite(b"IInfinity"));
    }

    #[test]
    fn exponents() {
        for s in [
            &b"e123"[..],
            b"E123",
            b"e+12x",
            b"e+123",
            b"E-123",
            b"1e1234",
            b"xE-0000",
            b"e999]",
        ] {
            assert_eq!(
                maybe_non_finite(s),
                naive(s),
                "{:?}",
                std::str::from_utf8(s)
            );
        }
        assert!(maybe_non_finite(b"1e123"));
        assert!(maybe_non_finite(b"E-123"));
        assert!(!maybe_non_finite(b"e+12"));
        assert!(!maybe_non_finite(b"1e12,"));
        assert!(!maybe_non_finite(b"e12x3"));
        assert!(!maybe_non_finite(b"e12"));
        assert!(!maybe_non_finite(b"e+-123"));
        assert!(!maybe_non_finite(b"e-+123"));
        assert!(!maybe_non_finite(b"e 123"));
        assert!(!maybe_non_finite(b"e"));
        assert!(!maybe_non_finite(b"e+"));
        assert!(!maybe_non_finite(b"E-12"));
        assert!(maybe_non_finite(b"ee123"));
        assert!(maybe_non_finite(b"e+e-123"));
    }

    #[test]
    fn digit_runs_at_299_300_301() {
        for n in [299, 300, 301] {
            let run = digits(n);
            let want = n >= 300;
            assert_eq!(maybe_non_finite(&run), want, "{n} alone");
            assert_eq!(
                maybe_non_finite(&cat(&[b"[", &run, b"]"])),
                want,
                "{n} inside"
            );
            assert_eq!(
                maybe_non_finite(&cat(&[b"x", &run])),
                want,
                "{n} at the end"
            );
            assert_eq!(
                maybe_non_finite(&cat(&[&run, b"x"])),
                want,
                "{n} at the start"
            );
            assert_eq!(naive(&run), want);
        }
        // two runs of 299 split by one non-digit are not one run of 300
        let split = cat(&[&digits(299), b".", &digits(299)]);
        assert!(!maybe_non_finite(&split));
        assert!(!naive(&split));
    }

    #[test]
    fn a_run_preceded_by_a_digit_is_the_same_run() {
        // the lookbehind only moves where a match starts: a run of 301 is found from its first digit
        let run = cat(&[b"7", &digits(299)]);
        assert!(maybe_non_finite(&run));
        let short = cat(&[b"7", &digits(298)]);
        assert!(!maybe_non_finite(&short));
    }

    #[test]
    fn non_utf8_bytes() {
        assert!(!maybe_non_finite(&[0xff, 0xfe, 0x00, 0x80, 0xc3]));
        assert!(maybe_non_finite(&[0xff, b'N', b'a', b'N', 0xfe]));
        assert!(maybe_non_finite(&[0xc3, b'e', b'-', b'1', b'2', b'3']));
        // a UTF-8 multi-byte digit (Arabic-Indic) is not `\d` on bytes
        assert!(!maybe_non_finite("e\u{0661}\u{0662}\u{0663}".as_bytes()));
        let mut high = vec![0xd9u8; 400];
        high.extend_from_slice(&digits(10));
        assert!(!maybe_non_finite(&high));
    }

    #[test]
    fn equals_the_definition_on_every_short_string() {
        // every string of up to 6 bytes over the bytes that matter (and one that does not)
        let alphabet = b"eE+-1NaIx";
        let mut buf: Vec<u8> = Vec::new();
        let mut count = 0u64;
        for len in 0..=6u32 {
            for mut k in 0..(alphabet.len() as u64).pow(len) {
                buf.clear();
                for _ in 0..len {
                    buf.push(alphabet[(k % alphabet.len() as u64) as usize]);
                    k /= alphabet.len() as u64;
                }
                assert_eq!(
                    maybe_non_finite(&buf),
                    naive(&buf),
                    "{:?}",
                    std::str::from_utf8(&buf)
                );
                count += 1;
            }
        }
        assert_eq!(count, 597_871);
    }

    #[test]
    fn patterns_at_every_place_across_the_chunks() {
        // each pattern (and its near misses) at every offset of a text that spans several chunks, so it
        // starts in one chunk and ends in the next, or has its `e` in a chunk the skip passed over
        let patterns: [&[u8]; 16] = [
            b"NaN",
            b"Na",
            b"Infinity",
            b"Infinit",
            b"e123",
            b"e12",
            b"E-123",
            b"e+12",
            b"e+123",
            b"E123",
            b"e-1234",
            b"+123",
            b"x123",
            b"ee+999",
            b"N1aN",
            b"I123",
        ];
        for pattern in patterns {
            for filler in [b'a', b' ', b'e', b'+'] {
                for at in 0..(3 * CHUNK) {
                    let mut raw = vec![filler; 4 * CHUNK];
                    raw[at..at + pattern.len()].copy_from_slice(pattern);
                    assert_eq!(
                        maybe_non_finite(&raw),
                        naive(&raw),
                        "{:?} at {at}",
                        std::str::from_utf8(pattern)
                    );
                    raw.truncate(at + pattern.len());
                    assert_eq!(
                        maybe_non_finite(&raw),
                        naive(&raw),
                        "{:?} ending at {at}",
                        std::str::from_utf8(pattern)
                    );
                }
            }
        }
        // 299 / 300 digits at every offset
        for len in [299, 300] {
            for at in 0..(2 * CHUNK) {
                let mut raw = vec![b'a'; at];
                raw.extend_from_slice(&digits(len));
                raw.extend_from_slice(&[b'a'; 40]);
                assert_eq!(maybe_non_finite(&raw), len >= 300, "{len} at {at}");
            }
        }
    }

    #[test]
    fn equals_the_definition_on_random_long_strings() {
        // an LCG's bytes, mostly filler and the bytes that matter, lengths across several chunks
        let alphabet = b"eE+-0123456789NaIinfityxy {}\"\xff";
        let mut state: u64 = 20261207;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        for _ in 0..50_000 {
            let len = next() % 200;
            let dense = next() % 4; // 0: the whole alphabet; else mostly filler with a few hits
            let raw: Vec<u8> = (0..len)
                .map(|_| {
                    if dense == 0 || next() % 16 == 0 {
                        alphabet[next() % alphabet.len()]
                    } else {
                        b'x'
                    }
                })
                .collect();
            assert_eq!(maybe_non_finite(&raw), naive(&raw), "{raw:?}");
        }
        let runs: Vec<u8> = (0..2000)
            .flat_map(|k| [vec![b'7'; k % 310], vec![b'x'; 1 + k % 40]].concat())
            .collect();
        assert_eq!(maybe_non_finite(&runs), naive(&runs));
    }

    #[test]
    fn linear_on_adversarial_runs() {
        // the shapes that made the regex slow before its lookbehind: long runs just under the limit
        let mut many = Vec::new();
        for _ in 0..4096 {
            many.extend_from_slice(&digits(299));
            many.push(b'x');
        }
        assert!(!maybe_non_finite(&many));
        assert!(!maybe_non_finite(&b"e+".repeat(1 << 20)));
        assert!(!maybe_non_finite(&b"Infinit".repeat(1 << 18)));
    }
}
