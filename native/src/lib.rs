//! The hot paths compiled: the accumulator's per-payload transition (`transition.rs`), and in a row with its writes (`run.rs`), on
//! a strict JSON reader and orjson's writer (`json.rs`) for the input payload
//! (`payload.rs`); Kafka's default partitioner (`partition.rs`); Kafka's record batches
//! written (`batch.rs`), a unit's changelog runs (`changelog.rs`), and read into Faust's messages (`fetch.rs`); a summarize request's
//! actions read once for the summarize stage's ledger, prompt and PII pass (`request.rs`);
//! a sink that delivers nothing, its batches stored from the operations' bytes (`appends.rs`).

mod appends;
mod batch;
mod changelog;
mod fetch;
mod json;
mod partition;
mod payload;
mod request;
mod run;
mod transition;

use pyo3::prelude::*;

#[pymodule]
fn agent_context_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(transition::transition, m)?)?;
    m.add_function(wrap_pyfunction!(run::transition_run, m)?)?;
    m.add_class::<appends::Appends>()?;
    m.add_function(wrap_pyfunction!(partition::partition_of, m)?)?;
    m.add_function(wrap_pyfunction!(changelog::changelog_runs, m)?)?;
    m.add_function(wrap_pyfunction!(batch::record_batches, m)?)?;
    m.add_class::<batch::RecordBatch>()?;
    m.add_function(wrap_pyfunction!(fetch::fetched_messages, m)?)?;
    m.add_function(wrap_pyfunction!(request::read_request, m)?)?;
    m.add_class::<request::RequestSpec>()?;
    Ok(())
}
