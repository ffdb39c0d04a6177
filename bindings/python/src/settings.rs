//! Settings in (Python keyword arguments, snake_case WIT names) and the
//! resolved WIT `config` out (the `Config` class). Only the shape of each
//! value is checked here; ranges are the core's, when a session opens.

use idempotency_ledger::{Config as WitConfig, Dialect, OnServerError, Profile, Settings};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};

use crate::bridge::protocol_exception;

/// The settings `Ledger(**settings)` takes: the WIT `config` fields in
/// snake_case (the dialect is the backend's).
pub(crate) const SETTINGS: [&str; 16] = [
    "protected_methods",
    "fingerprint_headers",
    "replay_headers",
    "pending_ttl_ms",
    "retention_ms",
    "body_cap_bytes",
    "request_body_cap_bytes",
    "sweep_batch",
    "sweep_every",
    "profile",
    "key_required",
    "replay_header",
    "in_progress_retry_ms",
    "wait_ms",
    "on_server_error",
    "lease_renewal",
];

fn invalid_config(py: Python<'_>, message: String) -> PyErr {
    protocol_exception(py, "invalid-config", None, &message)
}

pub(crate) fn profile_of(name: &str) -> Option<Profile> {
    match name {
        "recipe" => Some(Profile::Recipe),
        "ietf" => Some(Profile::Ietf),
        _ => None,
    }
}

pub(crate) fn profile_name(profile: Profile) -> &'static str {
    match profile {
        Profile::Recipe => "recipe",
        Profile::Ietf => "ietf",
    }
}

pub(crate) fn dialect_of(name: &str) -> PyResult<Dialect> {
    match name {
        "sqlite" => Ok(Dialect::Sqlite),
        "postgres" => Ok(Dialect::Postgres),
        other => Err(PyValueError::new_err(format!("dialect {other:?} is not \"sqlite\" or \"postgres\""))),
    }
}

pub(crate) fn dialect_name(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "sqlite",
        Dialect::Postgres => "postgres",
    }
}

/// The crate's `Settings` from `Ledger(**settings)`: every setting left out
/// stays `None` (the component's default for the profile). An unknown name
/// is a `TypeError`; a value the WIT type cannot carry is `InvalidConfig`
/// naming the field.
pub(crate) fn settings_from(py: Python<'_>, given: Option<&Bound<'_, PyDict>>) -> PyResult<Settings> {
    let mut settings = Settings::default();
    let Some(given) = given else { return Ok(settings) };
    let mut unknown: Vec<String> = Vec::new();
    for key in given.keys() {
        let key: String = key.extract()?;
        if !SETTINGS.contains(&key.as_str()) {
            unknown.push(key);
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        return Err(PyTypeError::new_err(format!("unknown Ledger setting(s): {} (known: {})", unknown.join(", "), SETTINGS.join(", "))));
    }
    let field = Field { py, given };
    let list = "a list of strings";
    let (u64s, u32s) = ("an int in 0..2^64", "an int in 0..2^32");
    settings.protected_methods = field.get("protected_methods", list)?;
    settings.fingerprint_headers = field.get("fingerprint_headers", list)?;
    settings.replay_headers = field.get("replay_headers", list)?;
    settings.pending_ttl_ms = field.get("pending_ttl_ms", u64s)?;
    settings.retention_ms = field.get("retention_ms", u64s)?;
    settings.body_cap_bytes = field.get("body_cap_bytes", u32s)?;
    settings.request_body_cap_bytes = field.get("request_body_cap_bytes", u64s)?;
    settings.sweep_batch = field.get("sweep_batch", u32s)?;
    settings.sweep_every = field.get("sweep_every", u32s)?;
    settings.key_required = field.get("key_required", "a bool")?;
    settings.replay_header = field.get("replay_header", "a string or None")?;
    settings.in_progress_retry_ms = field.get("in_progress_retry_ms", "an int or None")?;
    settings.wait_ms = field.get("wait_ms", u64s)?;
    settings.lease_renewal = field.get("lease_renewal", "a bool")?;
    let named = |name: &str| -> PyResult<Option<String>> { field.get(name, "a string") };
    if let Some(p) = named("profile")? {
        let profile = profile_of(&p).ok_or_else(|| invalid_config(py, format!("profile: {p:?} is not \"recipe\" or \"ietf\"")))?;
        settings.profile = Some(profile);
    }
    if let Some(v) = named("on_server_error")? {
        settings.on_server_error = Some(match v.as_str() {
            "store" => OnServerError::Store,
            "release" => OnServerError::Release,
            other => return Err(invalid_config(py, format!("on_server_error: {other:?} is not \"store\" or \"release\""))),
        });
    }
    Ok(settings)
}

struct Field<'a, 'py> {
    py: Python<'py>,
    given: &'a Bound<'py, PyDict>,
}

impl<'py> Field<'_, 'py> {
    /// The value under `name`, if given, as `T` (an `Option<_>` for the
    /// settings that take None).
    fn get<T: for<'a> FromPyObject<'a, 'py>>(&self, name: &str, what: &str) -> PyResult<Option<T>> {
        let Some(v) = self.given.get_item(name)? else { return Ok(None) };
        if v.is_instance_of::<PyBool>() && what != "a bool" {
            return Err(invalid_config(self.py, format!("{name}: expected {what}, got a bool")));
        }
        v.extract::<T>().map(Some).map_err(|_| invalid_config(self.py, format!("{name}: expected {what}, got {v:?}")))
    }
}

