//! `policyport._native`: the Python package's native module. A thin binding: every check, every error and every
//! number comes from the Rust crates (`policyport` for load / act, `policyport-import` for compile,
//! `policyport-torch` for the libtorch executor); this file converts arguments and maps errors to exception
//! classes. The Python-facing API (`policyport.Policy`, `policyport.compile`, the RLlib and SB3 integrations) is
//! documented in `python/policyport/__init__.py` and typed in `_native.pyi`.
//!
//! Why each `Policy` owns one `Session` behind a mutex: a Python object is shared by whoever holds it, while a
//! session is one caller's (recurrent state, scratch buffers). The mutex is held only inside act() with the GIL
//! released (`Python::detach`), so other Python threads run meanwhile; threads that want to act concurrently take
//! `policy.new_session()` each: the same compiled weights, their own state.

use std::sync::{Arc, Mutex, MutexGuard};

use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use policyport::{
    ActMode, Backend, CompiledPolicy, EnvIds, ErrorKind, Observations, PolicyError, Request,
    Session,
};
use policyport_import::{ImportError, StorageDType};
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use pyo3::{create_exception, intern};

create_exception!(
    policyport,
    PolicyportError,
    PyException,
    "Base of every policyport error."
);
create_exception!(
    policyport,
    ArtifactError,
    PolicyportError,
    "The artifact was refused (container, manifest, weights, validation)."
);
create_exception!(
    policyport,
    ObservationError,
    PolicyportError,
    "Observations of the wrong size, dtype or value."
);
create_exception!(
    policyport,
    CallError,
    PolicyportError,
    "The call's other arguments do not fit the policy: batch size, env ids, episode starts, action mask (the \
     core's `call` kind; the C ABI's PP_STATUS_BAD_CALL)."
);
create_exception!(
    policyport,
    BatchError,
    CallError,
    "A batch size out of range."
);
create_exception!(
    policyport,
    EpisodeStartsError,
    CallError,
    "episode_starts that is not one flag per row."
);
create_exception!(
    policyport,
    MemoryLimitError,
    PolicyportError,
    "A call would pass the policy's memory limit."
);
create_exception!(
    policyport,
    NonFiniteOutputError,
    PolicyportError,
    "The policy computed NaN or infinity."
);
create_exception!(
    policyport,
    EnvIdError,
    CallError,
    "Env ids that cannot be used (count, duplicates, limit)."
);
create_exception!(
    policyport,
    ActionMaskError,
    CallError,
    "An action mask (or epsilon) that does not fit the policy: wrong length, a row with no allowed action, a \
     mask for continuous actions."
);
create_exception!(
    policyport,
    StateError,
    PolicyportError,
    "A recurrent-state operation was refused."
);
create_exception!(
    policyport,
    BackendError,
    PolicyportError,
    "The backend failed or cannot do what was asked."
);
create_exception!(
    policyport,
    NotCompiledError,
    BackendError,
    "This build of policyport does not have the backend."
);
create_exception!(
    policyport,
    CompileError,
    PolicyportError,
    "A model could not be compiled."
);
create_exception!(
    policyport,
    UnsupportedModelError,
    CompileError,
    "The model uses something policyport does not read (the message says what, and what to do)."
);
create_exception!(
    policyport,
    MalformedModelError,
    CompileError,
    "The model's files are damaged or not what they claim."
);
create_exception!(
    policyport,
    SpecError,
    CompileError,
    "The import spec (what the outputs mean) does not fit the model."
);

/// The exception of a policy error: chosen by its kind (`PolicyError::kind`, the classification every boundary
/// shares; each class carries it as `kind`), then by the finer variant where Python has a subclass for it.
fn policy_err(e: PolicyError) -> PyErr {
    let msg = e.to_string();
    match (e.kind(), &e) {
        (ErrorKind::Artifact, _) => ArtifactError::new_err(msg),
        (ErrorKind::Observation, _) => ObservationError::new_err(msg),
        (ErrorKind::Call, PolicyError::Batch { .. }) => BatchError::new_err(msg),
        (ErrorKind::Call, PolicyError::EnvIds(_)) => EnvIdError::new_err(msg),
        (ErrorKind::Call, PolicyError::HeadControl(_)) => ActionMaskError::new_err(msg),
        (ErrorKind::Call, PolicyError::State(_)) => EpisodeStartsError::new_err(msg),
        (ErrorKind::Call, _) => CallError::new_err(msg),
        (ErrorKind::State, _) => StateError::new_err(msg),
        (ErrorKind::Backend, PolicyError::NotCompiled { .. }) => NotCompiledError::new_err(msg),
        (ErrorKind::Backend, _) => BackendError::new_err(msg),
        (ErrorKind::TooLarge, _) => MemoryLimitError::new_err(msg),
        (ErrorKind::NonFinite, _) => NonFiniteOutputError::new_err(msg),
        // A kind added to the core after this binding: the base class, until it gets its own.
        _ => PolicyportError::new_err(msg),
    }
}

fn import_err(e: ImportError) -> PyErr {
    let msg = e.to_string();
    match e {
        ImportError::UnsupportedOp { .. } | ImportError::Unsupported { .. } => {
            UnsupportedModelError::new_err(msg)
        }
        ImportError::Malformed(_)
        | ImportError::Pickle(_)
        | ImportError::Format(_)
        | ImportError::ActionBound { .. }
        | ImportError::UnreadWeights { .. } => MalformedModelError::new_err(msg),
        ImportError::Spec(_) => SpecError::new_err(msg),
        ImportError::Golden(_) => CompileError::new_err(msg),
    }
}

fn torch_err(e: policyport_torch::TorchError) -> PyErr {
    use policyport_torch::TorchError as T;
    match e {
        T::Policy(p) => policy_err(p),
        T::NotCompiled => NotCompiledError::new_err(e.to_string()),
        T::Artifact(_) => ArtifactError::new_err(e.to_string()),
        T::NoCuda(_) | T::Unsupported(_) | T::Torch(_) => BackendError::new_err(e.to_string()),
    }
}

