//! The input payload (`schemas.fast.ExactPayload`): read, checked, written.

use pyo3::prelude::*;
use serde::de::Error;

use crate::json::{object, plain, plain_float, plain_opt, printable, Out, Str};

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
// type) is any string but "erase", an erasure request (the transition declines it).
object!(Payload {
    product_id: Str<'a> = "product_id" or Str::default(),
    session_id: Str<'a> = "session_id" or return Err(Error::missing_field("session_id")),
    user_id: Option<Str<'a>> = "user_id" or None,
    email: Option<Str<'a>> = "email" or None,
    actions: Vec<Action<'a>> = "actions" or Vec::new(),
    _count: i64 = "count" or 0,
    forwarded_at: f64 = "forwarded_at" or 0.0,
    conversation_id: Option<Str<'a>> = "conversation_id" or None,
    event: Str<'a> = "type" or Str::default(),
});

/// `[{n}] {type}: {description} — {canonical_url}`: an action as the context's batches
/// (`schemas.actions.numbered_text`, `n` its sequence number) and the default prompt
/// (`action_text`, `n` its index) write it.
pub(crate) fn push_action(out: &mut String, n: i64, a: &Action) {
    out.push('[');
    out.push_str(itoa::Buffer::new().format(n));
    out.push_str("] ");
    out.push_str(&a.kind);
    out.push_str(": ");
    out.push_str(&a.description);
    out.push_str(" \u{2014} ");
    out.push_str(&a.canonical_url);
}

/// The payload's JSON as `schemas.fast.encode_payload` writes its `Payload` Struct.
pub(crate) fn encode_payload(p: &Payload, out: &mut Out) {
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
pub(crate) fn supported(py: Python<'_>, p: &Payload) -> bool {
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