/// The settings in force: the WIT `config`, as the core validated it
/// (snake_case names; `dialect`, `profile` and `on_server_error` as their
/// WIT names).
#[pyclass(frozen, eq, module = "idempotency_ledger._native", get_all)]
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    protected_methods: Vec<String>,
    fingerprint_headers: Vec<String>,
    replay_headers: Vec<String>,
    pending_ttl_ms: u64,
    retention_ms: u64,
    body_cap_bytes: u32,
    request_body_cap_bytes: u64,
    sweep_batch: u32,
    sweep_every: u32,
    dialect: &'static str,
    profile: &'static str,
    key_required: bool,
    replay_header: Option<String>,
    in_progress_retry_ms: Option<u64>,
    wait_ms: u64,
    on_server_error: &'static str,
    lease_renewal: bool,
}

impl Config {
    pub(crate) fn from_wit(c: &WitConfig) -> Config {
        Config {
            protected_methods: c.protected_methods.clone(),
            fingerprint_headers: c.fingerprint_headers.clone(),
            replay_headers: c.replay_headers.clone(),
            pending_ttl_ms: c.pending_ttl_ms,
            retention_ms: c.retention_ms,
            body_cap_bytes: c.body_cap_bytes,
            request_body_cap_bytes: c.request_body_cap_bytes,
            sweep_batch: c.sweep_batch,
            sweep_every: c.sweep_every,
            dialect: dialect_name(c.dialect),
            profile: profile_name(c.profile),
            key_required: c.key_required,
            replay_header: c.replay_header.clone(),
            in_progress_retry_ms: c.in_progress_retry_ms,
            wait_ms: c.wait_ms,
            on_server_error: match c.on_server_error {
                OnServerError::Store => "store",
                OnServerError::Release => "release",
            },
            lease_renewal: c.lease_renewal,
        }
    }
}

#[pymethods]
impl Config {
    /// Every field, snake_case, in a plain dict (JSON-able).
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("protected_methods", &self.protected_methods)?;
        d.set_item("fingerprint_headers", &self.fingerprint_headers)?;
        d.set_item("replay_headers", &self.replay_headers)?;
        d.set_item("pending_ttl_ms", self.pending_ttl_ms)?;
        d.set_item("retention_ms", self.retention_ms)?;
        d.set_item("body_cap_bytes", self.body_cap_bytes)?;
        d.set_item("request_body_cap_bytes", self.request_body_cap_bytes)?;
        d.set_item("sweep_batch", self.sweep_batch)?;
        d.set_item("sweep_every", self.sweep_every)?;
        d.set_item("dialect", self.dialect)?;
        d.set_item("profile", self.profile)?;
        d.set_item("key_required", self.key_required)?;
        d.set_item("replay_header", &self.replay_header)?;
        d.set_item("in_progress_retry_ms", self.in_progress_retry_ms)?;
        d.set_item("wait_ms", self.wait_ms)?;
        d.set_item("on_server_error", self.on_server_error)?;
        d.set_item("lease_renewal", self.lease_renewal)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("Config({})", self.as_dict(py)?.repr()?))
    }
}