/// bytes / bytearray / memoryview → owned bytes; str / os.PathLike → the file's bytes.
fn bytes_or_file(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(path) = obj.extract::<std::path::PathBuf>() {
        return std::fs::read(&path).map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!("cannot read {}: {e}", path.display()))
        });
    }
    let py = obj.py();
    let builtins = py.import(intern!(py, "builtins"))?;
    match builtins.getattr("bytes")?.call1((obj,)) {
        Ok(b) => Ok(b.cast::<PyBytes>()?.as_bytes().to_vec()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{what}: expected bytes, a bytes-like object, or a path (str / os.PathLike), got {}",
            obj.get_type().name()?
        ))),
    }
}

/// A Python value as JSON text: str as given, anything else through `json.dumps` (dicts, lists).
fn json_text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = obj.extract::<String>() {
        return Ok(s);
    }
    let py = obj.py();
    py.import(intern!(py, "json"))?
        .getattr("dumps")?
        .call1((obj,))?
        .extract()
}

fn json_value<'py>(py: Python<'py>, v: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(v).map_err(|e| PolicyportError::new_err(e.to_string()))?;
    py.import(intern!(py, "json"))?
        .getattr("loads")?
        .call1((text,))
}

/// `numpy.ascontiguousarray(x, dtype=...)`: already-contiguous arrays of that dtype come back as they are (no copy).
fn contiguous<'py>(x: &Bound<'py, PyAny>, dtype: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let np = py.import(intern!(py, "numpy"))?;
    let kw = PyDict::new(py);
    kw.set_item("dtype", np.getattr(dtype)?)?;
    np.getattr(intern!(py, "ascontiguousarray"))?
        .call((x,), Some(&kw))
}

/// A sequence of arrays (recurrent state, one per state tensor) as contiguous float32 views, each checked by its
/// full shape `[rows, numel]` before it is copied (a `[numel, rows]` array holds the same count of numbers and
/// was read as rows of another env's state).
fn float32_arrays<'py>(
    seq: &Bound<'py, PyAny>,
    rows: usize,
    states: &[(String, usize)],
) -> PyResult<Vec<numpy::PyReadonlyArrayDyn<'py, f32>>> {
    let py = seq.py();
    let np_shape = py
        .import(intern!(py, "numpy"))?
        .getattr(intern!(py, "shape"))?;
    let arrays: Vec<Bound<'py, PyAny>> = seq.try_iter()?.collect::<PyResult<_>>()?;
    if arrays.len() != states.len() {
        return Err(StateError::new_err(format!(
            "{} state arrays for a policy with {} ({:?})",
            arrays.len(),
            states.len(),
            states.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()
        )));
    }
    arrays
        .iter()
        .zip(states)
        .map(|(a, (name, numel))| {
            let shape: Vec<usize> = np_shape.call1((a,))?.extract()?;
            if shape != [rows, *numel] {
                return Err(StateError::new_err(format!(
                    "state '{name}' of shape {shape:?}; want [{rows}, {numel}] (one row per env)"
                )));
            }
            Ok(contiguous(a, "float32")?
                .cast_into::<PyArrayDyn<f32>>()?
                .readonly())
        })
        .collect()
}

/// The policy's recurrent states as (name, numbers per env).
fn state_sizes(p: &CompiledPolicy) -> Vec<(String, usize)> {
    p.manifest()
        .recurrent
        .as_ref()
        .map(|r| {
            r.states
                .iter()
                .map(|s| (s.name.clone(), s.shape.iter().product()))
                .collect()
        })
        .unwrap_or_default()
}

/// Env ids from any integer sequence or array, each checked to be a u32 (numpy would wrap -1 silently).
fn env_id_list(x: &Bound<'_, PyAny>, batch: usize) -> PyResult<Vec<u32>> {
    // Integers only: numpy would truncate 1.7 to 1 (and NaN to anything) without a word.
    let py = x.py();
    let arr = py
        .import(intern!(py, "numpy"))?
        .getattr(intern!(py, "asarray"))?
        .call1((x,))?;
    let kind: String = arr
        .getattr(intern!(py, "dtype"))?
        .getattr(intern!(py, "kind"))?
        .extract()?;
    if kind != "i" && kind != "u" {
        return Err(EnvIdError::new_err(format!(
            "env_ids must be integers; got dtype {} (floats are not truncated into ids)",
            arr.getattr(intern!(py, "dtype"))?.str()?
        )));
    }
    let a = contiguous(&arr, "int64")?;
    let a = a.cast::<PyArrayDyn<i64>>()?.readonly();
    let ids = a.as_slice()?;
    if a.ndim() != 1 || ids.len() != batch {
        return Err(EnvIdError::new_err(format!(
            "env_ids: {} ids (shape {:?}) for a batch of {batch}",
            ids.len(),
            a.shape()
        )));
    }
    ids.iter()
        .map(|&i| {
            u32::try_from(i).map_err(|_| {
                EnvIdError::new_err(format!("env id {i} is out of range (0 ..= {})", u32::MAX))
            })
        })
        .collect()
}

fn parse_backend(name: &str) -> PyResult<Backend> {
    name.parse::<Backend>().map_err(|_| {
        PyValueError::new_err(format!(
            "unknown backend '{name}': cpu, flex, wgpu, torch or auto"
        ))
    })
}

/// What a loaded policy is: a dataclass-like, read-only record.
#[pyclass(module = "policyport._native", name = "PolicyInfo", frozen, get_all)]
struct PyPolicyInfo {
    name: String,
    backend: String,
    format_version: (u16, u16),
    /// SPEC.md's observation space as a dict.
    observation: Py<PyAny>,
    /// SPEC.md's action space as a dict.
    action: Py<PyAny>,
    obs_len: usize,
    /// The observation's shape per env (a flat length for a Dict observation).
    obs_shape: Vec<usize>,
    obs_dtype: String,
    action_len: usize,
    discrete: bool,
    dist_params_len: usize,
    has_value: bool,
    /// The policy was trained with action masks (MaskablePPO, RLlib's action-masking module): pass
    /// `action_mask=` to act as it was trained (without one, acting is unmasked).
    action_masks: bool,
    /// Recurrent state tensors: (name, numbers per env), in the order `state=` lists take.
    states: Vec<(String, usize)>,
    parameters: usize,
    /// How `backend="auto"` chose, e.g. "auto at batch 64: cpu 12.1 us, wgpu 900.0 us -> cpu"; None otherwise.
    selection: Option<String>,
}

