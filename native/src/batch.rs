//! Kafka record batches (message format v2) built whole from a round's records: what
//! aiokafka's `BatchBuilder.append` does one record at a time through Python (~0.5 µs a
//! record, 4% of a pipeline worker by py-spy), in one call for the round.
//!
//! A `RecordBatch` is handed to aiokafka's `send_batch` in place of its `BatchBuilder`:
//! it answers the calls aiokafka's `MessageBatch` makes of a builder (`record_count`,
//! `closed`, `append`, `_set_producer_state`, `_build`, `size`). The bytes are the ones
//! aiokafka's builder writes for the same records at the same timestamp
//! (tests/unit/test_record_batches.py compares them).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

const HEADER_SIZE: usize = 61; // aiokafka's HEADER_STRUCT ">qiibIhiqqqhii"
const AFTER_LEN_OFFSET: usize = 12; // base offset (8) and length (4)
const CRC_OFFSET: usize = 17;
const ATTRIBUTES_OFFSET: usize = 21;

/// Kafka's varint: zigzag, then 7 bits a byte, low bits first.
fn put_varint(out: &mut Vec<u8>, value: i64) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(value: i64) -> usize {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

#[pyclass(module = "agent_context_native")]
pub(crate) struct RecordBatch {
    buffer: Vec<u8>, // the header's room, then the records
    count: i32,
    timestamp: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    built: Option<Py<PyBytes>>,
}

impl RecordBatch {
    fn new(timestamp: i64) -> Self {
        let mut buffer = Vec::with_capacity(4096);
        buffer.resize(HEADER_SIZE, 0);
        RecordBatch {
            buffer,
            count: 0,
            timestamp,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: 0, // aiokafka's, until the producer sets its state
            built: None,
        }
    }

    /// The record appended, as aiokafka's builder does; false (nothing written) when it
    /// would take the batch to `batch_size` or past it and the batch holds one already.
    fn push(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, batch_size: usize) -> bool {
        let offset = i64::from(self.count);
        let field = |v: Option<&[u8]>| v.map_or(1, |b| varint_len(b.len() as i64) + b.len());
        // attributes, timestamp delta (always 0: one timestamp a round), offset delta,
        // key, value, no headers
        let body = 1 + 1 + varint_len(offset) + field(key) + field(value) + 1;
        let required = body + varint_len(body as i64);
        // aiokafka's compiled builder refuses a record that would fill the batch exactly
        if self.count > 0 && required + self.buffer.len() >= batch_size {
            return false;
        }
        let out = &mut self.buffer;
        put_varint(out, body as i64);
        out.push(0);
        put_varint(out, 0);
        put_varint(out, offset);
        for part in [key, value] {
            match part {
                Some(bytes) => {
                    put_varint(out, bytes.len() as i64);
                    out.extend_from_slice(bytes);
                }
                None => put_varint(out, -1),
            }
        }
        put_varint(out, 0);
        self.count += 1;
        true
    }

    fn write_header(&mut self) {
        let len = self.buffer.len();
        let h = &mut self.buffer[..HEADER_SIZE];
        h[0..8].copy_from_slice(&0i64.to_be_bytes()); // base offset: the broker's
        h[8..12].copy_from_slice(&((len - AFTER_LEN_OFFSET) as i32).to_be_bytes());
        h[12..16].copy_from_slice(&(-1i32).to_be_bytes()); // no partition leader epoch
        h[16] = 2; // magic
        h[21..23].copy_from_slice(&0i16.to_be_bytes()); // attributes: no codec
        h[23..27].copy_from_slice(&(self.count - 1).to_be_bytes()); // last offset delta
        h[27..35].copy_from_slice(&self.timestamp.to_be_bytes()); // first timestamp
        h[35..43].copy_from_slice(&self.timestamp.to_be_bytes()); // max timestamp
        h[43..51].copy_from_slice(&self.producer_id.to_be_bytes());
        h[51..53].copy_from_slice(&self.producer_epoch.to_be_bytes());
        h[53..57].copy_from_slice(&self.base_sequence.to_be_bytes());
        h[57..61].copy_from_slice(&self.count.to_be_bytes());
        let crc = crc32c::crc32c(&self.buffer[ATTRIBUTES_OFFSET..]);
        self.buffer[CRC_OFFSET..ATTRIBUTES_OFFSET].copy_from_slice(&crc.to_be_bytes());
    }
}

#[pymethods]
impl RecordBatch {
    fn record_count(&self) -> i32 {
        self.count
    }

    /// Always: nothing joins a batch built whole (aiokafka's `send` would otherwise
    /// append to a partition's last open batch).
    fn closed(&self) -> bool {
        true
    }

    fn close(&self) {}

    #[pyo3(signature = (*_args, **_kwargs))]
    fn append(&self, _args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> Option<()> {
        None // closed: aiokafka starts a batch of its own
    }

    fn size(&self, py: Python<'_>) -> usize {
        self.built
            .as_ref()
            .map_or(self.buffer.len(), |b| b.bind(py).as_bytes().len())
    }

    fn _set_producer_state(&mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
    }

    /// The batch's bytes, written once (aiokafka's builder may build once, too).
    fn _build(&mut self, py: Python<'_>) -> Py<PyBytes> {
        if let Some(built) = &self.built {
            return built.clone_ref(py);
        }
        self.write_header();
        let built: Py<PyBytes> = PyBytes::new(py, &self.buffer).unbind();
        self.buffer = Vec::new();
        self.built = Some(built.clone_ref(py));
        built
    }
}

fn bytes_or_none<'a>(item: &'a Bound<'_, PyAny>) -> PyResult<Option<&'a [u8]>> {
    if item.is_none() {
        return Ok(None);
    }
    Ok(Some(item.downcast::<PyBytes>()?.as_bytes()))
}

/// `records` ((key, value) pairs of bytes, the value may be None) in batches of at most
/// `batch_size` bytes (a record larger than that alone in its batch), in order, every
/// record at `timestamp` (ms).
#[pyfunction]
pub(crate) fn record_batches(
    records: &Bound<'_, PyList>,
    batch_size: usize,
    timestamp: i64,
) -> PyResult<Vec<RecordBatch>> {
    let mut out = Vec::new();
    let mut batch = RecordBatch::new(timestamp);
    for item in records.iter() {
        let pair = item.downcast::<PyTuple>()?;
        if pair.len() != 2 {
            return Err(PyTypeError::new_err("a record is a (key, value) pair"));
        }
        let (k, v) = (pair.get_item(0)?, pair.get_item(1)?);
        let (key, value) = (bytes_or_none(&k)?, bytes_or_none(&v)?);
        if !batch.push(key, value, batch_size) {
            out.push(std::mem::replace(&mut batch, RecordBatch::new(timestamp)));
            batch.push(key, value, batch_size); // a first record always fits
        }
    }
    if batch.count > 0 || out.is_empty() {
        out.push(batch);
    }
    Ok(out)
}
