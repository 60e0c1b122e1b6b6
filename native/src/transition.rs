//! The accumulator's per-payload transition: `agents.accumulate.state`'s `apply_payload`
//! for its common case (one batch, no PII filter, no debounce), from the payload's bytes
//! and the session entry's bytes to the entry, the operation, the stored batch and the
//! summarize request at K, byte for byte what the Python transition writes.
//!
//! It declines (returns None) whatever it is not sure to write exactly as Python does:
//! input the strict Structs would not take, text that is not plain printable, floats
//! outside the range every JSON writer here formats alike, an entry it does not know.
//! The Python transition then handles that payload, so declining is always safe
//! (tests/unit/test_compiled.py compares the two on generated payloads and entries).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

use crate::json::{plain, plain_float, plain_opt, Out, Str};
use crate::payload::{encode_payload, push_action, supported, Payload};

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

/// `apply_payload` for the payload `raw`, on the session's entry (None: a new session),
/// with its batches under `batch_key(session, slot)`. Read, without a Python call where a
/// dict holds it: a batch put in `staged` (this change's), then `written` (what the table
/// is known to hold: a value, or None for a key deleted), then `lookup(key)`. The new
/// batch is put in `staged`, unless the request it completes takes it at once: then it is
/// never written (the Python transition does the same). None: declined, nothing changed;
/// so is a payload whose operation, request or entry would be over `max_message_bytes`
/// (the entry: half of it), for the Python path to refuse (`oversized`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (raw, lookup, written, staged, offset, now, ingested_at, max_actions_per_batch, max_pending_bytes, threshold, max_message_bytes))]
pub(crate) fn transition(
    py: Python<'_>,
    raw: &[u8],
    lookup: &Bound<'_, PyAny>,
    written: &Bound<'_, PyDict>,
    staged: &Bound<'_, PyDict>,
    offset: i64,
    now: f64,
    ingested_at: f64,
    max_actions_per_batch: usize,
    max_pending_bytes: i64,
    threshold: i64,
    max_message_bytes: usize,
) -> PyResult<Option<Applied>> {
    let limits = Limits {
        max_actions_per_batch,
        max_pending_bytes,
        threshold,
        max_message_bytes,
    };
    let reads = Reads {
        written,
        staged: Some(staged),
        lookup,
    };
    let Some(done) = apply(py, raw, &reads, offset, now, ingested_at, &limits)? else {
        return Ok(None);
    };
    let bytes = |out: Vec<u8>| PyBytes::new(py, &out).unbind();
    let n = done.actions;
    let Some(entry) = done.entry else {
        return Ok(Some((done.sid.unbind(), done.existed, None, None, None, n)));
        // a replay
    };
    if let Some((slot, body)) = done.stage {
        staged.set_item(
            batch_key(py, &done.sid.to_str()?, slot),
            PyBytes::new(py, &body),
        )?;
    }
    Ok(Some((
        done.sid.unbind(),
        done.existed,
        Some(bytes(entry)),
        done.op.map(bytes),
        done.request.map(bytes),
        n,
    )))
}

/// The accumulator's limits (`agents.accumulate.state.Limits`, and the broker's message
/// limit, past which a payload is declined for the Python path's size guard).
pub(crate) struct Limits {
    pub(crate) max_actions_per_batch: usize,
    pub(crate) max_pending_bytes: i64,
    pub(crate) threshold: i64,
    pub(crate) max_message_bytes: usize,
}

/// Where a transition reads the session's entry and batches (`read`).
pub(crate) struct Reads<'a, 'py> {
    pub(crate) written: &'a Bound<'py, PyDict>,
    pub(crate) staged: Option<&'a Bound<'py, PyDict>>,
    pub(crate) lookup: &'a Bound<'py, PyAny>,
}

/// One payload applied: `entry` None for a replay (nothing else then); `stage`, the new
/// batch to store under its slot unless the request it completed took it.
pub(crate) struct Outcome<'py> {
    pub(crate) sid: Bound<'py, PyString>,
    pub(crate) existed: bool,
    pub(crate) entry: Option<Vec<u8>>,
    pub(crate) op: Option<Vec<u8>>,
    pub(crate) request: Option<Vec<u8>>,
    pub(crate) stage: Option<(i64, Vec<u8>)>,
    pub(crate) actions: usize,
}