#[pymethods]
impl PyPolicyInfo {
    fn __repr__(&self) -> String {
        format!(
            "PolicyInfo(name={:?}, backend={:?}, format_version={:?}, obs_shape={:?}, obs_dtype={:?}, action_len={}, \
             discrete={}, dist_params_len={}, has_value={}, action_masks={}, states={:?}, parameters={}, selection={:?})",
            self.name,
            self.backend,
            self.format_version,
            self.obs_shape,
            self.obs_dtype,
            self.action_len,
            if self.discrete { "True" } else { "False" },
            self.dist_params_len,
            if self.has_value { "True" } else { "False" },
            if self.action_masks { "True" } else { "False" },
            self.states,
            self.parameters,
            self.selection
        )
    }

    /// Every field as a dict (like `dataclasses.asdict`).
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("name", &self.name)?;
        d.set_item("backend", &self.backend)?;
        d.set_item("format_version", self.format_version)?;
        d.set_item("observation", self.observation.bind(py))?;
        d.set_item("action", self.action.bind(py))?;
        d.set_item("obs_len", self.obs_len)?;
        d.set_item("obs_shape", self.obs_shape.clone())?;
        d.set_item("obs_dtype", &self.obs_dtype)?;
        d.set_item("action_len", self.action_len)?;
        d.set_item("discrete", self.discrete)?;
        d.set_item("dist_params_len", self.dist_params_len)?;
        d.set_item("has_value", self.has_value)?;
        d.set_item("action_masks", self.action_masks)?;
        d.set_item("states", self.states.clone())?;
        d.set_item("parameters", self.parameters)?;
        d.set_item("selection", self.selection.clone())?;
        Ok(d)
    }
}

/// The outputs of one act(), NumPy arrays owned by Python (one copy out of the session's buffers).
#[pyclass(module = "policyport._native", name = "ActResult", frozen, get_all)]
struct PyActResult {
    /// `[batch]` int64 (Discrete), `[batch, n]` int64 (MultiDiscrete) or `[batch, *shape]` float32 (Box).
    actions: Py<PyAny>,
    /// `[batch]` float32, or None without a critic.
    value: Option<Py<PyAny>>,
    /// `[batch, dist_params_len]` float32: logits (concatenated for MultiDiscrete), or mean then log-std.
    dist_inputs: Py<PyAny>,
    /// `[batch]` float32 log-probability of the returned actions, or None where it is not the distribution's
    /// (clipped or squashed Gaussians).
    log_prob: Option<Py<PyAny>>,
    /// With `state=` or `return_state=True`: the next recurrent state, `[batch, numel]` float32 per state.
    state: Option<Py<PyAny>>,
}

#[pymethods]
impl PyActResult {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "ActResult(actions={}, value={}, log_prob={})",
            self.actions.bind(py).repr()?,
            match &self.value {
                Some(v) => v.bind(py).repr()?.to_string(),
                None => "None".into(),
            },
            match &self.log_prob {
                Some(v) => v.bind(py).repr()?.to_string(),
                None => "None".into(),
            },
        ))
    }
}

/// A compiled policy on one backend with one session (its recurrent state per env id).
#[pyclass(module = "policyport._native", name = "Policy", frozen)]
struct PyPolicy {
    compiled: Arc<CompiledPolicy>,
    session: Mutex<Session>,
}

