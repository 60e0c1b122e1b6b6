//! JSON read strictly (objects only, each key once, no unknown key) and written as
//! orjson writes it: what both compiled paths share.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;
use serde::de::{Deserializer, Error, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// `Deserialize` from a JSON object only, every key once, no key but the fields (serde's
/// derive also takes an array of the fields' values, which the strict Structs refuse).
/// A key with escapes is refused too: the Python path reads it.
macro_rules! object {
    ($name:ident { $($field:ident : $ty:ty = $key:literal or $default:expr),* $(,)? }) => {
        pub(crate) struct $name<'a> { $(pub(crate) $field: $ty),* }

        impl<'de: 'a, 'a> ::serde::Deserialize<'de> for $name<'a> {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Fields<'a>(std::marker::PhantomData<&'a ()>);
                impl<'de: 'a, 'a> ::serde::de::Visitor<'de> for Fields<'a> {
                    type Value = $name<'a>;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter) -> ::std::fmt::Result {
                        f.write_str(concat!("a JSON object: ", stringify!($name)))
                    }
                    fn visit_map<A: ::serde::de::MapAccess<'de>>(self, mut map: A) -> Result<$name<'a>, A::Error> {
                        $(let mut $field: Option<$ty> = None;)*
                        while let Some(key) = map.next_key::<&str>()? {
                            match key {
                                $($key => {
                                    if $field.is_some() {
                                        return Err(::serde::de::Error::custom("a key twice"));
                                    }
                                    $field = Some(map.next_value()?);
                                })*
                                _ => return Err(::serde::de::Error::custom("an unknown key")),
                            }
                        }
                        Ok($name { $($field: match $field { Some(v) => v, None => $default }),* })
                    }
                }
                d.deserialize_map(Fields(std::marker::PhantomData))
            }
        }
    };
}
pub(crate) use object;

/// A JSON string, borrowed from the input unless it holds escapes.
#[derive(Default)]
pub(crate) struct Str<'a>(pub(crate) Cow<'a, str>);

impl std::ops::Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Text<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: Error>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: Error>(self, v: String) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(Text(std::marker::PhantomData))
    }
}

pub(crate) struct Out(pub(crate) Vec<u8>);

impl Out {
    pub(crate) fn raw(&mut self, s: &str) {
        self.0.extend_from_slice(s.as_bytes());
    }
    /// A JSON string: only `"`, `\` and newlines need escaping, because whatever holds
    /// another control character was declined (`plain`).
    pub(crate) fn string(&mut self, s: &str) {
        let v = &mut self.0;
        v.push(b'"');
        let mut start = 0;
        for (i, &b) in s.as_bytes().iter().enumerate() {
            let esc: &[u8] = match b {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                b'\n' => b"\\n",
                _ => continue,
            };
            v.extend_from_slice(&s.as_bytes()[start..i]);
            v.extend_from_slice(esc);
            start = i + 1;
        }
        v.extend_from_slice(&s.as_bytes()[start..]);
        v.push(b'"');
    }
    pub(crate) fn opt_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.string(s),
            None => self.raw("null"),
        }
    }
    pub(crate) fn int(&mut self, n: i64) {
        self.raw(itoa::Buffer::new().format(n));
    }
    pub(crate) fn float(&mut self, f: f64) {
        self.raw(ryu::Buffer::new().format_finite(f));
    }
    pub(crate) fn key(&mut self, k: &str) {
        self.0.push(b'"');
        self.raw(k);
        self.raw("\":");
    }
}

/// Whether every JSON writer here formats `f` alike (shortest digits, no exponent).
pub(crate) fn plain_float(f: f64) -> bool {
    let a = f.abs();
    f.is_finite() && ((1e-4..1e15).contains(&a) || (f == 0.0 && f.is_sign_positive()))
}

/// No control character: the writers escape those each their own way.
pub(crate) fn plain(s: &str) -> bool {
    s.bytes().all(|b| b >= 0x20)
}

/// Python's `str.isprintable()`, asked of Python only for text beyond ASCII.
pub(crate) fn printable(py: Python<'_>, s: &str) -> bool {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return true;
    }
    PyString::new(py, s)
        .call_method0(intern!(py, "isprintable"))
        .and_then(|r| r.extract::<bool>())
        .unwrap_or(false)
}

pub(crate) fn plain_opt(s: &Option<Str>) -> bool {
    s.as_deref().is_none_or(plain)
}