/// `transition`'s work, without its Python results: None, declined.
pub(crate) fn apply<'py>(
    py: Python<'py>,
    raw: &[u8],
    reads: &Reads<'_, 'py>,
    offset: i64,
    now: f64,
    ingested_at: f64,
    limits: &Limits,
) -> PyResult<Option<Outcome<'py>>> {
    let (written, lookup) = (reads.written, reads.lookup);
    // UTF-8 checked once, whole: the reader then borrows each string without its own check.
    let Ok(p) = std::str::from_utf8(raw).map(serde_json::from_str::<Payload>) else {
        return Ok(None);
    };
    let Ok(p) = p else {
        return Ok(None);
    };
    let ingested = if ingested_at != 0.0 { ingested_at } else { now };
    // An erasure request is the stage's (`Accumulator.forget`): declined, the stage looks
    // for one only in what is declined, not in every payload's bytes.
    if &*p.event == "erase"
        || !supported(py, &p)
        || !plain_float(now)
        || !plain_float(ingested)
        || p.actions.len() > limits.max_actions_per_batch
    {
        return Ok(None);
    }
    let sid = PyString::new(py, &p.session_id);
    let found = read(written, None, lookup, &sid)?;
    let entry: Option<&[u8]> = match &found {
        Some(value) => Some(value.extract()?),
        None => None,
    };
    let parsed: Option<State> = match entry {
        Some(raw) => match std::str::from_utf8(raw).map(serde_json::from_str) {
            Ok(Ok(state)) => Some(state),
            _ => return Ok(None),
        },
        None => None,
    };
    let existed = parsed.is_some();
    let mut s = parsed.unwrap_or_else(|| State::new(offset, &p.product_id));
    if s.debounce.get() != "[]" || !plain(&s.product_id) || !plain_opt(&s.conversation_id) {
        return Ok(None);
    }
    let n = p.actions.len();
    let mut done = Outcome {
        sid,
        existed,
        entry: None,
        op: None,
        request: None,
        stage: None,
        actions: n,
    };
    if existed && offset <= s.last_offset {
        return Ok(Some(done)); // a replay
    }
    (s.last_offset, s.last_seen, s.ingested_at) = (offset, now, ingested);
    if !p.product_id.is_empty() {
        s.product_id = Str(Cow::Borrowed(&p.product_id));
    }
    if n > 0 {
        let mut b = Out(Vec::with_capacity(raw.len() + 256));
        encode_payload(&p, &mut b);
        let size = b.0.len() as i64;
        if s.next_batch > s.first_batch && s.pending_bytes + size > limits.max_pending_bytes {
            return Ok(None); // an early summary first: the Python transition writes it
        }
        let seq_from = s.next_seq;
        s.next_seq = seq_from + n as i64;
        if let Some(c) = p.conversation_id.as_deref().filter(|c| !c.is_empty()) {
            s.conversation_id = Some(Str(Cow::Borrowed(c)));
        }
        done.op = Some(operation(&p, &s, seq_from, &b.0, now, ingested));
        let slot = s.next_batch;
        s.next_batch += 1;
        s.pending_actions += n as i64;
        s.pending_bytes += size;
        if s.pending_actions < limits.threshold {
            done.stage = Some((slot, b.0));
        } else {
            let mut batches = Vec::with_capacity((slot - s.first_batch) as usize);
            for index in s.first_batch..slot {
                let key = batch_key(py, &p.session_id, index);
                match read(written, reads.staged, lookup, &key)? {
                    Some(body) => batches.push(body),
                    None => {
                        let sid: &str = &p.session_id;
                        return Err(PyRuntimeError::new_err(format!(
                            "session {sid}: pending batch {index} is missing"
                        )));
                    }
                }
            }
            let mut earlier = Vec::with_capacity(batches.len() + 1);
            for body in &batches {
                earlier.push(body.downcast::<PyBytes>()?.as_bytes());
            }
            earlier.push(&b.0);
            done.request = Some(summarize_request(&p.session_id, &mut s, &earlier, now));
        }
    }
    let entry = s.encode();
    let max = limits.max_message_bytes;
    let over = |out: &Option<Vec<u8>>| out.as_ref().is_some_and(|o| o.len() > max);
    if entry.len() > max / 2 || over(&done.op) || over(&done.request) {
        return Ok(None); // checked here, not per payload in Python: 1.2% of a worker (py-spy)
    }
    done.entry = Some(entry);
    Ok(Some(done))
}

/// `_summarize_request(final=False)`: the request's JSON as orjson writes it, and the
/// state moved past it (its batches stay in their slots for the next to reuse).
fn summarize_request(sid: &str, s: &mut State, batches: &[&[u8]], now: f64) -> Vec<u8> {
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
    for (i, batch) in batches.iter().enumerate() {
        if i > 0 {
            r.raw(",");
        }
        r.0.extend_from_slice(batch);
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
    r.0
}

/// `streams.tables.batch_key(session, index)`.
pub(crate) fn batch_key<'py>(py: Python<'py>, session: &str, index: i64) -> Bound<'py, PyString> {
    let mut key = String::with_capacity(session.len() + 8);
    key.push_str(session);
    key.push('\x1f');
    key.push_str(itoa::Buffer::new().format(index));
    PyString::new(py, &key)
}

/// The value under `key`: from `staged` (if given and not None there), else `written`
/// (None there: deleted), else `lookup(key)`; None for no value.
fn read<'py>(
    written: &Bound<'py, PyDict>,
    staged: Option<&Bound<'py, PyDict>>,
    lookup: &Bound<'py, PyAny>,
    key: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Some(value) = staged.map(|d| d.get_item(key)).transpose()?.flatten() {
        if !value.is_none() {
            return Ok(Some(value));
        }
    }
    let value = match written.get_item(key)? {
        Some(value) => value,
        None => lookup.call1((key,))?,
    };
    Ok(if value.is_none() { None } else { Some(value) })
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
        text.push('\n');
        push_action(&mut text, seq, a);
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
