//! `message_history_native.rows_from_raw`: raw `mastra_messages` BSON documents to recalled rows' bytes.
//!
//! The native twin of `storage/row_codec.py`'s `rows_from_raw_py` (the reference, which asks
//! `storage/recalled_rows.py`'s `row_from_doc`). Per document it answers the same
//! `(id, createdAt ms, role, type, enriched JSON)` or None. None means "not sure": the Python side then lets the
//! reference decide that row, so this code may refuse more than the reference, never answer differently.
//! It answers only for the plain shape: exactly the projected fields with the expected BSON types, and a
//! `content` string that `schemas/canonical.py` would call canonical, checked here on a conservative subset
//! (integers of at most 18 digits, no floats, only the escapes pydantic-core writes).
//!
//! `FINGERPRINT` is `storage.row_codec.codec_fingerprint()` of the models this mirrors
//! (src/fingerprint.rs, generated): the service refuses this module when its models have changed since.

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::collections::HashMap;

use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

mod canonical;
mod fingerprint;
mod owner;
mod plain;
mod prescan;
mod row;
mod split;

/// Set by `_panic_next_call_for_tests`; the next `rows_from_raw` call panics.
static PANIC_NEXT: AtomicBool = AtomicBool::new(false);

/// Test only: make the next `rows_from_raw` call panic (PyO3 raises `PanicException`, a `BaseException`),
/// so tests/unit/test_row_codec_native.py can show the service's wrapper lets the reference decide instead.
/// No stored row or setting reaches it: only a direct call from Python.
#[pyfunction]
fn _panic_next_call_for_tests() {
    PANIC_NEXT.store(true, Ordering::SeqCst);
}

/// Per raw document, `(id, ms, role, type or None, enriched JSON)` or None (not sure: the reference decides).
#[pyfunction]
fn rows_from_raw<'py>(py: Python<'py>, docs: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    if PANIC_NEXT.swap(false, Ordering::SeqCst) {
        panic!("rows_from_raw: the test-only panic (_panic_next_call_for_tests)");
    }
    let out = PyList::empty(py);
    let mut buf: Vec<u8> = Vec::with_capacity(2048);
    for item in docs.try_iter()? {
        let item = item?;
        let parsed = match item.cast::<PyBytes>() {
            Ok(bytes) => row::parse(bytes.as_bytes()),
            Err(_) => None, // a bytes-like the reference reads: its decision
        };
        match parsed {
            Some(r) if row::write_enriched(&r, &mut buf) => {
                let tuple = PyTuple::new(
                    py,
                    [
                        r.id.into_pyobject(py)?.into_any(),
                        r.ms.into_pyobject(py)?.into_any(),
                        r.role.into_pyobject(py)?.into_any(),
                        match r.kind {
                            Some(kind) => kind.into_pyobject(py)?.into_any(),
                            None => py.None().into_bound(py),
                        },
                        PyBytes::new(py, &buf).into_any(),
                    ],
                )?;
                out.append(tuple)?;
            }
            _ => out.append(py.None())?,
        }
    }
    Ok(out)
}

/// Per raw document, `(thread_id, resourceId or None)` read from its top level, or None (not sure: the Python
/// route, `storage/raw_owner.py`, decides). src/owner.rs says when it is sure.
#[pyfunction]
fn owners_from_raw<'py>(py: Python<'py>, docs: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for item in docs.try_iter()? {
        let item = item?;
        let found = match item.cast::<PyBytes>() {
            Ok(bytes) => owner::owner(bytes.as_bytes()),
            Err(_) => None,
        };
        match found {
            Some((thread, resource)) => {
                let resource = match resource {
                    Some(r) => r.into_pyobject(py)?.into_any(),
                    None => py.None().into_bound(py),
                };
                out.append(PyTuple::new(
                    py,
                    [thread.into_pyobject(py)?.into_any(), resource],
                )?)?;
            }
            None => out.append(py.None())?,
        }
    }
    Ok(out)
}

