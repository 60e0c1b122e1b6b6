//! A sink that delivers nothing, its batches stored from the operations' bytes: the
//! compiled twin of `sinks.context_heads.Heads` (`ContextStore.append_run`).
//!
//! For each session whose context the store has cached (armed by it), the head of that
//! context: its generation, last action, next slot, slots used, and the batches appended
//! since the store last loaded it. `append` reads a run of `actions_written` in order and
//! stores each one that comes right after its session's last action, of its generation,
//! as a slot record; it stops at the first it declines (another operation, input the
//! strict Structs would not take as is, text it would not write as msgspec does, a
//! session not armed or not followed), which the stage applies by the general path. The
//! same keys and records as the Python twin (tests/unit/test_context_append.py).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use serde::de::Error;
use serde_json::value::RawValue;
use std::collections::HashMap;

use crate::json::{object, Out, Str};

// `schemas.fast.WrittenHeader`: an `actions_written` whose payload is skipped unread.
object!(Written {
    op: Str<'a> = "op" or return Err(Error::missing_field("op")),
    session_id: Str<'a> = "session_id" or return Err(Error::missing_field("session_id")),
    _product_id: Str<'a> = "product_id" or Str::default(),
    _conversation_id: Option<Str<'a>> = "conversation_id" or None,
    text: Str<'a> = "text" or return Err(Error::missing_field("text")),
    _payload: &'a RawValue = "payload" or return Err(Error::missing_field("payload")),
    emitted_at: f64 = "emitted_at" or return Err(Error::missing_field("emitted_at")),
    ingested_at: f64 = "ingested_at" or 0.0,
    acted_at: f64 = "acted_at" or 0.0,
    seq_from: i64 = "seq_from" or return Err(Error::missing_field("seq_from")),
    seq_to: i64 = "seq_to" or return Err(Error::missing_field("seq_to")),
    generation: i64 = "generation" or 0,
});

type Ages = (Vec<f64>, Vec<f64>, Vec<f64>);

struct Head {
    generation: i64,
    actions_to: i64,
    slot: i64, // the next batch's slot
    used: i64,
    appended: Vec<(i64, i64, String)>,
}

/// Whether msgspec writes `text` as `Out::string` does: no control character but a newline.
fn writable(text: &str) -> bool {
    text.bytes().all(|b| b >= 0x20 || b == b'\n')
}

#[pyclass(module = "agent_context_native")]
pub(crate) struct Appends {
    heads: HashMap<String, Head>,
}

#[pymethods]
impl Appends {
    #[new]
    fn new() -> Self {
        Appends {
            heads: HashMap::new(),
        }
    }

    /// The session's cached context may take appends: its head, nothing appended yet.
    fn arm(&mut self, session_id: &str, generation: i64, actions_to: i64, slot: i64, used: i64) {
        let head = Head {
            generation,
            actions_to,
            slot,
            used,
            appended: Vec::new(),
        };
        self.heads.insert(session_id.to_owned(), head);
    }

    fn disarm(&mut self, session_id: &str) {
        self.heads.remove(session_id);
    }

    fn clear(&mut self) {
        self.heads.clear();
    }

    fn __len__(&self) -> usize {
        self.heads.len()
    }

    /// The batches appended since the session was armed or last taken, and its slots used;
    /// None if there are none.
    fn take(&mut self, session_id: &str) -> Option<(Vec<(i64, i64, String)>, i64)> {
        let head = self.heads.get_mut(session_id)?;
        if head.appended.is_empty() {
            return None;
        }
        Some((std::mem::take(&mut head.appended), head.used))
    }

    /// `values[start:]` stored while each is a batch that follows its session's last:
    /// how many were, their slots' keys and records, and the ages at `now` of their
    /// emission, ingestion (where known) and newest action (where known).
    fn append<'py>(
        &mut self,
        py: Python<'py>,
        values: &Bound<'py, PyList>,
        start: usize,
        now: f64,
    ) -> PyResult<(usize, Vec<String>, Vec<Bound<'py, PyBytes>>, Ages)> {
        let (mut keys, mut records) = (Vec::new(), Vec::new());
        let mut ages: Ages = (Vec::new(), Vec::new(), Vec::new());
        let mut out = Out(Vec::with_capacity(256));
        for item in values.iter().skip(start) {
            let Ok(raw) = item.downcast::<PyBytes>() else {
                break;
            };
            let Ok(w) = serde_json::from_slice::<Written>(raw.as_bytes()) else {
                break;
            };
            if &*w.op != "actions_written"
                || w.seq_from < 1
                || w.seq_to < w.seq_from
                || w.generation < 0
                || !writable(&w.text)
            {
                break;
            }
            let Some(head) = self.heads.get_mut(&*w.session_id) else {
                break;
            };
            if w.seq_from != head.actions_to + 1 || w.generation != head.generation {
                break;
            }
            let slot = head.slot;
            head.slot += 1;
            head.used = head.used.max(slot + 1);
            head.actions_to = w.seq_to;
            head.appended
                .push((w.seq_from, w.seq_to, w.text.to_string()));
            // `sinks.context_heads.slot_key` and the `_Slot` record msgspec encodes.
            let mut key = String::with_capacity(w.session_id.len() + 8);
            key.push_str(&w.session_id);
            key.push_str("\x1fs");
            key.push_str(itoa::Buffer::new().format(slot));
            keys.push(key);
            out.0.clear();
            out.raw("{\"seq_from\":");
            out.int(w.seq_from);
            out.raw(",\"seq_to\":");
            out.int(w.seq_to);
            out.raw(",\"text\":");
            out.string(&w.text);
            out.raw(",\"generation\":");
            out.int(w.generation);
            out.raw("}");
            records.push(PyBytes::new(py, &out.0));
            ages.0.push((now - w.emitted_at).max(0.0));
            if w.ingested_at > 0.0 {
                ages.1.push((now - w.ingested_at).max(0.0));
            }
            if w.acted_at > 0.0 {
                ages.2.push((now - w.acted_at).max(0.0));
            }
        }
        Ok((keys.len(), keys, records, ages))
    }
}
