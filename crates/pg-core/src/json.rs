//! The JSON documents pg-core writes (the flight-recorder dump, the trace files): a small owned value and its
//! writer, so that pg-core writes JSON without pulling serde_json into every user's build.
//!
//! A [`Value`] is null, a boolean, an integer (exact over the whole `i64` and `u64` ranges), a float, a string, an
//! array or an [`Object`], whose keys keep the order they were inserted in. `to_string` (through `Display`)
//! writes compact JSON, [`Value::to_pretty_string`] the two-space indented form; strings are escaped as
//! RFC 8259 asks (quote, backslash and every control character), and a float that is not finite is written as
//! `null`, which JSON has no number for. [`json_object!`](crate::json_object) builds an object from key-value pairs.

use std::fmt::{self, Write as _};

/// A JSON value.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Value {
    /// `null`.
    #[default]
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer, written exactly (every `i64` and `u64` fits).
    Integer(i128),
    /// A float, written as the shortest text that reads back as the same number (`null` when not finite).
    Float(f64),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object.
    Object(Object),
}

/// A JSON object: keys and values in the order they were first inserted.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Object {
    entries: Vec<(String, Value)>,
}

impl Object {
    /// An empty object.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`: a key already there keeps its place and gets the new value, which returns the old
    /// one; a new key goes last.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Option<Value> {
        let (key, value) = (key.into(), value.into());
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some((_, slot)) => Some(std::mem::replace(slot, value)),
            None => {
                self.entries.push((key, value));
                None
            }
        }
    }

    /// The value of `key`, if the object has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the object has no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The keys and values in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl<K: Into<String>, V: Into<Value>> FromIterator<(K, V)> for Object {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut object = Object::new();
        for (key, value) in iter {
            object.insert(key, value);
        }
        object
    }
}

/// An [`Object`] from `"key": value` pairs, each value taken through `Value::from`:
/// `json_object! {"ph": "X", "pid": 3, "args": json_object! {}}`.
#[macro_export]
macro_rules! json_object {
    ($($key:literal : $value:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut object = $crate::json::Object::new();
        $(object.insert($key, $crate::json::Value::from($value));)*
        object
    }};
}

impl Value {
    /// The value of `key` when this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(object) => object.get(key),
            _ => None,
        }
    }

    /// The items when this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The object when this is one.
    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(object) => Some(object),
            _ => None,
        }
    }

    /// The indented form: two spaces a level, `"key": value`, one item or key a line (`[]` and `{}` when empty).
    pub fn to_pretty_string(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, Some(0));
        out
    }

    /// Appends the compact form to `out`.
    pub fn write_compact(&self, out: &mut String) {
        self.write(out, None);
    }

    /// Appends the value to `out`: compact when `indent` is `None`, else indented from that level.
    fn write(&self, out: &mut String, indent: Option<usize>) {
        match self {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Integer(n) => {
                let _ = write!(out, "{n}");
            }
            Value::Float(x) => write_float(out, *x),
            Value::String(s) => write_string(out, s),
            Value::Array(items) => {
                write_list(out, indent, ('[', ']'), items.iter(), |out, item, indent| item.write(out, indent))
            }
            Value::Object(object) => {
                write_list(out, indent, ('{', '}'), object.entries.iter(), |out, (key, value), indent| {
                    write_string(out, key);
                    out.push_str(if indent.is_some() { ": " } else { ":" });
                    value.write(out, indent);
                })
            }
        }
    }
}

/// Writes a bracketed list of items, each written by `item` (given the level its own contents indent from).
fn write_list<T>(
    out: &mut String,
    indent: Option<usize>,
    (open, close): (char, char),
    items: impl ExactSizeIterator<Item = T>,
    mut item: impl FnMut(&mut String, T, Option<usize>),
) {
    out.push(open);
    let empty = items.len() == 0;
    for (index, each) in items.enumerate() {
        if index > 0 {
            out.push(',');
        }
        if let Some(level) = indent {
            newline(out, level + 1);
        }
        item(out, each, indent.map(|level| level + 1));
    }
    if let (Some(level), false) = (indent, empty) {
        newline(out, level);
    }
    out.push(close);
}

fn newline(out: &mut String, level: usize) {
    out.push('\n');
    for _ in 0..level {
        out.push_str("  ");
    }
}

/// A finite float as the shortest decimal that reads back as it, with a fraction or an exponent so that it reads
/// back as a float (`2.0`, `0.5`, `1e-7`, `1e+16`, as serde_json writes them); `null` for NaN and the infinities.
fn write_float(out: &mut String, x: f64) {
    if !x.is_finite() {
        out.push_str("null");
        return;
    }
    // `Debug` gives the shortest round-trip digits, keeps `.0` on whole numbers and uses an exponent below 1e-4
    // and from 1e16 on; a positive exponent gets its sign, as serde_json writes it.
    let text = format!("{x:?}");
    match text.split_once('e') {
        Some((digits, exponent)) if !exponent.starts_with('-') => {
            let _ = write!(out, "{digits}e+{exponent}");
        }
        _ => out.push_str(&text),
    }
}

