//! A summarize request's actions read once, from its bytes, for the summarize stage's
//! default passes (`agents.summarize.compiled`): the ledger's facts (what
//! `schemas.ledger.count_batches` counts, as `RequestFacts`' fields), the default prompt's
//! actions (`default_format_actions`), and the distinct texts the default prompt's PII
//! pass reads. No Python object is made per action.
//!
//! It reads strictly: what it takes, the strict Structs of `schemas.fast` take too, with the
//! same values (tests/unit/test_compiled_request.py), so the stage builds the request from
//! its values and decodes its batches only where a Python pass needs them
//! (`agents.summarize.compiled.request_of_read`). It declines (None) what it does not know
//! (an old request's ledger, a batch of another session), and gives no facts for text that
//! is not printable ASCII (where `one_line` changes nothing and `lower()` folds as `(?i)`
//! does), for a time that is negative or -0.0, or for more pages than any ledger keeps: the
//! stage counts those (tests/unit/test_compiled_request.py holds every part to its Python
//! twin).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use regex::Regex;
use serde::de::Error;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::Mutex;

use crate::json::{object, Str};
use crate::payload::{push_action, Action, Payload};

const ENTRY_MAX_CHARS: usize = 120;
const MAX_PAGES: usize = 64; // more distinct pages than a ledger keeps: the stage counts
const KINDS_REMEMBERED: usize = 4096; // lines whose kinds are kept, as `LedgerLimits.kinds`

object!(Request {
    session_id: Str<'a> = "session_id" or return Err(Error::missing_field("session_id")),
    product_id: Str<'a> = "product_id" or Str::default(),
    generation: i64 = "generation" or 0,
    seq_from: i64 = "seq_from" or return Err(Error::missing_field("seq_from")),
    seq_to: i64 = "seq_to" or return Err(Error::missing_field("seq_to")),
    batches: Vec<Payload<'a>> = "batches" or return Err(Error::missing_field("batches")),
    last: bool = "final" or false,
    created_at: f64 = "created_at" or return Err(Error::missing_field("created_at")),
    ledger: Option<&'a RawValue> = "ledger" or None,
});

/// The ledger's limits and patterns, compiled once (`schemas.ledger.LedgerLimits`); no
/// patterns: no facts (a user's, which the compiled regexes may not read as `re` does).
#[pyclass(frozen, module = "agent_context_native")]
pub(crate) struct RequestSpec {
    errors: usize,
    key_actions: usize,
    patterns: Option<(Regex, Regex)>, // (error, key)
    /// (is_error, is_key) by line: a product's actions repeat their texts.
    kinds: Mutex<HashMap<String, (bool, bool)>>,
}

impl RequestSpec {
    fn kinds(&self, line: &str, error: &Regex, key: &Regex) -> (bool, bool) {
        let mut kinds = self.kinds.lock().expect("not poisoned");
        if let Some(&found) = kinds.get(line) {
            return found;
        }
        if kinds.len() >= KINDS_REMEMBERED {
            kinds.clear();
        }
        let found = (error.is_match(line), key.is_match(line));
        kinds.insert(line.to_owned(), found);
        found
    }
}

#[pymethods]
impl RequestSpec {
    #[new]
    #[pyo3(signature = (errors, key_actions, error_pattern=None, key_pattern=None))]
    fn new(
        errors: usize,
        key_actions: usize,
        error_pattern: Option<&str>,
        key_pattern: Option<&str>,
    ) -> PyResult<Self> {
        let compile = |p: &str| {
            Regex::new(p).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
        };
        let patterns = match (error_pattern, key_pattern) {
            (Some(e), Some(k)) => Some((compile(e)?, compile(k)?)),
            _ => None,
        };
        Ok(RequestSpec {
            errors,
            key_actions,
            patterns,
            kinds: Mutex::new(HashMap::new()),
        })
    }
}

fn ascii(s: &str) -> bool {
    s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// A time the ledger compares and keeps as Python does: not negative, not -0.0.
fn plain_time(t: f64) -> bool {
    t > 0.0 || (t == 0.0 && t.is_sign_positive())
}

/// `_entry_text(type, description or title)`, for ASCII text.
fn entry_text(a: &Action) -> String {
    let what: &str = if a.description.is_empty() {
        &a.title
    } else {
        &a.description
    };
    let kind: &str = if a.kind.is_empty() { "action" } else { &a.kind };
    let mut text = format!("{kind}: {what}");
    if text.len() > ENTRY_MAX_CHARS {
        text.truncate(ENTRY_MAX_CHARS - 1);
        text.push('\u{2026}');
    }
    text
}

/// A ledger entry as the ledger holds it: `{"seq": seq, "text": text}`.
fn entry<'py>(py: Python<'py>, seq: i64, a: &Action) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(intern!(py, "seq"), seq)?;
    d.set_item(intern!(py, "text"), entry_text(a))?;
    Ok(d)
}

/// The latest `keep` of `found`, as entries.
fn entries<'py>(
    py: Python<'py>,
    found: &[(i64, &Action)],
    keep: usize,
) -> PyResult<Bound<'py, PyList>> {
    let latest = &found[found.len().saturating_sub(keep)..];
    let list = PyList::empty(py);
    for (seq, a) in latest {
        list.append(entry(py, *seq, a)?)?;
    }
    Ok(list)
}

