//! The accumulator's per-payload transition, compiled (`transition.rs`), on a strict
//! JSON reader and orjson's writer (`json.rs`) for the input payload (`payload.rs`).

mod json;
mod payload;
mod transition;

use pyo3::prelude::*;

#[pymodule]
fn agent_context_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(transition::transition, m)?)?;
    Ok(())
}