/// A JSON string: quote and backslash escaped, control characters as `\n`, `\t` and the like or `\u00XX`; all
/// other characters as they are (the text is UTF-8).
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    let mut rest = s;
    while let Some(at) = rest.find(|c: char| c == '"' || c == '\\' || c < ' ') {
        out.push_str(&rest[..at]);
        let c = rest[at..].chars().next().unwrap_or(' ');
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            other => {
                let _ = write!(out, "\\u{:04x}", u32::from(other));
            }
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.push_str(rest);
    out.push('"');
}

/// The compact form.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        self.write(&mut out, None);
        f.write_str(&out)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

macro_rules! from_integer {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(n: $t) -> Self {
                Value::Integer(i128::from(n))
            }
        }
    )*};
}
from_integer!(i8, i16, i32, i64, u8, u16, u32, u64);

impl From<usize> for Value {
    fn from(n: usize) -> Self {
        // A usize is at most 64 bits on every target Rust supports; wider would saturate.
        Value::Integer(i128::try_from(n).unwrap_or(i128::MAX))
    }
}

impl From<isize> for Value {
    fn from(n: isize) -> Self {
        Value::Integer(i128::try_from(n).unwrap_or(i128::MAX))
    }
}

impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Float(x)
    }
}

impl From<f32> for Value {
    fn from(x: f32) -> Self {
        Value::Float(f64::from(x))
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s)
    }
}

impl From<&String> for Value {
    fn from(s: &String) -> Self {
        Value::String(s.clone())
    }
}

impl From<Object> for Value {
    fn from(object: Object) -> Self {
        Value::Object(object)
    }
}

impl From<&Value> for Value {
    fn from(value: &Value) -> Self {
        value.clone()
    }
}

/// `None` is `null`.
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(value: Option<T>) -> Self {
        value.map_or(Value::Null, Into::into)
    }
}

impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(items: Vec<T>) -> Self {
        Value::Array(items.into_iter().map(Into::into).collect())
    }
}

impl<T: Into<Value>, const N: usize> From<[T; N]> for Value {
    fn from(items: [T; N]) -> Self {
        Value::Array(items.into_iter().map(Into::into).collect())
    }
}

