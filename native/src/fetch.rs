//! A fetched partition's records (Kafka's message format v2, uncompressed) read straight
//! into Faust's consumer messages: what aiokafka's `PartitionRecords` and Faust's
//! `_to_message` do through a `ConsumerRecord` per record (~3.5 µs a record in Python).
//!
//! `streams._faust.fetch` hands it the bytes of a diverted topic's fetch; it answers None
//! for anything it does not read exactly as aiokafka does (another magic, a codec, a bad
//! CRC, a malformed record), and aiokafka reads those as before
//! (tests/unit/test_fetched_messages.py compares the two on generated batches).

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple, PyType};

const LOG_OVERHEAD: usize = 12; // base offset, length
const HEADER_SIZE: usize = 61;
const CODEC_MASK: i16 = 0x07;
const TIMESTAMP_TYPE_MASK: i16 = 0x08;
const CONTROL_MASK: i16 = 0x20;

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<i64> {
        let mut value: u64 = 0;
        let mut shift = 0;
        loop {
            let byte = *self.data.get(self.pos)?;
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
        Some(((value >> 1) as i64) ^ -((value & 1) as i64))
    }

    /// A length-prefixed field: None for a length of -1 (null), an error past the end.
    fn field(&mut self) -> Option<Option<&'a [u8]>> {
        let len = self.varint()?;
        if len == -1 {
            return Some(None);
        }
        let len = usize::try_from(len).ok()?;
        let bytes = self.data.get(self.pos..self.pos.checked_add(len)?)?;
        self.pos += len;
        Some(Some(bytes))
    }
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// One record's fields, as aiokafka's `DefaultRecord` gives them.
struct Record<'a> {
    offset: i64,
    timestamp: i64,
    timestamp_type: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

/// The records of `raw` at or past `fetch_offset` (the position after each is its offset
/// + 1), and the position after the last batch; None where aiokafka must read it.
#[allow(clippy::type_complexity)]
fn parse(raw: &[u8], fetch_offset: i64, check_crcs: bool) -> Option<(Vec<Record<'_>>, i64)> {
    let mut out = Vec::new();
    let mut next = fetch_offset;
    let mut pos = 0;
    while raw.len() - pos >= LOG_OVERHEAD {
        let base_offset = be_i64(raw, pos);
        let length = usize::try_from(be_i32(raw, pos + 8)).ok()?;
        let end = pos + LOG_OVERHEAD + length;
        if end > raw.len() {
            break; // a batch cut short by the fetch's size: fetched again from there
        }
        let batch = &raw[pos..end];
        if batch.len() < HEADER_SIZE || batch[16] != 2 {
            return None;
        }
        if check_crcs {
            let stored = u32::from_be_bytes(batch[17..21].try_into().unwrap());
            if crc32c::crc32c(&batch[21..]) != stored {
                return None; // aiokafka raises CorruptRecordException
            }
        }
        let attributes = be_i16(batch, 21);
        if attributes & CODEC_MASK != 0 {
            return None;
        }
        let batch_next = base_offset + i64::from(be_i32(batch, 23)) + 1;
        if attributes & CONTROL_MASK != 0 {
            next = batch_next;
            pos = end;
            continue;
        }
        let first_timestamp = be_i64(batch, 27);
        let max_timestamp = be_i64(batch, 35);
        let log_append = attributes & TIMESTAMP_TYPE_MASK != 0;
        let timestamp_type = i64::from(log_append);
        let count = be_i32(batch, 57);
        let mut reader = Reader {
            data: batch,
            pos: HEADER_SIZE,
        };
        for _ in 0..count {
            let len = usize::try_from(reader.varint()?).ok()?;
            let record_end = reader.pos.checked_add(len)?;
            if record_end > batch.len() {
                return None;
            }
            let mut r = Reader {
                data: &batch[..record_end],
                pos: reader.pos + 1,
            }; // attributes
            let timestamp_delta = r.varint()?;
            let offset = base_offset + r.varint()?;
            let key = r.field()?;
            let value = r.field()?;
            let header_count = usize::try_from(r.varint()?).ok()?;
            let mut headers = Vec::with_capacity(header_count.min(64));
            for _ in 0..header_count {
                let name = std::str::from_utf8(r.field()??).ok()?;
                headers.push((name, r.field()?));
            }
            reader.pos = record_end;
            if offset < next {
                continue; // before the fetch's offset: aiokafka skips it
            }
            let timestamp = if log_append {
                max_timestamp
            } else {
                first_timestamp + timestamp_delta
            };
            next = offset + 1;
            let record = Record {
                offset,
                timestamp,
                timestamp_type,
                key,
                value,
                headers,
            };
            out.push(record);
        }
        next = batch_next;
        pos = end;
    }
    Some((out, next))
}