/// The facts `count_batches` counts from `r`'s batches, as `RequestFacts`' fields; None
/// where the stage must count (see the module).
fn facts<'py>(
    py: Python<'py>,
    spec: &RequestSpec,
    r: &Request,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let Some((error, key)) = spec.patterns.as_ref() else {
        return Ok(None);
    };
    let (mut first_at, mut last_at) = (0.0f64, 0.0f64);
    let mut pages: Vec<(&str, i64)> = Vec::new();
    let (mut errors, mut keys) = (Vec::new(), Vec::new());
    let (mut seq, mut counted) = (r.seq_from, 0i64);
    let mut first: Option<(i64, &Action)> = None;
    let mut last: Option<(i64, &Action)> = None;
    let mut line = String::with_capacity(256);
    for b in &r.batches {
        if b.actions.is_empty() {
            continue;
        }
        counted += 1;
        let now = if b.forwarded_at != 0.0 {
            b.forwarded_at
        } else {
            r.created_at
        };
        for a in &b.actions {
            if !(plain_time(now) && plain_time(a.timestamp_start) && plain_time(a.timestamp_end)) {
                return Ok(None);
            }
            // `start or end or now`, `end or start or now`
            let or = |x: f64, y: f64| {
                if x != 0.0 {
                    x
                } else if y != 0.0 {
                    y
                } else {
                    now
                }
            };
            if first_at == 0.0 {
                first_at = or(a.timestamp_start, a.timestamp_end);
            }
            let at = or(a.timestamp_end, a.timestamp_start);
            if at > last_at {
                last_at = at;
            }
            let url: &str = if a.canonical_url.is_empty() {
                &a.raw_url
            } else {
                &a.canonical_url
            };
            let page = if url.is_empty() {
                "(unknown page)"
            } else {
                url
            };
            if !(ascii(page) && ascii(&a.kind) && ascii(&a.title) && ascii(&a.description)) {
                return Ok(None);
            }
            match pages.iter().position(|(p, _)| *p == page) {
                Some(i) => pages[i].1 += 1,
                None if pages.len() >= MAX_PAGES => return Ok(None),
                None => pages.push((page, 1)),
            }
            first.get_or_insert((seq, a));
            // What the patterns are matched against: "type: title description".
            line.clear();
            for part in [&*a.kind, ": ", &*a.title, " ", &*a.description] {
                line.push_str(part);
            }
            let (is_error, is_key) = spec.kinds(&line, error, key);
            if is_error {
                errors.push((seq, a));
            }
            if is_key {
                keys.push((seq, a));
            }
            last = Some((seq, a));
            seq += 1;
        }
    }
    let (Some((first_seq, first_action)), Some((last_seq, last_action))) = (first, last) else {
        return Ok(None);
    };
    let pages = PyList::new(py, pages)?;
    let fields = (
        (spec.errors, spec.key_actions),
        seq - r.seq_from,
        counted,
        first_at,
        last_at,
        pages,
        entries(py, &errors, spec.errors)?,
        errors.len(),
        entries(py, &keys, spec.key_actions)?,
        keys.len(),
        entry(py, first_seq, first_action)?,
        entry(py, last_seq, last_action)?,
    );
    Ok(Some(fields.into_pyobject(py)?))
}

type Read<'py> = (
    Option<Bound<'py, PyTuple>>, // the facts (`RequestFacts`' fields), None: the stage counts
    String,                      // `default_format_actions(request.batches)`
    Bound<'py, PyList>,          // the distinct descriptions the default prompt reads
    Bound<'py, PyList>,          // the distinct canonical URLs it reads
    Option<String>,              // `conversation_id(request.batches)`
    usize,                       // how many batches
    Head,                        // the other fields
);
/// (seq_from, seq_to, generation, session_id (its batches' too), product_id, final, created_at)
type Head = (i64, i64, i64, String, String, bool, f64);

/// The request `raw` read for the stage's default passes; None where it declines.
#[pyfunction]
pub(crate) fn read_request<'py>(
    py: Python<'py>,
    raw: &[u8],
    spec: &RequestSpec,
) -> PyResult<Option<Read<'py>>> {
    // Checked whole once: the reader then borrows its strings without a check each.
    let Ok(text) = std::str::from_utf8(raw) else {
        return Ok(None);
    };
    let Ok(r) = serde_json::from_str::<Request>(text) else {
        return Ok(None);
    };
    let sid = &*r.session_id;
    if r.ledger.is_some_and(|l| l.get() != "null")
        || sid.is_empty()
        || sid.contains('\x1f')
        || r.batches.iter().any(|b| *b.session_id != *sid)
    {
        return Ok(None);
    }
    let mut actions = String::with_capacity(160 * r.batches.len());
    let (mut descriptions, mut urls): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    let mut conversation: Option<&str> = None;
    let mut n = 0i64;
    for b in &r.batches {
        if let Some(c) = b.conversation_id.as_deref().filter(|c| !c.is_empty()) {
            conversation = Some(c);
        }
        for a in &b.actions {
            n += 1;
            if n > 1 {
                actions.push('\n');
            }
            // f"{n}. {action_text(action)}"
            actions.push_str(itoa::Buffer::new().format(n));
            actions.push_str(". ");
            push_action(&mut actions, a.index, a);
            for (seen, text) in [
                (&mut descriptions, &*a.description),
                (&mut urls, &*a.canonical_url),
            ] {
                if !text.is_empty() && !seen.contains(&text) {
                    seen.push(text);
                }
            }
        }
    }
    let facts = facts(py, spec, &r)?;
    Ok(Some((
        facts,
        actions,
        PyList::new(py, descriptions)?,
        PyList::new(py, urls)?,
        conversation.map(str::to_owned),
        r.batches.len(),
        (
            r.seq_from,
            r.seq_to,
            r.generation,
            sid.to_owned(),
            r.product_id.to_string(),
            r.last,
            r.created_at,
        ),
    )))
}