/// Observations ready for act(): a borrowed view of a contiguous float32 / uint8 array (no copy), and the batch.
enum ObsView<'py> {
    F32(numpy::PyReadonlyArrayDyn<'py, f32>),
    U8(numpy::PyReadonlyArrayDyn<'py, u8>),
    /// Channels-last frames transposed for a channels-first image policy (a copy, as SB3's predict makes).
    OwnedF32(Vec<f32>),
    OwnedU8(Vec<u8>),
}

impl PyPolicy {
    fn lock(&self) -> MutexGuard<'_, Session> {
        // act() never panics (every failure is a typed error), so a poisoned lock can only come from a bug;
        // the session's state is still consistent (a refused call changes nothing), so go on with it.
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An action mask as `[batch, mask_len]` booleans, its full shape checked before anything is copied or
    /// acted on (a bool array is used without a copy; other dtypes are refused: a float mask is ambiguous).
    fn mask_view<'py>(
        &self,
        mask: &Bound<'py, PyAny>,
        batch: usize,
    ) -> PyResult<numpy::PyReadonlyArrayDyn<'py, bool>> {
        let per_row = self.compiled.head().mask_len();
        if per_row == 0 {
            return Err(ActionMaskError::new_err(
                "action_mask given for a policy with continuous actions (masks are for discrete heads)",
            ));
        }
        let py = mask.py();
        let np = py.import(intern!(py, "numpy"))?;
        let arr = np.getattr(intern!(py, "asarray"))?.call1((mask,))?;
        let dtype = arr.getattr(intern!(py, "dtype"))?.str()?.to_string();
        if dtype != "bool" {
            return Err(ActionMaskError::new_err(format!(
                "action_mask must be a bool array; got dtype {dtype}"
            )));
        }
        let shape: Vec<usize> = arr.getattr(intern!(py, "shape"))?.extract()?;
        if shape != [batch, per_row] {
            return Err(ActionMaskError::new_err(format!(
                "action_mask of shape {shape:?}; this call needs [{batch}, {per_row}] (batch, one flag per \
                 action)"
            )));
        }
        Ok(contiguous(&arr, "bool_")?
            .cast_into::<PyArrayDyn<bool>>()?
            .readonly())
    }

    fn obs_view<'py>(&self, obs: &Bound<'py, PyAny>) -> PyResult<(ObsView<'py>, usize)> {
        let per_env = self.compiled.manifest().observation.raw_len();
        // The array's full shape, read before anything is copied (a broadcast view of 10^9 rows, a few bytes of
        // memory, was made contiguous — 15 GB — before its batch was checked; `numpy.shape` reads an array's shape
        // without a copy): [batch, *the policy's observation shape] (a Discrete observation as [batch] or
        // [batch, 1]; a Dict's parts flattened and concatenated). The same count of numbers in another layout was
        // read wrong before; channels-last frames for a channels-first image policy (SB3's CnnPolicy) are
        // transposed below, as SB3's predict does.
        let py = obs.py();
        let shape: Vec<usize> = py
            .import(intern!(py, "numpy"))?
            .getattr(intern!(py, "shape"))?
            .call1((obs,))?
            .extract()
            .map_err(|_| ObservationError::new_err("observations must be an array of numbers"))?;
        let space = &self.compiled.manifest().observation;
        let (batch, layout) = policyport::layout_of_shape(space, &shape).map_err(|e| {
            ObservationError::new_err(format!(
                "{e} ({per_env} numbers per env; this policy's observation: {})",
                serde_json::to_string(space).unwrap_or_default()
            ))
        })?;
        if batch == 0 || batch > policyport::MAX_BATCH {
            return Err(BatchError::new_err(format!(
                "a batch of {batch} rows (1 ..= {} per call)",
                policyport::MAX_BATCH
            )));
        }
        let u8_policy =
            self.compiled.manifest().observation.raw_dtype() == policyport::format::ObsDType::U8;
        // uint8 arrays stay bytes for uint8 policies; everything else becomes float32 (a copy only when it is not
        // a contiguous float32 array already).
        let is_u8 = obs
            .getattr(intern!(obs.py(), "dtype"))
            .and_then(|d| d.str().map(|s| s.to_string()))
            .map(|s| s == "uint8")
            .unwrap_or(false);
        let view = if is_u8 && u8_policy {
            ObsView::U8(
                contiguous(obs, "uint8")?
                    .cast::<PyArrayDyn<u8>>()?
                    .readonly(),
            )
        } else {
            ObsView::F32(
                contiguous(obs, "float32")?
                    .cast::<PyArrayDyn<f32>>()?
                    .readonly(),
            )
        };
        let view = match (layout, view) {
            (policyport::ObsLayout::AsIs, v) => v,
            (policyport::ObsLayout::ChannelsLast { c, h, w }, ObsView::F32(a)) => {
                ObsView::OwnedF32(policyport::channels_last_to_first(
                    a.as_slice()?,
                    batch,
                    c,
                    h,
                    w,
                ))
            }
            (policyport::ObsLayout::ChannelsLast { c, h, w }, ObsView::U8(a)) => ObsView::OwnedU8(
                policyport::channels_last_to_first(a.as_slice()?, batch, c, h, w),
            ),
            (_, v) => v,
        };
        Ok((view, batch))
    }

    /// The outputs of one act() as NumPy arrays shaped for the policy's spaces (one copy out of the session).
    fn result<'py>(&self, py: Python<'py>, a: Acted) -> PyResult<PyActResult> {
        let head = self.compiled.head();
        let action = &self.compiled.manifest().action;
        let batch = a.batch;
        let actions: Bound<'py, PyAny> = if head.is_discrete() {
            let arr = PyArray1::from_vec(py, a.discrete);
            match action {
                policyport::format::ActionSpace::Discrete { .. } => arr.into_any(),
                _ => arr.reshape([batch, head.action_len])?.into_any(),
            }
        } else {
            let mut shape = vec![batch];
            match action {
                policyport::format::ActionSpace::Box { shape: s, .. } => shape.extend(s),
                _ => shape.push(head.action_len),
            }
            PyArray1::from_vec(py, a.continuous)
                .reshape(shape)?
                .into_any()
        };
        let dist_inputs = PyArray1::from_vec(py, a.dist)
            .reshape([batch, head.dist_params_len])?
            .into_any();
        let value = a
            .value
            .map(|v| PyArray1::from_vec(py, v).into_any().unbind());
        let log_prob = a
            .logp
            .map(|l| PyArray1::from_vec(py, l).into_any().unbind());
        let state = match a.state {
            Some(st) => Some(state_list(py, st, batch)?.into_any().unbind()),
            None => None,
        };
        Ok(PyActResult {
            actions: actions.unbind(),
            value,
            dist_inputs: dist_inputs.unbind(),
            log_prob,
            state,
        })
    }
}

/// State tensors (`rows x numel` each) as a list of `[rows, numel]` arrays.
fn state_list<'py>(
    py: Python<'py>,
    st: Vec<Vec<f32>>,
    rows: usize,
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for v in st {
        let n = v.len() / rows.max(1);
        list.append(PyArray1::from_vec(py, v).reshape([rows, n])?)?;
    }
    Ok(list)
}

/// The result of the GIL-free part of act().
struct Acted {
    batch: usize,
    discrete: Vec<i64>,
    continuous: Vec<f32>,
    dist: Vec<f32>,
    /// None: the policy has no value estimate, or the call did not ask for it.
    value: Option<Vec<f32>>,
    logp: Option<Vec<f32>>,
    state: Option<Vec<Vec<f32>>>,
}

