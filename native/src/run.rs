//! The accumulator's payloads applied in a row: `transition` for each, and what the stage
//! then does with its result (`Accumulator.apply_messages`), without a Python call per
//! payload: the new batch and entry recorded as `TableBatches.commit` records them through
//! `WriteBehind.set` (each write its own version, in the overlay, the unit's writes and
//! `written`), the operation kept for its partition, the summarize request deferred.
//! It stops at the first payload the transition declines, which the stage applies by the
//! Python path (tests/unit/test_accumulate_run.py holds it to the per-payload path).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::partition::murmur2;
use crate::transition::{apply, batch_key, Limits, Reads};

/// What a run did: the write-behind's version after it, the index it stopped at (the
/// declined payload's, or the end), the actions applied, the replays skipped, the
/// sessions that had no entry before, and the operations by partition.
type Ran<'py> = (
    i64,
    usize,
    usize,
    usize,
    Bound<'py, PyList>,
    Bound<'py, PyList>,
);

/// The write-behind's parts a run writes to (`WriteBehind.run_compiled`).
struct Behind<'a, 'py> {
    overlay: &'a Bound<'py, PyDict>,
    writes: &'a Bound<'py, PyList>,
    table: &'a Bound<'py, PyAny>,
    table_id: &'a Bound<'py, PyAny>,
    version: i64,
}

impl<'py> Behind<'_, 'py> {
    /// `WriteBehind.set(table, key, value, exact=True)`, and `written[key] = value`.
    fn set(
        &mut self,
        py: Python<'py>,
        written: &Bound<'py, PyDict>,
        key: &Bound<'py, PyString>,
        value: &Bound<'py, PyBytes>,
    ) -> PyResult<()> {
        self.version += 1;
        let version = self.version.into_pyobject(py)?;
        let slot = PyTuple::new(py, [self.table_id.as_any(), key.as_any()])?;
        let held = PyTuple::new(py, [value.as_any(), version.as_any()])?;
        self.overlay.set_item(slot, held)?;
        let write = [
            self.table.as_any(),
            key.as_any(),
            value.as_any(),
            version.as_any(),
        ];
        self.writes.append(PyTuple::new(py, write)?)?;
        written.set_item(key, value)
    }
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (overlay, writes, deferred, table, table_id, version, messages, start, lookup, written, kept, summarize_topic, partitions, now, max_actions_per_batch, max_pending_bytes, threshold, max_message_bytes))]
pub(crate) fn transition_run<'py>(
    py: Python<'py>,
    overlay: &Bound<'py, PyDict>,
    writes: &Bound<'py, PyList>,
    deferred: &Bound<'py, PyList>,
    table: &Bound<'py, PyAny>,
    table_id: &Bound<'py, PyAny>,
    version: i64,
    messages: &Bound<'py, PyList>,
    start: usize,
    lookup: &Bound<'py, PyAny>,
    written: &Bound<'py, PyDict>,
    kept: usize,
    summarize_topic: &Bound<'py, PyString>,
    partitions: u32,
    now: f64,
    max_actions_per_batch: usize,
    max_pending_bytes: i64,
    threshold: i64,
    max_message_bytes: usize,
) -> PyResult<Ran<'py>> {
    let limits = Limits {
        max_actions_per_batch,
        max_pending_bytes,
        threshold,
        max_message_bytes,
    };
    let reads = Reads {
        written,
        staged: None, // a run stages nothing: each batch is recorded as it is made
        lookup,
    };
    let mut behind = Behind {
        overlay,
        writes,
        table,
        table_id,
        version,
    };
    let (mut actions, mut replays) = (0, 0);
    let new_sessions = PyList::empty(py);
    // The operations by partition; all under -1 while the producer has no metadata.
    let mut ops: Vec<Vec<Bound<'py, PyTuple>>> = vec![Vec::new(); partitions.max(1) as usize];
    let mut index = start;
    while index < messages.len() {
        let message = messages.get_item(index)?;
        let value = message.getattr(intern!(py, "value"))?;
        let Ok(raw) = value.downcast::<PyBytes>() else {
            break; // None, or not bytes: the Python path's
        };
        let offset: i64 = message.getattr(intern!(py, "offset"))?.extract()?;
        let at: Option<f64> = message.getattr(intern!(py, "timestamp"))?.extract()?;
        let ingested_at = at.filter(|t| *t != 0.0).unwrap_or(0.0); // `ingested_at or 0.0`
        let Some(done) = apply(
            py,
            raw.as_bytes(),
            &reads,
            offset,
            now,
            ingested_at,
            &limits,
        )?
        else {
            break;
        };
        index += 1;
        let Some(entry) = done.entry else {
            replays += 1;
            continue;
        };
        let sid = done.sid;
        if let Some((slot, body)) = done.stage {
            let key = batch_key(py, sid.to_str()?, slot);
            behind.set(py, written, &key, &PyBytes::new(py, &body))?;
        }
        behind.set(py, written, &sid, &PyBytes::new(py, &entry))?;
        if written.len() > kept {
            written.clear(); // as `TableBatches.commit`
        }
        if !done.existed {
            new_sessions.append(&sid)?;
        }
        let key = PyBytes::new(py, sid.to_str()?.as_bytes());
        if let Some(op) = done.op {
            let partition = if partitions == 0 {
                0
            } else {
                (murmur2(key.as_bytes()) & 0x7fff_ffff) % partitions
            };
            let record = PyTuple::new(py, [key.as_any(), PyBytes::new(py, &op).as_any()])?;
            ops[partition as usize].push(record);
        }
        if let Some(request) = done.request {
            let request = PyBytes::new(py, &request);
            let record = [summarize_topic.as_any(), key.as_any(), request.as_any()];
            deferred.append(PyTuple::new(py, record)?)?;
        }
        actions += done.actions;
    }
    let runs = PyList::empty(py);
    for (partition, records) in ops.into_iter().enumerate() {
        if !records.is_empty() {
            let at: i64 = if partitions == 0 {
                -1
            } else {
                partition as i64
            };
            runs.append((at, PyList::new(py, records)?))?;
        }
    }
    Ok((behind.version, index, actions, replays, new_sessions, runs))
}