/// The recall's `$in` reply grouped into its threads' pages, in one walk: per `(thread_id, resource_id or
/// None, limit or None)` of `wanted` (distinct thread ids), the documents it answers (its thread's, owned by
/// its resource when it names one), at most `limit` of them, in reply order, in `wanted`'s order; the
/// documents are the very objects of `docs`. It is `storage/mongo_recall.py`'s `group_rows_py` (the
/// reference) where every row's owner is sure (src/owner.rs); None as soon as one is not (a row `RawOwner` or
/// a lenient decoding must read), a document is not `bytes`, a thread id repeats or is not a string, a
/// resource is neither a string nor None, or a limit not a non-negative int: the reference decides the batch.
#[pyfunction]
fn group_rows<'py>(
    py: Python<'py>,
    docs: &Bound<'py, PyAny>,
    wanted: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    // per wanted thread: its resource (None: any) and limit (None: all)
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut owners: Vec<(Option<String>, Option<u64>)> = Vec::new();
    for item in wanted.try_iter()? {
        let item = item?;
        let Ok(entry) = item.cast::<PyTuple>() else {
            return Ok(None);
        };
        if entry.len() != 3 {
            return Ok(None);
        }
        let first = entry.get_item(0)?;
        let Some(thread) = first
            .cast::<PyString>()
            .ok()
            .and_then(|t| t.to_str().ok())
            .map(str::to_owned)
        else {
            return Ok(None);
        };
        let resource = entry.get_item(1)?;
        let resource = if resource.is_none() {
            None
        } else {
            match resource
                .cast::<PyString>()
                .ok()
                .and_then(|r| r.to_str().ok())
            {
                Some(r) => Some(r.to_owned()),
                None => return Ok(None),
            }
        };
        let limit = entry.get_item(2)?;
        let limit = if limit.is_none() {
            None
        } else {
            match limit.extract::<u64>() {
                Ok(n) => Some(n),
                Err(_) => return Ok(None),
            }
        };
        if index.insert(thread, owners.len()).is_some() {
            return Ok(None);
        }
        owners.push((resource, limit));
    }
    let mut pages: Vec<Vec<Bound<'py, PyAny>>> = vec![Vec::new(); owners.len()];
    for item in docs.try_iter()? {
        let item = item?;
        let Ok(bytes) = item.cast::<PyBytes>() else {
            return Ok(None);
        };
        let Some((thread, resource)) = owner::owner(bytes.as_bytes()) else {
            return Ok(None);
        };
        let Some(&at) = index.get(thread) else {
            continue;
        };
        let (want, limit) = &owners[at];
        if let Some(want) = want {
            if resource != Some(want.as_str()) {
                continue;
            }
        }
        let page = &mut pages[at];
        if limit.is_none_or(|n| (page.len() as u64) < n) {
            page.push(item.clone());
        }
    }
    let found = pages
        .into_iter()
        .map(|page| PyList::new(py, page))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(Some(PyList::new(py, found)?))
}