#[pymethods]
impl PyPolicy {
    /// Load a `.policy` artifact (bytes, or a path) on a backend: "cpu" (default; `precision` "f32" or "bf16",
    /// the latter on CPUs with AVX512-BF16, else a PolicyError), "flex", "wgpu", "torch" (libtorch; `device`
    /// "cpu" / "cuda" / "cuda:N", `precision` "f32" / "bf16" / "f16"), or "auto" (times the available backends at
    /// `batch` and keeps the fastest; `info.selection` says what it measured).
    /// `threads`: the cpu backend's intra-op threads for this policy's session (see `set_threads`).
    #[staticmethod]
    #[pyo3(signature = (source, backend = "cpu", *, batch = 1, device = "cpu", precision = "f32", max_envs = None, threads = 1))]
    #[allow(clippy::too_many_arguments)]
    fn load(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        backend: &str,
        batch: usize,
        device: &str,
        precision: &str,
        max_envs: Option<usize>,
        threads: usize,
    ) -> PyResult<Self> {
        let bytes = bytes_or_file(source, "Policy.load")?;
        let compiled = if backend == "auto" {
            py.detach(|| CompiledPolicy::load_auto(&bytes, batch.max(1)))
                .map_err(policy_err)?
        } else {
            match parse_backend(backend)? {
                Backend::Torch => {
                    let opts = policyport_torch::TorchOptions {
                        device: device.parse().map_err(PyValueError::new_err)?,
                        precision: precision.parse().map_err(
                            |e: policyport::UnknownPrecision| PyValueError::new_err(e.to_string()),
                        )?,
                        ..Default::default()
                    };
                    py.detach(|| policyport_torch::load(&bytes, &opts))
                        .map_err(torch_err)?
                }
                Backend::Wasmtime => {
                    return Err(PyValueError::new_err(
                        "backend 'wasmtime' is the sandboxed plugin for game engines (the C ABI / Rust host); \
                         from Python use cpu, flex, wgpu, torch or auto",
                    ));
                }
                Backend::Cpu if precision != "f32" => {
                    let precision: policyport::Precision =
                        precision
                            .parse()
                            .map_err(|e: policyport::UnknownPrecision| {
                                PyValueError::new_err(e.to_string())
                            })?;
                    py.detach(|| {
                        CompiledPolicy::load_cpu(&bytes, policyport::CpuOptions { precision })
                    })
                    .map_err(policy_err)?
                }
                b if precision != "f32" => {
                    return Err(PyValueError::new_err(format!(
                        "precision '{precision}' is for the cpu and torch backends, not {b}"
                    )));
                }
                b => py
                    .detach(|| CompiledPolicy::load(&bytes, b))
                    .map_err(policy_err)?,
            }
        };
        let mut session = compiled.session();
        if let Some(m) = max_envs {
            session.set_max_envs(m);
        }
        session.set_threads(threads).map_err(policy_err)?;
        Ok(PyPolicy {
            compiled,
            session: Mutex::new(session),
        })
    }

    /// Split act() over `threads` threads by batch rows (the calling thread and `threads - 1` workers this
    /// session owns; 0: one per core; 1: the default). Only the cpu backend has intra-op threads; results are
    /// identical whatever the count. Batches under 16 rows stay on the calling thread.
    fn set_threads(&self, threads: usize) -> PyResult<()> {
        self.lock().set_threads(threads).map_err(policy_err)
    }

    /// The threads this session's act() uses.
    #[getter]
    fn threads(&self) -> PyResult<usize> {
        Ok(self.lock().threads())
    }

    /// How act() uses those threads: "measured" (the default: a batch is split only while that measures faster
    /// than the calling thread alone, so threads never slow act() down when other work takes the cores) or
    /// "always" (every batch of at least 8 rows per thread: benchmarks and tests of the split). The same answers
    /// either way; another value is a ValueError.
    fn set_thread_split(&self, split: &str) -> PyResult<()> {
        let Some(split) = policyport::ThreadSplit::from_name(split) else {
            return Err(PyValueError::new_err(format!(
                "thread split {split:?}: \"measured\" or \"always\""
            )));
        };
        self.lock().set_thread_split(split);
        Ok(())
    }

