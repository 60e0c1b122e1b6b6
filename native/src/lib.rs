//! The accumulator's per-payload transition, compiled: `agents.accumulate.state`'s
//! `apply_payload` for its common case (one batch, no PII filter, no debounce), from the
//! payload's bytes and the session entry's bytes to the entry, the operation, the stored
//! batch and the summarize request at K, byte for byte what the Python transition writes.
//!
//! It declines (returns None) whatever it is not sure to write exactly as Python does:
//! input the strict Structs would not take, text that is not plain printable, floats
//! outside the range every JSON writer here formats alike, an entry it does not know.
//! The Python transition then handles that payload, so declining is always safe
//! (tests/unit/test_compiled.py compares the two on generated payloads and entries).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, Error, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// `Deserialize` from a JSON object only, every key once, no key but the fields (serde's
/// derive also takes an array of the fields' values, which the strict Structs refuse).
/// A key with escapes is refused too: the Python path reads it.
macro_rules! object {
    ($name:ident { $($field:ident : $ty:ty = $key:literal or $default:expr),* $(,)? }) => {
        struct $name<'a> { $($field: $ty),* }

        impl<'de: 'a, 'a> Deserialize<'de> for $name<'a> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Fields<'a>(std::marker::PhantomData<&'a ()>);
                impl<'de: 'a, 'a> Visitor<'de> for Fields<'a> {
                    type Value = $name<'a>;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str(concat!("a JSON object: ", stringify!($name)))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$name<'a>, A::Error> {
                        $(let mut $field: Option<$ty> = None;)*
                        while let Some(key) = map.next_key::<&str>()? {
                            match key {
                                $($key => {
                                    if $field.is_some() {
                                        return Err(Error::custom("a key twice"));
                                    }
                                    $field = Some(map.next_value()?);
                                })*
                                _ => return Err(Error::custom("an unknown key")),
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

object!(Action {
    title: Str<'a> = "title" or Str::default(),
    description: Str<'a> = "description" or Str::default(),
    canonical_url: Str<'a> = "canonical_url" or Str::default(),
    index: i64 = "index" or 0,
    kind: Str<'a> = "type" or Str::default(),
    timestamp_start: f64 = "timestamp_start" or 0.0,
    timestamp_end: f64 = "timestamp_end" or 0.0,
    raw_url: Str<'a> = "raw_url" or Str::default(),
    session_id: Option<Str<'a>> = "session_id" or None,
    user_id: Option<Str<'a>> = "user_id" or None,
    email: Option<Str<'a>> = "email" or None,
    conversation_id: Option<Str<'a>> = "conversation_id" or None,
});

// `count` is read (an int64) and ignored, as by the SDK; `type` (the connector's event
// type) is any string.
object!(Payload {
    product_id: Str<'a> = "product_id" or Str::default(),
    session_id: Str<'a> = "session_id" or return Err(Error::missing_field("session_id")),
    user_id: Option<Str<'a>> = "user_id" or None,
    email: Option<Str<'a>> = "email" or None,
    actions: Vec<Action<'a>> = "actions" or Vec::new(),
    _count: i64 = "count" or 0,
    forwarded_at: f64 = "forwarded_at" or 0.0,
    conversation_id: Option<Str<'a>> = "conversation_id" or None,
    _kind: Str<'a> = "type" or Str::default(),
});

/// A JSON string, borrowed from the input unless it holds escapes.
#[derive(Default)]
struct Str<'a>(Cow<'a, str>);

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

/// A session entry as `SessionState.to_bytes` writes it; the fields this transition does
/// not change are kept as the text they were written as.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct State<'a> {
    generation: i64,
    #[serde(borrow)]
    product_id: Str<'a>,
    #[serde(borrow)]
    conversation_id: Option<Str<'a>>,
    next_seq: i64,
    last_offset: i64,
    summarized_to: i64,
    first_batch: i64,
    next_batch: i64,
    batch_slots: i64,
    pending_actions: i64,
    pending_bytes: i64,
    #[serde(borrow)]
    debounce: &'a RawValue,
    #[serde(borrow)]
    debounce_first: &'a RawValue,
    #[serde(borrow)]
    debounce_last: &'a RawValue,
    last_seen: f64,
    ingested_at: f64,
}

impl<'a> State<'a> {
    /// `SessionState(generation=offset, product_id=product_id)`: a new session's entry.
    fn new(offset: i64, product_id: &'a str) -> Self {
        let zero: &'static RawValue = serde_json::from_str("0.0").expect("a JSON number");
        let empty: &'static RawValue = serde_json::from_str("[]").expect("a JSON array");
        State {
            generation: offset,
            product_id: Str(Cow::Borrowed(product_id)),
            conversation_id: None,
            next_seq: 1,
            last_offset: -1,
            summarized_to: 0,
            first_batch: 0,
            next_batch: 0,
            batch_slots: 0,
            pending_actions: 0,
            pending_bytes: 0,
            debounce: empty,
            debounce_first: zero,
            debounce_last: zero,
            last_seen: 0.0,
            ingested_at: 0.0,
        }
    }

    /// The entry's JSON as `SessionState.to_bytes` (orjson) writes it.
    fn encode(&self) -> Vec<u8> {
        let mut e = Out(Vec::with_capacity(384));
        e.raw("{\"generation\":");
        e.int(self.generation);
        e.raw(",\"product_id\":");
        e.string(&self.product_id);
        e.raw(",\"conversation_id\":");
        e.opt_string(self.conversation_id.as_deref());
        for (k, v) in [
            ("next_seq", self.next_seq),
            ("last_offset", self.last_offset),
            ("summarized_to", self.summarized_to),
            ("first_batch", self.first_batch),
            ("next_batch", self.next_batch),
            ("batch_slots", self.batch_slots),
            ("pending_actions", self.pending_actions),
            ("pending_bytes", self.pending_bytes),
        ] {
            e.raw(",");
            e.key(k);
            e.int(v);
        }
        for (k, v) in [
            ("debounce", self.debounce),
            ("debounce_first", self.debounce_first),
            ("debounce_last", self.debounce_last),
        ] {
            e.raw(",");
            e.key(k);
            e.raw(v.get());
        }
        e.raw(",\"last_seen\":");
        e.float(self.last_seen);
        e.raw(",\"ingested_at\":");
        e.float(self.ingested_at);
        e.raw("}");
        e.0
    }
}

struct Out(Vec<u8>);

impl Out {
    fn raw(&mut self, s: &str) {
        self.0.extend_from_slice(s.as_bytes());
    }
    /// A JSON string: only `"`, `\` and newlines need escaping, because whatever holds
    /// another control character was declined (`plain`).
    fn string(&mut self, s: &str) {
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
    fn opt_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.string(s),
            None => self.raw("null"),
        }
    }
    fn int(&mut self, n: i64) {
        self.raw(itoa::Buffer::new().format(n));
    }
    fn float(&mut self, f: f64) {
        self.raw(ryu::Buffer::new().format_finite(f));
    }
    fn key(&mut self, k: &str) {
        self.0.push(b'"');
        self.raw(k);
        self.raw("\":");
    }
}

/// Whether every JSON writer here formats `f` alike (shortest digits, no exponent).
fn plain_float(f: f64) -> bool {
    let a = f.abs();
    f.is_finite() && ((1e-4..1e15).contains(&a) || (f == 0.0 && f.is_sign_positive()))
}

/// No control character: the writers escape those each their own way.
fn plain(s: &str) -> bool {
    s.bytes().all(|b| b >= 0x20)
}

/// Python's `str.isprintable()`, asked of Python only for text beyond ASCII.
fn printable(py: Python<'_>, s: &str) -> bool {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return true;
    }
    PyString::new(py, s)
        .call_method0(intern!(py, "isprintable"))
        .and_then(|r| r.extract::<bool>())
        .unwrap_or(false)
}

fn plain_opt(s: &Option<Str>) -> bool {
    s.as_deref().is_none_or(plain)
}

/// The payload's JSON as `schemas.fast.encode_payload` writes its `Payload` Struct.
fn encode_payload(p: &Payload, out: &mut Out) {
    out.raw("{\"product_id\":");
    out.string(&p.product_id);
    out.raw(",\"session_id\":");
    out.string(&p.session_id);
    out.raw(",\"user_id\":");
    out.opt_string(p.user_id.as_deref().filter(|s| !s.is_empty()));
    out.raw(",\"email\":");
    out.opt_string(p.email.as_deref().filter(|s| !s.is_empty()));
    out.raw(",\"actions\":[");
    for (i, a) in p.actions.iter().enumerate() {
        if i > 0 {
            out.raw(",");
        }
        out.raw("{\"title\":");
        out.string(&a.title);
        out.raw(",\"description\":");
        out.string(&a.description);
        out.raw(",\"canonical_url\":");
        out.string(&a.canonical_url);
        out.raw(",\"index\":");
        out.int(a.index);
        out.raw(",\"type\":");
        out.string(&a.kind);
        out.raw(",\"timestamp_start\":");
        out.float(a.timestamp_start);
        out.raw(",\"timestamp_end\":");
        out.float(a.timestamp_end);
        out.raw(",\"raw_url\":");
        out.string(&a.raw_url);
        out.raw(",\"session_id\":");
        out.opt_string(a.session_id.as_deref());
        out.raw(",\"user_id\":");
        out.opt_string(a.user_id.as_deref());
        out.raw(",\"email\":");
        out.opt_string(a.email.as_deref());
        out.raw(",\"conversation_id\":");
        out.opt_string(a.conversation_id.as_deref());
        out.raw("}");
    }
    out.raw("],\"count\":");
    out.int(p.actions.len() as i64);
    out.raw(",\"forwarded_at\":");
    out.float(p.forwarded_at);
    out.raw(",\"conversation_id\":");
    out.opt_string(p.conversation_id.as_deref());
    out.raw("}");
}

/// Whether this payload is one the transition writes exactly as Python does.
fn supported(py: Python<'_>, p: &Payload) -> bool {
    let sid = &p.session_id;
    if sid.is_empty() || sid.contains('\x1f') || !printable(py, sid) {
        return false;
    }
    if !(plain(&p.product_id)
        && plain_opt(&p.user_id)
        && plain_opt(&p.email)
        && plain_opt(&p.conversation_id)
        && plain_float(p.forwarded_at))
    {
        return false;
    }
    p.actions.iter().all(|a| {
        plain(&a.title)
            && plain(&a.raw_url)
            && plain_opt(&a.session_id)
            && plain_opt(&a.user_id)
            && plain_opt(&a.email)
            && plain_opt(&a.conversation_id)
            && plain_float(a.timestamp_start)
            && plain_float(a.timestamp_end)
            && printable(py, &a.kind)
            && printable(py, &a.description)
            && printable(py, &a.canonical_url)
    })
}

/// What `transition` returns: the session, whether it had an entry, its new entry (None
/// for an offset at or below its `last_offset`: a replay, skipped), the operation (None
/// for a payload without actions), the summarize request if one is now due, and the
/// actions applied.
type Applied = (
    Py<PyString>,
    bool,
    Option<Py<PyBytes>>,
    Option<Py<PyBytes>>,
    Option<Py<PyBytes>>,
    usize,
);

/// `apply_payload` for the payload `raw`, on the entry `lookup(session_id)` returns (None:
/// a new session), with its batches in `store` (a `BatchStore`: `put`, and `take` for a
/// request). None: declined, nothing looked up or changed.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (raw, lookup, store, offset, now, ingested_at, max_actions_per_batch, max_pending_bytes, threshold))]
fn transition(
    py: Python<'_>,
    raw: &[u8],
    lookup: &Bound<'_, PyAny>,
    store: &Bound<'_, PyAny>,
    offset: i64,
    now: f64,
    ingested_at: f64,
    max_actions_per_batch: usize,
    max_pending_bytes: i64,
    threshold: i64,
) -> PyResult<Option<Applied>> {
    let Ok(p) = serde_json::from_slice::<Payload>(raw) else {
        return Ok(None);
    };
    let ingested = if ingested_at != 0.0 { ingested_at } else { now };
    if !supported(py, &p)
        || !plain_float(now)
        || !plain_float(ingested)
        || p.actions.len() > max_actions_per_batch
    {
        return Ok(None);
    }
    let sid = PyString::new(py, &p.session_id);
    let found = lookup.call1((&sid,))?;
    let entry: Option<&[u8]> = if found.is_none() {
        None
    } else {
        Some(found.extract()?)
    };
    let parsed: Option<State> = match entry {
        Some(raw) => match serde_json::from_slice(raw) {
            Ok(state) => Some(state),
            Err(_) => return Ok(None),
        },
        None => None,
    };
    let existed = parsed.is_some();
    let mut s = parsed.unwrap_or_else(|| State::new(offset, &p.product_id));
    if s.debounce.get() != "[]" || !plain(&s.product_id) || !plain_opt(&s.conversation_id) {
        return Ok(None);
    }
    let n = p.actions.len();
    if existed && offset <= s.last_offset {
        return Ok(Some((sid.unbind(), existed, None, None, None, n))); // a replay
    }
    (s.last_offset, s.last_seen, s.ingested_at) = (offset, now, ingested);
    if !p.product_id.is_empty() {
        s.product_id = Str(Cow::Borrowed(&p.product_id));
    }
    let (mut op, mut request) = (None, None);
    if n > 0 {
        let mut b = Out(Vec::with_capacity(raw.len() + 256));
        encode_payload(&p, &mut b);
        let size = b.0.len() as i64;
        if s.next_batch > s.first_batch && s.pending_bytes + size > max_pending_bytes {
            return Ok(None); // an early summary first: the Python transition writes it
        }
        let seq_from = s.next_seq;
        s.next_seq = seq_from + n as i64;
        if let Some(c) = p.conversation_id.as_deref().filter(|c| !c.is_empty()) {
            s.conversation_id = Some(Str(Cow::Borrowed(c)));
        }
        op = Some(PyBytes::new(py, &operation(&p, &s, seq_from, &b.0, now, ingested)).unbind());
        store.call_method1(
            intern!(py, "put"),
            (&sid, s.next_batch, PyBytes::new(py, &b.0)),
        )?;
        s.next_batch += 1;
        s.pending_actions += n as i64;
        s.pending_bytes += size;
        if s.pending_actions >= threshold {
            let batches =
                store.call_method1(intern!(py, "take"), (&sid, s.first_batch, s.next_batch))?;
            request = Some(
                PyBytes::new(py, &summarize_request(&p.session_id, &mut s, batches, now)?).unbind(),
            );
        }
    }
    let entry = Some(PyBytes::new(py, &s.encode()).unbind());
    Ok(Some((sid.unbind(), existed, entry, op, request, n)))
}

/// `_summarize_request(final=False)`: the request's JSON as orjson writes it, and the
/// state moved past it (its batches stay in their slots for the next to reuse).
fn summarize_request(
    sid: &str,
    s: &mut State,
    batches: Bound<'_, PyAny>,
    now: f64,
) -> PyResult<Vec<u8>> {
    let mut r = Out(Vec::with_capacity(4096));
    r.raw("{\"session_id\":");
    r.string(sid);
    r.raw(",\"product_id\":");
    r.string(&s.product_id);
    r.raw(",\"generation\":");
    r.int(s.generation);
    r.raw(",\"seq_from\":");
    r.int(s.summarized_to + 1);
    r.raw(",\"seq_to\":");
    r.int(s.next_seq - 1);
    r.raw(",\"batches\":[");
    for (i, batch) in batches.try_iter()?.enumerate() {
        if i > 0 {
            r.raw(",");
        }
        r.0.extend_from_slice(batch?.downcast::<PyBytes>()?.as_bytes());
    }
    r.raw("],\"final\":false,\"created_at\":");
    r.float(now);
    r.raw("}");
    s.summarized_to = s.next_seq - 1;
    s.batch_slots = s.batch_slots.max(s.next_batch);
    s.first_batch = 0;
    s.next_batch = 0;
    s.pending_actions = 0;
    s.pending_bytes = 0;
    Ok(r.0)
}

/// The `actions_written` operation, as `_write_batch` writes it with orjson.
fn operation(
    p: &Payload,
    s: &State,
    seq_from: i64,
    body: &[u8],
    now: f64,
    ingested: f64,
) -> Vec<u8> {
    let n = p.actions.len() as i64;
    let seq_to = seq_from + n - 1;
    let mut text = String::with_capacity(256);
    text.push_str("Session ");
    text.push_str(&p.session_id);
    text.push_str(" \u{2014} ");
    if n == 1 {
        text.push_str("action ");
        text.push_str(itoa::Buffer::new().format(seq_from));
    } else {
        text.push_str("actions ");
        text.push_str(itoa::Buffer::new().format(seq_from));
        text.push('-');
        text.push_str(itoa::Buffer::new().format(seq_to));
    }
    let mut acted = p.actions[0].timestamp_end;
    for (seq, a) in (seq_from..).zip(&p.actions) {
        text.push_str("\n[");
        text.push_str(itoa::Buffer::new().format(seq));
        text.push_str("] ");
        text.push_str(&a.kind);
        text.push_str(": ");
        text.push_str(&a.description);
        text.push_str(" \u{2014} ");
        text.push_str(&a.canonical_url);
        if a.timestamp_end > acted {
            acted = a.timestamp_end;
        }
    }
    let mut o = Out(Vec::with_capacity(body.len() + text.len() + 320));
    o.raw("{\"op\":\"actions_written\",\"session_id\":");
    o.string(&p.session_id);
    o.raw(",\"product_id\":");
    o.string(&p.product_id);
    o.raw(",\"conversation_id\":");
    o.opt_string(s.conversation_id.as_deref());
    o.raw(",\"generation\":");
    o.int(s.generation);
    o.raw(",\"seq_from\":");
    o.int(seq_from);
    o.raw(",\"seq_to\":");
    o.int(seq_to);
    o.raw(",\"text\":");
    o.string(&text);
    o.raw(",\"payload\":");
    o.0.extend_from_slice(body);
    o.raw(",\"emitted_at\":");
    o.float(now);
    o.raw(",\"ingested_at\":");
    o.float(ingested);
    o.raw(",\"acted_at\":");
    o.float(acted);
    o.raw("}");
    o.0
}

#[pymodule]
fn agent_context_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(transition, m)?)?;
    Ok(())
}
