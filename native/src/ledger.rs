//! A summarize request's batches counted into the session's ledger: `schemas.ledger`'s
//! `count_batches`, the summarize stage's largest Python loop (a Python pass over the K
//! actions, ~6% of the pipeline worker by py-spy in session 37).
//!
//! It reads the request's decoded `Payload` Structs, each action's fields at once with
//! msgspec's `astuple` (an attribute read through the C API costs more than the Python
//! loop's specialised one; re-reading the request's bytes, 12 µs a request, more than the
//! loop), and changes the ledger (its JSON form, a dict) only once all is read. Whatever it
//! is not sure to count exactly as Python does (an action of another type or layout, a value
//! of another type, a text that is not UTF-8, a bound it does not know), it declines (False)
//! with the ledger untouched, and the Python loop counts it. The texts a ledger keeps and
//! the kinds of an action stay Python's, called through `page`, `entry_text` and `kinds`, with
//! their caches (tests/unit/test_ledger.py compares the two on generated ledgers and requests).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

/// The fields an action's tuple starts with (`SlimAction`'s, `schemas.fast.Action`'s order).
const FIELDS: [&str; 8] = [
    "title",
    "description",
    "canonical_url",
    "index",
    "type",
    "timestamp_start",
    "timestamp_end",
    "raw_url",
];

/// One action read: what the last step needs.
struct Seen<'py> {
    number: i64,
    kind: Bound<'py, PyString>,
    title: Bound<'py, PyString>,
    description: Bound<'py, PyString>,
    page: Bound<'py, PyAny>,
    error: bool,
    key: bool,
}

static ASTUPLE: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

/// Whether `kind` is a msgspec Struct whose fields start as `FIELDS`.
fn struct_of_action(kind: &Bound<'_, PyType>) -> PyResult<bool> {
    let Ok(fields) = kind.getattr(intern!(kind.py(), "__struct_fields__")) else {
        return Ok(false);
    };
    let Ok(fields) = fields.downcast_into::<PyTuple>() else {
        return Ok(false);
    };
    if fields.len() < FIELDS.len() {
        return Ok(false);
    }
    for (at, name) in FIELDS.iter().enumerate() {
        if fields
            .get_item(at)?
            .downcast::<PyString>()
            .map_or(true, |f| f != *name)
        {
            return Ok(false);
        }
    }
    Ok(true)
}

fn float(value: &Bound<'_, PyAny>) -> Option<f64> {
    value.downcast_exact::<PyFloat>().ok().map(|f| f.value())
}

/// A str that is UTF-8 (a lone surrogate is not: the text joined for `kinds`).
fn text<'py>(value: Bound<'py, PyAny>) -> Option<Bound<'py, PyString>> {
    let s = value.downcast_into_exact::<PyString>().ok()?;
    s.to_str().ok()?;
    Some(s)
}

/// An int far enough from i64's bounds that no request's counts can overflow it.
fn int(value: &Bound<'_, PyAny>) -> Option<i64> {
    let v: i64 = value.downcast_exact::<PyInt>().ok()?.extract().ok()?;
    (-(1 << 62)..1 << 62).contains(&v).then_some(v)
}