    /// "measured" or "always" (see `set_thread_split`).
    #[getter]
    fn thread_split(&self) -> &'static str {
        self.lock().thread_split().name()
    }

    /// Another session on the same compiled weights (its own recurrent state): one per thread that acts.
    fn new_session(&self) -> Self {
        PyPolicy {
            compiled: self.compiled.clone(),
            session: Mutex::new(self.compiled.session()),
        }
    }

    #[getter]
    fn info(&self, py: Python<'_>) -> PyResult<PyPolicyInfo> {
        let i = self.compiled.info();
        let m = self.compiled.manifest();
        let obs_shape = match &m.observation {
            policyport::format::ObservationSpace::Box { shape, .. } => shape.clone(),
            other => vec![other.raw_len()],
        };
        let states = state_sizes(&self.compiled);
        Ok(PyPolicyInfo {
            name: i.name,
            backend: i.backend.name().to_string(),
            format_version: i.format_version,
            observation: json_value(py, &i.observation)?.unbind(),
            action: json_value(py, &i.action)?.unbind(),
            obs_len: i.obs_len,
            obs_shape,
            obs_dtype: match m.observation.raw_dtype() {
                policyport::format::ObsDType::U8 => "uint8".into(),
                _ => "float32".into(),
            },
            action_len: i.action_len,
            discrete: self.compiled.head().is_discrete(),
            dist_params_len: i.dist_params_len,
            has_value: i.has_value,
            action_masks: m.action_masks,
            states,
            parameters: i.parameters,
            selection: i.selection.map(|s| s.to_string()),
        })
    }

    /// One step for a batch of envs. `obs`: `[batch, *obs_shape]` (float32 is used without a copy; uint8 too for
    /// image policies; other dtypes are converted). Sampled with the Philox stream (seed, env id, step) unless
    /// `deterministic`. `env_ids`: which env each row is (default `0..batch`): the sampling stream and, for
    /// recurrent policies, whose state is read and advanced. `episode_starts`: rows whose state is zeroed first.
    /// `state`: caller-owned recurrent state, one `[batch, numel]` array per state (see `info.states`), written
    /// to those envs before the step; the next state comes back in `result.state` (also with `return_state`).
    /// `action_mask`: `[batch, n]` booleans (n = `info.dist_params_len`: one per action, multi-discrete
    /// components concatenated), `False` forbidding the action (sb3-contrib's `action_masks`); `epsilon`: a
    /// Q-value policy's exploration rate for this call instead of the artifact's. `value=False`: no value
    /// estimate (`result.value` is None) — the same actions, parameters and state, and the layers only the critic
    /// needs are skipped on the cpu backend (about half of SB3's default MLP); for acting, not for training.
    #[pyo3(signature = (obs, *, deterministic = false, seed = 0, step = 0, env_ids = None, episode_starts = None, state = None, return_state = false, action_mask = None, epsilon = None, value = true))]
    #[allow(clippy::too_many_arguments)]
    fn act(
        &self,
        py: Python<'_>,
        obs: &Bound<'_, PyAny>,
        deterministic: bool,
        seed: u64,
        step: u64,
        env_ids: Option<&Bound<'_, PyAny>>,
        episode_starts: Option<&Bound<'_, PyAny>>,
        state: Option<&Bound<'_, PyAny>>,
        return_state: bool,
        action_mask: Option<&Bound<'_, PyAny>>,
        epsilon: Option<f32>,
        value: bool,
    ) -> PyResult<PyActResult> {
        let (view, batch) = self.obs_view(obs)?;
        let mask_arr = action_mask.map(|m| self.mask_view(m, batch)).transpose()?;
        let mask: Option<&[bool]> = mask_arr.as_ref().map(|a| a.as_slice()).transpose()?;
        let ids: Option<Vec<u32>> = env_ids.map(|e| env_id_list(e, batch)).transpose()?;
        let starts_arr = episode_starts
            .map(|s| {
                contiguous(s, "bool_").and_then(|a| Ok(a.cast::<PyArrayDyn<bool>>()?.readonly()))
            })
            .transpose()?;
        let starts: Option<&[bool]> = starts_arr.as_ref().map(|a| a.as_slice()).transpose()?;
        let recurrent = !self
            .compiled
            .manifest()
            .recurrent
            .as_ref()
            .is_none_or(|r| r.states.is_empty());
        let state_arrs = state
            .map(|st| {
                let sizes = state_sizes(&self.compiled);
                if sizes.is_empty() {
                    return Err(StateError::new_err(
                        "state= given for a policy without recurrent state",
                    ));
                }
                float32_arrays(st, batch, &sizes)
            })
            .transpose()?;
        let state_slices: Option<Vec<&[f32]>> = state_arrs
            .as_ref()
            .map(|v| v.iter().map(|a| a.as_slice()).collect::<Result<_, _>>())
            .transpose()?;
        let want_state = recurrent && (state.is_some() || return_state);
        let mode = if deterministic {
            ActMode::Deterministic
        } else {
            ActMode::Sample { seed, step }
        };
        let obs_in = match &view {
            ObsView::F32(a) => Observations::F32(a.as_slice()?),
            ObsView::U8(a) => Observations::U8(a.as_slice()?),
            ObsView::OwnedF32(v) => Observations::F32(v),
            ObsView::OwnedU8(v) => Observations::U8(v),
        };
        let head = self.compiled.head();
        let acted = py.detach(|| -> Result<Acted, PolicyError> {
            let mut s = self.lock();
            // The rows' env ids as a list, only where state is written or read (not on the plain act() path).
            let range: Vec<u32>;
            let id_slice: &[u32] = match &ids {
                Some(v) => v,
                None if state_slices.is_some() || want_state => {
                    range = (0..batch as u32).collect();
                    &range
                }
                None => &[],
            };
            let mut req = Request::new(obs_in, batch, mode).envs(match &ids {
                Some(v) => EnvIds::List(v),
                None => EnvIds::Range(0),
            });
            if let Some(st) = starts {
                req = req.episode_starts(st);
            }
            if let Some(m) = mask {
                req = req.action_mask(m);
            }
            if let Some(e) = epsilon {
                req = req.epsilon(e);
            }
            if !value {
                req = req.skip_value();
            }
            if let Some(values) = &state_slices {
                // The request is checked before the caller's state is written: a refused call changes nothing
                // (the state used to be written first, then the observations refused).
                s.check(&req)?;
                s.write_state(id_slice, values)?;
            }
            let out = s.act(&req)?;
            let (k, np, ml) = (head.action_len, head.dist_params_len, head.mask_len());
            let logp = (0..batch)
                .map(|r| {
                    head.log_prob_with(
                        &out.dist_params[r * np..(r + 1) * np],
                        out.discrete.get(r * k..(r + 1) * k).unwrap_or(&[]),
                        out.continuous.get(r * k..(r + 1) * k).unwrap_or(&[]),
                        &policyport::format::RowControls {
                            mask: mask.map(|m| &m[r * ml..(r + 1) * ml]),
                            epsilon,
                        },
                    )
                })
                .collect::<Option<Vec<f32>>>();
            let mut acted = Acted {
                batch,
                discrete: out.discrete.clone(),
                continuous: out.continuous.clone(),
                dist: out.dist_params.clone(),
                value: (head.has_value() && value).then(|| out.value.clone()),
                logp,
                state: None,
            };
            if want_state {
                acted.state = Some(s.states_of(id_slice)?);
            }
            Ok(acted)
        });
        self.result(py, acted.map_err(policy_err)?)
    }

    /// Zero the recurrent state of these envs (a no-op for feed-forward policies).
    fn reset(&self, py: Python<'_>, env_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = env_ids.len()?;
        let ids = env_id_list(env_ids, n)?;
        py.detach(|| self.lock().reset(&ids)).map_err(policy_err)
    }

    /// The recurrent state of these envs: one `[len(env_ids), numel]` float32 array per state.
    fn get_state<'py>(
        &self,
        py: Python<'py>,
        env_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let n = env_ids.len()?;
        let ids = env_id_list(env_ids, n)?;
        let st = py
            .detach(|| self.lock().states_of(&ids))
            .map_err(policy_err)?;
        state_list(py, st, n)
    }

    /// Overwrite the recurrent state of these envs: one `[len(env_ids), numel]` array per state.
    fn set_state(
        &self,
        py: Python<'_>,
        env_ids: &Bound<'_, PyAny>,
        state: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let n = env_ids.len()?;
        let ids = env_id_list(env_ids, n)?;
        let sizes = state_sizes(&self.compiled);
        if sizes.is_empty() {
            return Err(StateError::new_err(
                "set_state on a policy without recurrent state",
            ));
        }
        let arrs = float32_arrays(state, n, &sizes)?;
        let slices: Vec<&[f32]> = arrs
            .iter()
            .map(|a| a.as_slice())
            .collect::<Result<_, _>>()?;
        py.detach(|| self.lock().write_state(&ids, &slices))
            .map_err(policy_err)
    }

    /// Run the artifact's golden vectors on this backend; a list of per-case dicts (raises on none passing?
    /// no: each dict says `passed`).
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let reports = py.detach(|| self.compiled.verify()).map_err(policy_err)?;
        let list = PyList::empty(py);
        for r in reports {
            let d = PyDict::new(py);
            d.set_item("name", r.name)?;
            d.set_item("passed", r.passed)?;
            d.set_item("tolerance", r.tolerance)?;
            d.set_item("values", r.values)?;
            d.set_item("sampled_mismatches", r.sampled_mismatches)?;
            d.set_item("deterministic_mismatches", r.deterministic_mismatches)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// The envs the session holds recurrent state for.
    #[getter]
    fn num_envs(&self) -> usize {
        self.lock().num_envs()
    }

    fn __repr__(&self) -> String {
        let i = self.compiled.info();
        format!("Policy(name={:?}, backend={:?})", i.name, i.backend.name())
    }
}