impl<T: Into<Value>> FromIterator<T> for Value {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Value::Array(iter.into_iter().map(Into::into).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same document as serde_json's value (for comparing what serde_json reads back).
    fn to_serde(value: &Value) -> serde_json::Value {
        match value {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => (*b).into(),
            Value::Integer(n) => match (i64::try_from(*n), u64::try_from(*n)) {
                (Ok(n), _) => n.into(),
                (_, Ok(n)) => n.into(),
                _ => panic!("{n} is beyond serde_json's integers"),
            },
            Value::Float(x) => serde_json::Number::from_f64(*x).map_or(serde_json::Value::Null, Into::into),
            Value::String(s) => s.as_str().into(),
            Value::Array(items) => items.iter().map(to_serde).collect(),
            Value::Object(object) => {
                serde_json::Value::Object(object.iter().map(|(k, v)| (k.to_owned(), to_serde(v))).collect())
            }
        }
    }

    /// Every character up to U+00A0, the surrogates' neighbours and a character beyond the basic plane.
    fn awkward_text() -> String {
        let mut text: String = (0u32..=0xa0).filter_map(char::from_u32).collect();
        text.push_str("\u{2028}\u{d7ff}\u{e000}\u{fffd}\u{1f600}/é");
        text
    }

    fn sample() -> Value {
        let floats = [0.0, -0.0, 1.5, -2.0, 1e-7, 1e16, 1e15, 123_456.789, f64::MIN_POSITIVE, f64::MAX, 0.1 + 0.2];
        json_object! {
            "null": Value::Null,
            "bools": [true, false],
            "integers": vec![
                Value::from(0), Value::from(-1), Value::from(i64::MIN), Value::from(i64::MAX), Value::from(u64::MAX),
            ],
            "floats": floats.to_vec(),
            "text": awkward_text(),
            "empty": json_object! {},
            "empty list": Vec::<Value>::new(),
            "nested": json_object! {"a": [json_object! {"b": vec![vec![1], vec![2, 3]]}], "key \"quoted\"\n": "v"},
            "none": None::<u64>,
            "some": Some(3u64),
        }
        .into()
    }

    #[test]
    fn what_is_written_reads_back_the_same_in_serde_json_compact_and_pretty() {
        let value = sample();
        for text in [value.to_string(), value.to_pretty_string()] {
            let read: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
            assert_eq!(read, to_serde(&value), "{text}");
        }
    }

    #[test]
    fn the_text_is_serde_jsons_own_for_sorted_keys() {
        // serde_json (without `preserve_order`) writes keys sorted: an object built in that order is written
        // byte for byte as serde_json writes it, compact and pretty.
        let sorted: Value = json_object! {
            "a": json_object! {"list": [1.5, 2.0, 1e-7, 1e16], "s": "tab\there \u{1} \"q\" \\"},
            "b": Vec::<Value>::new(),
            "c": json_object! {},
            "d": [Value::Null, Value::from(true), Value::from(-7), Value::from(u64::MAX)],
        }
        .into();
        let serde = to_serde(&sorted);
        assert_eq!(sorted.to_string(), serde_json::to_string(&serde).unwrap());
        assert_eq!(sorted.to_pretty_string(), serde_json::to_string_pretty(&serde).unwrap());
    }

    #[test]
    fn strings_escape_quotes_backslashes_and_every_control_character() {
        assert_eq!(Value::from("a\"b\\c/d").to_string(), r#""a\"b\\c/d""#);
        assert_eq!(Value::from("\n\r\t\u{8}\u{c}").to_string(), r#""\n\r\t\b\f""#);
        assert_eq!(Value::from("\u{0}\u{1f}\u{7f}é").to_string(), "\"\\u0000\\u001f\u{7f}é\"");
        for c in (0u32..0x20).filter_map(char::from_u32) {
            let text = Value::from(c.to_string()).to_string();
            assert!(text.chars().all(|c| c >= ' '), "{text:?}");
            assert_eq!(serde_json::from_str::<String>(&text).unwrap(), c.to_string());
        }
        let text = awkward_text();
        assert_eq!(serde_json::from_str::<String>(&Value::from(text.as_str()).to_string()).unwrap(), text);
    }

    #[test]
    fn floats_keep_their_value_and_stay_floats_and_non_finite_ones_are_null() {
        for (x, text) in [(2.0, "2.0"), (-0.5, "-0.5"), (1e-7, "1e-7"), (1e16, "1e+16"), (1000.0, "1000.0")] {
            assert_eq!(Value::from(x).to_string(), text);
        }
        for x in [0.1, 1.0 / 3.0, -0.0, f64::MAX, f64::MIN_POSITIVE, 5e-324, -1.234_567_890_123_456_7e-300, 1.5e300] {
            let text = Value::from(x).to_string();
            // Exactly the float again (serde_json's default reader may be off in the last bit, so the standard
            // library's exact one reads it), and a JSON number serde_json takes.
            assert_eq!(text.parse::<f64>().unwrap().to_bits(), x.to_bits(), "{text}");
            assert!(serde_json::from_str::<serde_json::Value>(&text).unwrap().is_f64(), "{text}");
        }
        for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(Value::from(x).to_string(), "null");
        }
        assert_eq!(Value::Array(vec![Value::from(f64::NAN)]).to_string(), "[null]");
    }

    #[test]
    fn integers_are_exact_at_the_ends_of_their_ranges() {
        assert_eq!(Value::from(u64::MAX).to_string(), "18446744073709551615");
        assert_eq!(Value::from(i64::MIN).to_string(), "-9223372036854775808");
        assert_eq!(Value::from(usize::MAX).to_string(), usize::MAX.to_string());
        assert_eq!(serde_json::from_str::<u64>(&Value::from(u64::MAX).to_string()).unwrap(), u64::MAX);
    }

    #[test]
    fn keys_keep_their_order_and_a_key_set_again_keeps_its_place() {
        let mut object = json_object! {"z": 1, "a": 2};
        assert_eq!(object.insert("m", 3), None);
        assert_eq!(object.insert("z", "again"), Some(Value::from(1)));
        assert_eq!(Value::from(object.clone()).to_string(), r#"{"z":"again","a":2,"m":3}"#);
        assert_eq!(object.get("a"), Some(&Value::from(2)));
        assert_eq!(object.len(), 3);
        let collected: Object = [("x", 1), ("y", 2)].into_iter().collect();
        assert_eq!(Value::from(collected).to_string(), r#"{"x":1,"y":2}"#);
    }

    #[test]
    fn nesting_is_indented_two_spaces_a_level() {
        let value: Value = json_object! {"a": [1, 2], "b": json_object! {"c": Vec::<Value>::new()}}.into();
        assert_eq!(value.to_pretty_string(), "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {\n    \"c\": []\n  }\n}");
        assert_eq!(value.to_string(), r#"{"a":[1,2],"b":{"c":[]}}"#);
        assert_eq!(Value::Object(Object::new()).to_pretty_string(), "{}");
    }
}