/// `count_batches(ledger, ((b.actions, b.forwarded_at or created_at) for b in batches),
/// seq_from, limits)`; False: declined, the ledger untouched.
#[pyfunction]
pub(crate) fn count_batches<'py>(
    py: Python<'py>,
    ledger: &Bound<'py, PyAny>,
    batches: &Bound<'py, PyAny>,
    start: (Bound<'py, PyAny>, Bound<'py, PyAny>), // created_at, seq_from
    bounds: (i64, i64, i64),                       // top pages, errors kept, key actions kept
    texts: (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>), // kinds, page, entry
) -> PyResult<bool> {
    let ((created_at, seq_from), (top_pages, keep_errors, keep_keys)) = (start, bounds);
    let (kinds, page, entry_text) = texts;
    let (Ok(ledger), Ok(batches), Some(created_at), Some(seq_from)) = (
        ledger.downcast_exact::<PyDict>(),
        batches.downcast_exact::<PyList>(),
        float(&created_at),
        int(&seq_from),
    ) else {
        return Ok(false);
    };
    if top_pages < 1 || keep_errors < 0 || keep_keys < 0 {
        return Ok(false);
    }
    // 1. Read the ledger: every value it changes must be of the type Python's loop leaves.
    macro_rules! read {
        ($name:literal, $how:expr) => {
            match ledger.get_item(intern!(py, $name))?.as_ref().and_then($how) {
                Some(v) => v,
                None => return Ok(false),
            }
        };
    }
    let mut first_at = read!("first_at", float);
    let mut last_at = read!("last_at", float);
    let total_batches = read!("batches", int);
    let total_actions = read!("actions", int);
    let mut other_pages = read!("other_page_actions", int);
    let errors_total = read!("errors_total", int);
    let keys_total = read!("key_actions_total", int);
    let pages = read!("pages", |v: &Bound<'py, PyAny>| v
        .downcast_exact::<PyDict>()
        .ok()
        .cloned());
    let errors = read!("errors", |v: &Bound<'py, PyAny>| v
        .downcast_exact::<PyList>()
        .ok()
        .cloned());
    let keys = read!("key_actions", |v: &Bound<'py, PyAny>| v
        .downcast_exact::<PyList>()
        .ok()
        .cloned());
    let mut first_step = read!("first_step", |v: &Bound<'py, PyAny>| Some(v.clone()));
    if ledger.get_item(intern!(py, "last_step"))?.is_none()
        || !pages.values().iter().all(|count| int(&count).is_some())
    {
        return Ok(false);
    }

    // 2. The actions: times, pages and kinds (Python's functions, pure and cached).
    let astuple = ASTUPLE.get_or_try_init(py, || {
        PyResult::Ok(py.import("msgspec.structs")?.getattr("astuple")?.unbind())
    })?;
    let astuple = astuple.bind(py);
    let mut known: Option<Bound<'py, PyType>> = None; // the action type checked last
    let mut seen: Vec<Seen<'py>> = Vec::new();
    let (mut seq, mut counted) = (seq_from, 0i64);
    let mut line = String::new();
    for batch in batches.iter() {
        let Ok(actions) = batch
            .getattr(intern!(py, "actions"))?
            .downcast_into_exact::<PyList>()
        else {
            return Ok(false);
        };
        if actions.is_empty() {
            continue;
        }
        let Some(forwarded) = float(&batch.getattr(intern!(py, "forwarded_at"))?) else {
            return Ok(false);
        };
        let now = if forwarded != 0.0 {
            forwarded
        } else {
            created_at
        };
        counted += 1;
        for action in actions.iter() {
            let kind_of = action.get_type();
            if !known.as_ref().is_some_and(|k| k.is(&kind_of)) {
                if !struct_of_action(&kind_of)? {
                    return Ok(false);
                }
                known = Some(kind_of);
            }
            let fields = astuple.call1((&action,))?.downcast_into::<PyTuple>()?;
            let text = |at: usize| fields.get_item(at).ok().and_then(text);
            let (Some(title), Some(description), Some(canonical), Some(kind), Some(raw_url)) =
                (text(0), text(1), text(2), text(4), text(7))
            else {
                return Ok(false);
            };
            let (Some(start), Some(end)) =
                (float(&fields.get_item(5)?), float(&fields.get_item(6)?))
            else {
                return Ok(false);
            };
            if first_at == 0.0 {
                first_at = if start != 0.0 {
                    start
                } else if end != 0.0 {
                    end
                } else {
                    now
                };
            }
            let until = if end != 0.0 {
                end
            } else if start != 0.0 {
                start
            } else {
                now
            };
            if until > last_at {
                last_at = until; // max(last_at, until): the first of equals
            }
            line.clear();
            for part in [
                kind.to_str()?,
                ": ",
                title.to_str()?,
                " ",
                description.to_str()?,
            ] {
                line.push_str(part);
            }
            let (error, key): (bool, bool) = kinds.call1((PyString::new(py, &line),))?.extract()?;
            let url = if canonical.to_str()?.is_empty() {
                raw_url
            } else {
                canonical
            };
            let page = page.call1((url,))?;
            seen.push(Seen {
                number: seq,
                kind,
                title,
                description,
                page,
                error,
                key,
            });
            seq += 1;
        }
    }
    let Some(last) = seen.len().checked_sub(1) else {
        return Ok(true);
    }; // no action: no change
    let errors_found = seen.iter().filter(|s| s.error).count() as i64;
    let keys_found = seen.iter().filter(|s| s.key).count() as i64;

    // 3. Apply, in the order Python's loop does (the pages' order is the JSON's).
    let entry = |s: &Seen<'py>| -> PyResult<Bound<'py, PyDict>> {
        let what = if s.description.to_str()?.is_empty() {
            &s.title
        } else {
            &s.description
        };
        let e = PyDict::new(py);
        e.set_item(intern!(py, "seq"), s.number)?;
        e.set_item(intern!(py, "text"), entry_text.call1((&s.kind, what))?)?;
        Ok(e)
    };
    for s in &seen {
        if let Some(count) = pages.get_item(&s.page)? {
            pages.set_item(&s.page, count.extract::<i64>()? + 1)?;
        } else {
            if pages.len() as i64 >= top_pages {
                // The least visited page (the earliest among ties) makes room.
                let mut least: Option<(Bound<'py, PyAny>, i64)> = None;
                for (name, count) in pages.iter() {
                    let count = count.extract::<i64>()?;
                    if least.as_ref().is_none_or(|(_, c)| count < *c) {
                        least = Some((name, count));
                    }
                }
                if let Some((name, count)) = least {
                    other_pages += count;
                    pages.del_item(name)?;
                }
            }
            pages.set_item(&s.page, 1)?;
        }
        if first_step.is_none() {
            first_step = entry(s)?.into_any();
            ledger.set_item(intern!(py, "first_step"), &first_step)?;
        }
    }
    ledger.set_item(intern!(py, "other_page_actions"), other_pages)?;
    ledger.set_item(intern!(py, "batches"), total_batches + counted)?;
    ledger.set_item(intern!(py, "actions"), total_actions + (seq - seq_from))?;
    ledger.set_item(intern!(py, "first_at"), first_at)?;
    ledger.set_item(intern!(py, "last_at"), last_at)?;
    for (name, entries, keep, found, total, error) in [
        (
            intern!(py, "errors_total"),
            &errors,
            keep_errors,
            errors_found,
            errors_total,
            true,
        ),
        (
            intern!(py, "key_actions_total"),
            &keys,
            keep_keys,
            keys_found,
            keys_total,
            false,
        ),
    ] {
        ledger.set_item(name, total + found)?;
        let kept = seen.iter().filter(|s| if error { s.error } else { s.key });
        for s in kept.skip((found - keep).max(0) as usize) {
            entries.append(entry(s)?)?;
        }
        let excess = entries.len() as i64 - keep;
        if excess > 0 {
            entries.del_slice(0, excess as usize)?;
        }
    }
    ledger.set_item(intern!(py, "last_step"), entry(&seen[last])?)?;
    Ok(true)
}
