//! The little JSON the protocol needs: string escaping (the stored headers
//! object, error bodies) and reading back a stored object of strings.
//! Strict (RFC 8259); anything else is refused, which the caller turns into
//! "this row cannot be replayed".

use alloc::string::String;
use alloc::vec::Vec;

/// `s` as a JSON string literal, escaped as `JSON.stringify`, serde_json and
/// Python's `json.dumps(ensure_ascii=False)` do: `\"`, `\\`, `\b \f \n \r
/// \t`, other controls as lowercase `\u00XX`, everything else as it is.
pub fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(HEX[(c as usize) >> 4] as char);
                out.push(HEX[(c as usize) & 0xf] as char);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON object whose values are all strings, as (name, value) pairs in
/// document order; `None` for anything else (another value type, invalid
/// JSON, trailing data, a lone surrogate).
pub fn string_object(text: &str) -> Option<Vec<(String, String)>> {
    let mut p = Parser { bytes: text.as_bytes(), at: 0 };
    p.skip_space();
    p.expect(b'{')?;
    let mut pairs = Vec::new();
    p.skip_space();
    if p.peek() == Some(b'}') {
        p.at += 1;
    } else {
        loop {
            p.skip_space();
            let name = p.string()?;
            p.skip_space();
            p.expect(b':')?;
            p.skip_space();
            let value = p.string()?;
            pairs.push((name, value));
            p.skip_space();
            match p.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    }
    p.skip_space();
    (p.at == p.bytes.len()).then_some(pairs)
}

struct Parser<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn string(&mut self) -> Option<String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            // Copy the run of plain characters at once (the input is valid UTF-8).
            let start = self.at;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.at += 1;
            }
            out.push_str(core::str::from_utf8(&self.bytes[start..self.at]).ok()?);
            match self.next()? {
                b'"' => return Some(out),
                b'\\' => {
                    let c = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return None,
                    };
                    out.push(c);
                }
                // A raw control character inside a string is not JSON.
                _ => return None,
            }
        }
    }

    /// After `\u`: one code unit, or a surrogate pair; lone surrogates are refused.
    fn unicode_escape(&mut self) -> Option<char> {
        let high = self.hex4()?;
        if !(0xD800..=0xDFFF).contains(&high) {
            return char::from_u32(high);
        }
        if high >= 0xDC00 {
            return None;
        }
        self.expect(b'\\')?;
        self.expect(b'u')?;
        let low = self.hex4()?;
        if !(0xDC00..=0xDFFF).contains(&low) {
            return None;
        }
        char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.bytes.get(self.at..self.at + 4)?;
        self.at += 4;
        let text = core::str::from_utf8(digits).ok()?;
        if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(text, 16).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn escapes_like_json_stringify() {
        assert_eq!(string("a\"b\\c\u{1}\t\u{7f}é€"), "\"a\\\"b\\\\c\\u0001\\t\u{7f}é€\"");
    }

    #[test]
    fn reads_objects_of_strings_only() {
        let ok = |s: &str| string_object(s);
        assert_eq!(ok(r#" { "a" : "1" , "b":"x\u00e9\ud83d\ude00\n" } "#), Some(vec![("a".into(), "1".into()), ("b".into(), "xé😀\n".into())]));
        assert_eq!(ok("{}"), Some(vec![]));
        for bad in [
            "", "[]", "{\"a\":1}", "{\"a\":null}", "{\"a\":\"1\",}", "{\"a\":\"1\"} x", "{\"a\" \"1\"}", "{\"a\":\"\\ud800\"}",
            "{\"a\":\"\\udc00\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\u{1}\"}", "{\"a\":{\"b\":\"c\"}}", "{'a':'b'}", "{\"a\":\"1\"",
        ] {
            assert_eq!(ok(bad), None, "{bad:?}");
        }
    }
}