fn py_bytes(py: Python<'_>, v: Option<&[u8]>) -> PyObject {
    v.map_or_else(|| py.None(), |b| PyBytes::new(py, b).into_any().unbind())
}

fn size(v: Option<&[u8]>) -> i64 {
    v.map_or(-1, |b| b.len() as i64)
}

/// Faust's `ConsumerMessage` for one record, its attributes set as `_to_message` sets them
/// (allocated without running `__init__`, whose keyword handling cost more than the rest).
#[allow(clippy::too_many_arguments)]
fn message<'py>(
    py: Python<'py>,
    cls: &Bound<'py, PyType>,
    topic: &Bound<'py, PyString>,
    partition: &Bound<'py, PyAny>,
    tp: &Bound<'py, PyAny>,
    record: &Record<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: PyType_GenericAlloc returns a new reference to a zeroed instance of `cls` (a
    // Python class with __slots__, GC-tracked as its flags say), or NULL with an exception.
    let obj = unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyType_GenericAlloc(cls.as_type_ptr(), 0))?
    };
    let headers = PyTuple::new(
        py,
        record
            .headers
            .iter()
            .map(|(name, value)| (PyString::new(py, name), py_bytes(py, *value))),
    )?;
    let none = py.None();
    obj.setattr(intern!(py, "topic"), topic)?;
    obj.setattr(intern!(py, "partition"), partition)?;
    obj.setattr(intern!(py, "offset"), record.offset)?;
    obj.setattr(intern!(py, "timestamp"), record.timestamp as f64 / 1000.0)?;
    obj.setattr(intern!(py, "timestamp_type"), record.timestamp_type)?;
    obj.setattr(intern!(py, "headers"), headers)?;
    obj.setattr(intern!(py, "key"), py_bytes(py, record.key))?;
    obj.setattr(intern!(py, "value"), py_bytes(py, record.value))?;
    obj.setattr(intern!(py, "checksum"), &none)?;
    obj.setattr(intern!(py, "serialized_key_size"), size(record.key))?;
    obj.setattr(intern!(py, "serialized_value_size"), size(record.value))?;
    obj.setattr(intern!(py, "acked"), false)?;
    obj.setattr(intern!(py, "refcount"), 0)?;
    obj.setattr(intern!(py, "tp"), tp)?;
    obj.setattr(intern!(py, "tracked"), false)?; // ConsumerMessage.use_tracking
    obj.setattr(intern!(py, "time_in"), &none)?;
    obj.setattr(intern!(py, "time_out"), &none)?;
    obj.setattr(intern!(py, "time_total"), &none)?;
    obj.setattr(intern!(py, "generation_id"), &none)?; // set when they are taken
    Ok(obj)
}

/// `raw` (a fetch's record set for `tp`) from `fetch_offset`: Faust `cls` messages and the
/// position after the whole set; None where aiokafka must read it.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn fetched_messages<'py>(
    py: Python<'py>,
    raw: &[u8],
    fetch_offset: i64,
    tp: &Bound<'py, PyTuple>,
    cls: &Bound<'py, PyType>,
    check_crcs: bool,
) -> PyResult<Option<(Vec<Bound<'py, PyAny>>, i64)>> {
    let Some((records, next)) = parse(raw, fetch_offset, check_crcs) else {
        return Ok(None);
    };
    let topic = tp.get_item(0)?.downcast_into::<PyString>()?;
    let partition = tp.get_item(1)?;
    let messages = records
        .iter()
        .map(|record| message(py, cls, &topic, &partition, tp.as_any(), record))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(Some((messages, next)))
}