fn storage_of(s: &str) -> PyResult<StorageDType> {
    s.parse::<StorageDType>()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Compile a trained policy into `.policy` bytes. `source`: a path (an RLlib checkpoint directory, a
/// Stable-Baselines3 `model.zip`, a PyTorch state dict, an ONNX file) or the bytes of one of those files.
/// ONNX needs `spec` (dict, JSON text or a path: what the outputs mean); a state dict needs `layout` (the agent
/// that wrote it: cleanrl-ppo, cleanrl-ppo-continuous, cleanrl-atari, cleanrl-atari-lstm, cleanrl-sac) and
/// `spaces` ({"observation": ..., "action": ...}); an SB3 archive takes `vecnormalize` (its pickle, bytes or a
/// path). `golden`: oracle outputs (io.json) to embed instead of the float64 reference's. `storage`: f32, f16, bf16.
#[pyfunction]
#[pyo3(signature = (source, *, spec = None, layout = None, spaces = None, vecnormalize = None, golden = None, storage = "f32"))]
#[allow(clippy::too_many_arguments)]
fn compile<'py>(
    py: Python<'py>,
    source: &Bound<'py, PyAny>,
    spec: Option<&Bound<'py, PyAny>>,
    layout: Option<&str>,
    spaces: Option<&Bound<'py, PyAny>>,
    vecnormalize: Option<&Bound<'py, PyAny>>,
    golden: Option<&Bound<'py, PyAny>>,
    storage: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let storage = storage_of(storage)?;
    let golden: Option<policyport_import::FixtureIo> = match golden {
        Some(g) => {
            let text = match g.extract::<std::path::PathBuf>() {
                Ok(p) if !g.is_instance_of::<pyo3::types::PyString>() || p.is_file() => {
                    String::from_utf8(bytes_or_file(g, "golden")?)
                        .map_err(|e| PyValueError::new_err(format!("golden: {e}")))?
                }
                _ => json_text(g)?,
            };
            Some(
                serde_json::from_str(&text)
                    .map_err(|e| SpecError::new_err(format!("golden (io.json): {e}")))?,
            )
        }
        None => None,
    };
    // A directory: an RLlib checkpoint.
    if !source.is_instance_of::<PyBytes>()
        && let Ok(path) = source.extract::<std::path::PathBuf>()
        && path.is_dir()
    {
        if !policyport_import::rllib::is_rllib_checkpoint(&path) {
            return Err(MalformedModelError::new_err(format!(
                "{} is a directory but not an RLlib checkpoint (no rllib_checkpoint.json, module_state.pkl or \
                 metadata.json + class_and_ctor_args.pkl)",
                path.display()
            )));
        }
        let name = path.display().to_string();
        let bytes = py
            .detach(|| policyport_import::compile_rllib(&path, &name, golden.as_ref(), storage))
            .map_err(import_err)?;
        return Ok(PyBytes::new(py, &bytes));
    }
    let label = if source.is_instance_of::<PyBytes>() {
        "<bytes>".to_string()
    } else {
        source.str()?.to_string()
    };
    let model = bytes_or_file(source, "compile")?;
    // By content: a damaged file is named as what it is, never sent down the ONNX route.
    let kind = policyport_import::detect_model(&model).map_err(import_err)?;
    if kind == policyport_import::ModelKind::Sb3Archive {
        let vn = vecnormalize
            .map(|v| bytes_or_file(v, "vecnormalize"))
            .transpose()?;
        let bytes = py
            .detach(|| {
                policyport_import::compile_sb3(
                    &model,
                    vn.as_deref(),
                    &label,
                    golden.as_ref(),
                    storage,
                )
            })
            .map_err(import_err)?;
        return Ok(PyBytes::new(py, &bytes));
    }
    if kind == policyport_import::ModelKind::StateDict {
        let Some(layout) = layout else {
            return Err(SpecError::new_err(
                "a PyTorch state dict holds no architecture: pass layout= (cleanrl-ppo, cleanrl-ppo-continuous, \
                 cleanrl-atari, cleanrl-atari-lstm, cleanrl-sac) and spaces={'observation': ..., 'action': ...}",
            ));
        };
        let layout: policyport_import::CleanrlLayout = layout
            .parse()
            .map_err(|e: String| PyValueError::new_err(e))?;
        let spaces = spaces.ok_or_else(|| {
            SpecError::new_err(
                "a state dict needs spaces={'observation': ..., 'action': ...} (SPEC.md's spaces)",
            )
        })?;
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Spaces {
            observation: policyport::format::ObservationSpace,
            action: policyport::format::ActionSpace,
        }
        let s: Spaces = serde_json::from_str(&json_text(spaces)?)
            .map_err(|e| SpecError::new_err(format!("spaces: {e}")))?;
        let bytes = py
            .detach(|| {
                policyport_import::compile_cleanrl(
                    &model,
                    layout,
                    s.observation,
                    s.action,
                    &label,
                    golden.as_ref(),
                    storage,
                )
            })
            .map_err(import_err)?;
        return Ok(PyBytes::new(py, &bytes));
    }
    // ONNX.
    let spec = spec.ok_or_else(|| {
        SpecError::new_err(
            "an ONNX model needs spec= (a dict, JSON text or a path: the distribution and what its outputs mean)",
        )
    })?;
    let text = match spec.extract::<std::path::PathBuf>() {
        Ok(p) if p.is_file() => String::from_utf8(bytes_or_file(spec, "spec")?)
            .map_err(|e| SpecError::new_err(format!("spec: {e}")))?,
        _ => json_text(spec)?,
    };
    let spec: policyport_import::ImportSpec =
        serde_json::from_str(&text).map_err(|e| SpecError::new_err(format!("spec: {e}")))?;
    let bytes = py
        .detach(|| policyport_import::compile_onnx(&model, &spec, &label, golden.as_ref(), storage))
        .map_err(import_err)?;
    Ok(PyBytes::new(py, &bytes))
}

/// One RLlib RLModule from the pickled bytes of its state and its constructor (what `save_to_path` writes as
/// `module_state.pkl` and `class_and_ctor_args.pkl`), compiled alone: the module's own observations in, its raw
/// distribution's actions out (RLlib's connectors still run around it). For env runners (weight syncs).
#[pyfunction]
/// `goldens=False` skips the float64 reference's golden vectors (an artifact that never leaves the process: the
/// env runners' rebuilds; `verify()` then has nothing to check).
#[pyo3(signature = (module_state, module_ctor, *, name = "rllib_module", storage = "f32", goldens = true))]
fn compile_rllib_module<'py>(
    py: Python<'py>,
    module_state: &[u8],
    module_ctor: &[u8],
    name: &str,
    storage: &str,
    goldens: bool,
) -> PyResult<Bound<'py, PyBytes>> {
    let storage = storage_of(storage)?;
    let bytes = py
        .detach(|| {
            policyport_import::compile_rllib_module(
                module_state,
                module_ctor,
                name,
                "RLModule in process",
                storage,
                goldens,
            )
        })
        .map_err(import_err)?;
    Ok(PyBytes::new(py, &bytes))
}