/// A plain recall's page decided on its rows' bytes in one call: `plain_page(rows_from_raw(docs)[:read],
/// limit, incoming)` of `storage/row_codec.py` and `message_history/core/recall_plan.py`, without a Python
/// object per row. `docs`: the thread's page (newest first); `incoming`: per input message (in context
/// order) `(createdAt ms or None, id or "")`; `incoming_ids`: the input's ids. Answers
/// `(len(rows), recalled, runs)` only when every document of `docs` is a row this codec is sure of (as
/// `rows_from_raw` answers it) and the page qualifies; None otherwise (a row the reference must read, a
/// document not `bytes`, an argument it cannot read, a page that does not qualify): the caller then takes
/// the reference route, which decides it.
#[pyfunction]
fn plain_runs<'py>(
    py: Python<'py>,
    docs: &Bound<'py, PyAny>,
    read: usize,
    limit: usize,
    incoming: &Bound<'py, PyAny>,
    incoming_ids: &Bound<'py, PyAny>,
) -> PyResult<Option<(usize, usize, Bound<'py, PyList>)>> {
    let mut held: Vec<Bound<'py, PyBytes>> = Vec::new();
    for item in docs.try_iter()? {
        let Ok(bytes) = item?.cast_into::<PyBytes>() else {
            return Ok(None);
        };
        held.push(bytes);
    }
    let mut keys: Vec<(Option<i64>, Bound<'py, PyString>)> = Vec::new();
    for item in incoming.try_iter()? {
        let item = item?;
        let Ok(entry) = item.cast::<PyTuple>() else {
            return Ok(None);
        };
        if entry.len() != 2 {
            return Ok(None);
        }
        let ms = entry.get_item(0)?;
        let ms = if ms.is_none() {
            None
        } else {
            match ms.extract::<i64>() {
                Ok(v) => Some(v),
                Err(_) => return Ok(None),
            }
        };
        let Ok(id) = entry.get_item(1)?.cast_into::<PyString>() else {
            return Ok(None);
        };
        keys.push((ms, id));
    }
    let mut ids: Vec<Bound<'py, PyString>> = Vec::new();
    for item in incoming_ids.try_iter()? {
        let Ok(id) = item?.cast_into::<PyString>() else {
            return Ok(None);
        };
        ids.push(id);
    }
    // a lone surrogate has no UTF-8 form: not sure how it compares, the reference decides
    let mut input: Vec<plain::InputKey<'_>> = Vec::with_capacity(keys.len());
    for (ms, id) in &keys {
        let Ok(id) = id.to_str() else {
            return Ok(None);
        };
        input.push(plain::InputKey { ms: *ms, id });
    }
    let mut input_ids: Vec<&str> = Vec::with_capacity(ids.len());
    for id in &ids {
        let Ok(id) = id.to_str() else {
            return Ok(None);
        };
        input_ids.push(id);
    }
    let count = read.min(held.len());
    let size = limit.min(count);
    let mut page: Vec<plain::PageRow<'_>> = Vec::with_capacity(size);
    let mut scratch: Vec<u8> = Vec::new();
    for (i, bytes) in held.iter().enumerate() {
        // every row of the page read, not only the ones asked for: one the reference must read sends the
        // whole page there (it counts the unreadable ones, whatever the limit)
        let Some(r) = row::parse(bytes.as_bytes()) else {
            return Ok(None);
        };
        let mut body = if i < size {
            Vec::with_capacity(r.content.len() + 256)
        } else {
            std::mem::take(&mut scratch)
        };
        if !row::write_enriched(&r, &mut body) {
            return Ok(None);
        }
        if i < size {
            page.push(plain::PageRow {
                id: r.id,
                ms: r.ms,
                role: r.role,
                body,
            });
        } else {
            scratch = body;
        }
    }
    let Some(runs) = plain::runs(&page, &input, &input_ids) else {
        return Ok(None);
    };
    let runs = PyList::new(py, runs.iter().map(|run| PyBytes::new(py, run)))?;
    Ok(Some((count, size, runs)))
}

/// The documents of the BSON array at `payload[start:end]`, each as bytes, or None when an element is not a
/// document or a size does not fit (`storage/raw_batches.py`'s `array_documents_py`, src/split.rs). `payload`
/// is `bytes` or any C-contiguous byte buffer (the driver's reply is a `memoryview`: read in place, not
/// copied). Bounds outside the payload are a `ValueError` (the caller's wrapper then asks the reference).
#[pyfunction]
fn array_documents<'py>(
    py: Python<'py>,
    payload: &Bound<'py, PyAny>,
    start: usize,
    end: usize,
) -> PyResult<Option<Bound<'py, PyList>>> {
    if let Ok(bytes) = payload.cast::<PyBytes>() {
        return split_list(py, bytes.as_bytes(), start, end);
    }
    let buffer = PyBuffer::<u8>::get(payload)?;
    if !buffer.is_c_contiguous() {
        return Err(PyValueError::new_err(
            "the payload is not one contiguous run of bytes",
        ));
    }
    // SAFETY: a C-contiguous buffer of `len_bytes` bytes at `buf_ptr`, held (with the GIL) until `buffer`
    // drops at the end of this call; nothing here runs Python code that could resize its exporter.
    let p =
        unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) };
    split_list(py, p, start, end)
}

fn split_list<'py>(
    py: Python<'py>,
    p: &[u8],
    start: usize,
    end: usize,
) -> PyResult<Option<Bound<'py, PyList>>> {
    if end == 0 || start > end || end > p.len() {
        return Err(PyValueError::new_err("array bounds outside the payload"));
    }
    match split::array_documents(p, start, end) {
        None => Ok(None),
        Some(spans) => Ok(Some(PyList::new(
            py,
            spans.into_iter().map(|(s, e)| PyBytes::new(py, &p[s..e])),
        )?)),
    }
}

/// May `raw` hold NaN, Infinity or a number too large for a double: exactly `schemas/codec.py`'s
/// `maybe_non_finite_py` (`b"NaN" in raw or b"Infinity" in raw or _MAYBE_HUGE.search(raw)`), in one pass
/// (src/prescan.rs). Only bytes: anything else is a `TypeError`.
#[pyfunction]
fn maybe_non_finite(raw: &[u8]) -> bool {
    prescan::maybe_non_finite(raw)
}

#[pymodule]
fn message_history_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rows_from_raw, m)?)?;
    m.add_function(wrap_pyfunction!(owners_from_raw, m)?)?;
    m.add_function(wrap_pyfunction!(group_rows, m)?)?;
    m.add_function(wrap_pyfunction!(plain_runs, m)?)?;
    m.add_function(wrap_pyfunction!(array_documents, m)?)?;
    m.add_function(wrap_pyfunction!(maybe_non_finite, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_next_call_for_tests, m)?)?;
    m.add("FINGERPRINT", fingerprint::FINGERPRINT)?;
    m.add("MAX_VALUES", canonical::MAX_VALUES)?;
    Ok(())
}