/// The backends this build can load on (the others raise NotCompiledError).
#[pyfunction]
fn backends() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Backend::ALL
        .into_iter()
        .filter(|b| b.check_compiled().is_ok())
        .map(|b| b.name())
        .collect();
    if policyport_torch::COMPILED {
        v.push("torch");
    }
    v
}

/// Whether libtorch sees a CUDA device (always False without the torch backend).
#[pyfunction]
fn cuda_available() -> bool {
    policyport_torch::cuda_device_count() > 0
}

/// The instruction set of the cpu backend's f32 kernels on this machine, as a policy loaded now would use it:
/// "avx512", "avx2+fma", "sse+fma", "sse2", "neon", "simd128" or "portable" (`policyport::cpu_kernels`).
#[pyfunction]
fn cpu_kernels() -> &'static str {
    policyport::cpu_kernels()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyPolicy>()?;
    m.add_class::<PyPolicyInfo>()?;
    m.add_class::<PyActResult>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(compile_rllib_module, m)?)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_kernels, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add(
        "FORMAT_VERSION",
        (
            policyport::format::container::FORMAT_MAJOR,
            policyport::format::container::FORMAT_MINOR,
        ),
    )?;
    // Each class's `kind`: the core's ErrorKind name, the same word the browser's errors carry (the compile
    // errors are the importer's, no kind of a policy error: None, as on the base class).
    for (ty, kind) in [
        (py.get_type::<PolicyportError>(), None),
        (py.get_type::<ArtifactError>(), Some(ErrorKind::Artifact)),
        (
            py.get_type::<ObservationError>(),
            Some(ErrorKind::Observation),
        ),
        (py.get_type::<CallError>(), Some(ErrorKind::Call)),
        (py.get_type::<StateError>(), Some(ErrorKind::State)),
        (py.get_type::<BackendError>(), Some(ErrorKind::Backend)),
        (py.get_type::<MemoryLimitError>(), Some(ErrorKind::TooLarge)),
        (
            py.get_type::<NonFiniteOutputError>(),
            Some(ErrorKind::NonFinite),
        ),
        (py.get_type::<CompileError>(), None),
    ] {
        ty.setattr("kind", kind.map(ErrorKind::name))?;
    }
    for (name, ty) in [
        ("PolicyportError", py.get_type::<PolicyportError>()),
        ("CallError", py.get_type::<CallError>()),
        ("EpisodeStartsError", py.get_type::<EpisodeStartsError>()),
        ("ArtifactError", py.get_type::<ArtifactError>()),
        ("ObservationError", py.get_type::<ObservationError>()),
        ("BatchError", py.get_type::<BatchError>()),
        ("MemoryLimitError", py.get_type::<MemoryLimitError>()),
        (
            "NonFiniteOutputError",
            py.get_type::<NonFiniteOutputError>(),
        ),
        ("EnvIdError", py.get_type::<EnvIdError>()),
        ("ActionMaskError", py.get_type::<ActionMaskError>()),
        ("StateError", py.get_type::<StateError>()),
        ("BackendError", py.get_type::<BackendError>()),
        ("NotCompiledError", py.get_type::<NotCompiledError>()),
        ("CompileError", py.get_type::<CompileError>()),
        (
            "UnsupportedModelError",
            py.get_type::<UnsupportedModelError>(),
        ),
        ("MalformedModelError", py.get_type::<MalformedModelError>()),
        ("SpecError", py.get_type::<SpecError>()),
    ] {
        m.add(name, ty)?;
    }
    Ok(())
}
