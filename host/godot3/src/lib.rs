//! policyport in Godot 3 (GDNative + NativeScript 1.0; Godot 3.2 and newer 3.x).
//!
//! One NativeScript class, `PolicyRunner` (a `Reference`), the same runner as the Godot 4 extension's (both are
//! shells over [`policyport_agents::ScriptRunner`]): `load_bytes(bytes, seed, sample)`, `spawn()` /
//! `despawn(id)` / `respawn(id)`, `tick(ids, observations)` (and `tick_masked(ids, observations, masks)`) for all
//! agents in one call per physics frame, then `discrete_actions()` / `continuous_actions()` / `values()` in the
//! ids' order, `info()`, `last_error()`. A refused call answers `false` / `-1` with `last_error()` saying why;
//! nothing panics into the engine (each method runs under `catch_unwind`).
//!
//! Godot 3's types decide two things: agent ids are 64-bit (`generation << 32 | env id`), so `ids` is an `Array`
//! of ints (a `PoolIntArray` holds 32-bit ints and is refused, never truncated); observations are a
//! `PoolRealArray` (32-bit floats, what the policy takes) or an `Array` of numbers. Discrete actions come back as
//! a `PoolIntArray`, continuous actions and values as `PoolRealArray`s.
//!
//! The GDNative entry points are `godot_gdnative_init` (the API is taken and checked: see [`gdnative`]),
//! `godot_gdnative_terminate` and `godot_nativescript_init` (the class is registered), as a `.gdnlib` with
//! `symbol_prefix = "godot_"` expects (demo/policyport.gdnlib).

pub mod gdnative;

use std::ffi::{CStr, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use gdnative::{
    Api, InitOptions, InstanceCreate, InstanceDestroy, InstanceMethod, Variant, variant_type,
};
use policyport_agents::{ScriptError, ScriptRunner};

/// The engine's API, taken once in `godot_gdnative_init`.
static API: OnceLock<Api> = OnceLock::new();

const CLASS: &CStr = c"PolicyRunner";

/// Called by Godot when the library is loaded: takes and checks the engine's API.
///
/// # Safety
/// Called by Godot with its init options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn godot_gdnative_init(options: *mut InitOptions) {
    // SAFETY: Godot's options (or null, refused by `from_init`).
    match unsafe { Api::from_init(options) } {
        Ok(api) => {
            let _ = API.set(api);
        }
        Err(e) => {
            // SAFETY: `report_loading_error` and `gd_native_library` come from the same options, checked non-null.
            unsafe {
                if let Some(opts) = options.as_ref()
                    && let Some(report) = opts.report_loading_error
                {
                    let msg =
                        std::ffi::CString::new(format!("policyport: {e}")).unwrap_or_default();
                    report(opts.gd_native_library, msg.as_ptr());
                }
            }
        }
    }
}

/// Called by Godot when the library is unloaded.
#[unsafe(no_mangle)]
pub extern "C" fn godot_gdnative_terminate(_options: *mut c_void) {}

/// Called by Godot to register the library's NativeScript classes.
///
/// # Safety
/// Called by Godot with its NativeScript handle, after `godot_gdnative_init`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn godot_nativescript_init(handle: *mut c_void) {
    // An engine whose API was refused in `godot_gdnative_init` gets no class (it was told why there).
    let Some(api) = API.get() else { return };
    // SAFETY: `handle` is Godot's; the class is registered before its methods.
    unsafe {
        api.register_class(
            handle,
            CLASS,
            c"Reference",
            InstanceCreate {
                create: runner_create,
                method_data: std::ptr::null_mut(),
                free: None,
            },
            InstanceDestroy {
                destroy: runner_destroy,
                method_data: std::ptr::null_mut(),
                free: None,
            },
        );
        for (name, method) in METHODS {
            api.register_method(
                handle,
                CLASS,
                name,
                InstanceMethod {
                    method: *method,
                    method_data: std::ptr::null_mut(),
                    free: None,
                },
            );
        }
    }
}

/// A `PolicyRunner` instance's user data: the engine-neutral runner, the ids' buffer `tick()` reads into (kept
/// between ticks), and the PoolIntArray `discrete_actions()` last answered.
///
/// Why keep that array: Godot's pool arrays are copy-on-write, so writing the next tick's actions into this one
/// reallocates only while the game still holds the last answer; a game that dropped it (a local in
/// `_physics_process`) gets the same storage back, no allocation per tick (Godot's pool allocator takes a global
/// mutex: ~0.15 µs of a tick).
#[derive(Default)]
struct Runner {
    script: ScriptRunner,
    ids: Vec<i64>,
    actions: Option<gdnative::PoolIntArray>,
}

impl std::ops::Deref for Runner {
    type Target = ScriptRunner;
    fn deref(&self) -> &ScriptRunner {
        &self.script
    }
}

impl std::ops::DerefMut for Runner {
    fn deref_mut(&mut self) -> &mut ScriptRunner {
        &mut self.script
    }
}

/// NativeScript's constructor of a `PolicyRunner`: a new [`Runner`], boxed, as the instance's user data.
///
/// # Safety
/// None of its own (it reads neither argument): `unsafe` because [`InstanceCreate`] takes an `unsafe extern "C"`
/// function. The box it returns must be freed once, by [`runner_destroy`].
unsafe extern "C" fn runner_create(_object: *mut c_void, _method_data: *mut c_void) -> *mut c_void {
    Box::into_raw(Box::new(Runner::default())).cast()
}

/// NativeScript's destructor of a `PolicyRunner`.
///
/// # Safety
/// `user` is null or the pointer [`runner_create`] returned for this instance, not destroyed before and not used
/// afterwards (Godot destroys each instance once, after its last method call).
unsafe extern "C" fn runner_destroy(
    _object: *mut c_void,
    _method_data: *mut c_void,
    user: *mut c_void,
) {
    if !user.is_null() {
        // SAFETY: `user` is the box `runner_create` made for this instance; Godot destroys each instance once.
        let mut runner = unsafe { Box::from_raw(user.cast::<Runner>()) };
        if let (Some(mut a), Some(api)) = (runner.actions.take(), API.get()) {
            // SAFETY: the runner's own reference to an array the API made.
            unsafe { api.pool_int_array_destroy()(&mut a) };
        }
        drop(runner);
    }
}

/// Filler of the unused entries of [`call`]'s argument array (never passed to a body).
static NO_ARGUMENT: Variant = Variant::NIL;

/// One method's body: the runner, the engine's API, the arguments; answers a variant.
type Body = fn(&mut Runner, &Api, &[&Variant]) -> Variant;

/// Turns a [`Body`] into the C function NativeScript calls, with the panic guard and argument plumbing.
macro_rules! methods {
    ($($name:ident),* $(,)?) => {
        const METHODS: &[(&CStr, gdnative::MethodFn)] = &[$(
            ({
                const NAME: &CStr = match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!("method name"),
                };
                NAME
            }, {
                /// The NativeScript entry of this method: [`call`] with its body.
                ///
                /// # Safety
                /// As for [`call`]: `user` is null or this instance's `Runner` (from `runner_create`, not
                /// destroyed), used by no other call meanwhile; `argv` holds `argc` live variant pointers.
                unsafe extern "C" fn $name(
                    _object: *mut c_void,
                    _method_data: *mut c_void,
                    user: *mut c_void,
                    argc: c_int,
                    argv: *mut *mut Variant,
                ) -> Variant {
                    // SAFETY: NativeScript passes this instance's user data and `argc` live argument pointers.
                    unsafe { call(stringify!($name), $name::body, user, argc, argv) }
                }
                $name
            })
        ),*];
    };
}

/// Runs `body` for a NativeScript call: a missing instance or a panic is a refusal (`false` after a panic, with
/// `last_error()` naming the method), never an unwind into the engine.
///
/// # Safety
/// `user` is null or a `Runner` from `runner_create`; `argv` holds `argc` live variant pointers.
unsafe fn call(
    name: &str,
    body: Body,
    user: *mut c_void,
    argc: c_int,
    argv: *mut *mut Variant,
) -> Variant {
    let Some(api) = API.get() else {
        return Variant::uninit();
    };
    // SAFETY: per this function's contract.
    let Some(runner) = (unsafe { user.cast::<Runner>().as_mut() }) else {
        return api.nil();
    };
    let raw: &[*mut Variant] = if argv.is_null() || argc <= 0 {
        &[]
    } else {
        // SAFETY: `argc` live argument pointers.
        unsafe { std::slice::from_raw_parts(argv, argc as usize) }
    };
    // SAFETY: each is a live variant for the call's duration.
    let live = raw.iter().filter_map(|p| unsafe { p.as_ref() });
    // The arguments on the stack (no method takes more than three: no allocation per call), a Vec past that.
    let (mut stack, mut heap) = ([&NO_ARGUMENT; 4], Vec::new());
    let args: &[&Variant] = if raw.len() <= stack.len() {
        let mut k = 0;
        for v in live {
            stack[k] = v;
            k += 1;
        }
        &stack[..k]
    } else {
        heap.extend(live);
        &heap
    };
    match catch_unwind(AssertUnwindSafe(|| body(runner, api, args))) {
        Ok(v) => v,
        Err(_) => {
            runner.fail(ScriptError::Argument(format!(
                "policyport: {name}() panicked (a bug: please report it); the runner may be in any state"
            )));
            api.bool_variant(false)
        }
    }
}

/// The argument `i` of type `want`, or the refusal naming what was passed instead.
fn arg<'a>(
    api: &Api,
    name: &str,
    args: &[&'a Variant],
    i: usize,
    want: &[i32],
) -> Result<&'a Variant, ScriptError> {
    let Some(v) = args.get(i) else {
        return Err(ScriptError::Argument(format!(
            "{name}() takes an argument {} ({}), {} given",
            i + 1,
            want.iter()
                .map(|t| variant_type::name(*t))
                .collect::<Vec<_>>()
                .join(" or "),
            args.len()
        )));
    };
    // SAFETY: a live argument variant.
    let t = unsafe { api.variant_get_type()(*v) };
    if want.contains(&t) {
        Ok(v)
    } else {
        Err(ScriptError::Argument(format!(
            "{name}(): argument {} must be {}, not {}",
            i + 1,
            want.iter()
                .map(|t| variant_type::name(*t))
                .collect::<Vec<_>>()
                .join(" or "),
            variant_type::name(t)
        )))
    }
}

fn refuse(runner: &mut ScriptRunner, e: ScriptError, failure: Variant) -> Variant {
    runner.fail(e);
    failure
}

mod load_bytes {
    use super::*;
    /// `load_bytes(bytes: PoolByteArray, seed: int, sample: bool) -> bool`.
    pub fn body(r: &mut Runner, api: &Api, args: &[&Variant]) -> Variant {
        let parsed = (|| {
            let bytes = arg(api, "load_bytes", args, 0, &[variant_type::POOL_BYTE_ARRAY])?;
            let seed = arg(api, "load_bytes", args, 1, &[variant_type::INT])?;
            let sample = arg(api, "load_bytes", args, 2, &[variant_type::BOOL])?;
            // SAFETY: typed live variants.
            Ok(unsafe {
                (
                    bytes,
                    api.variant_as_int()(seed),
                    api.variant_as_bool()(sample),
                )
            })
        })();
        match parsed {
            Ok((bytes, seed, sample)) => {
                // SAFETY: `bytes` is a live argument variant of this call, checked to be a PoolByteArray by `arg`.
                let ok = unsafe { api.with_bytes(bytes, |b| r.load_bytes(b, seed, sample)) };
                api.bool_variant(ok)
            }
            Err(e) => refuse(r, e, api.bool_variant(false)),
        }
    }
}

mod last_error {
    use super::*;
    /// `last_error() -> String` ("" after a call that succeeded).
    pub fn body(r: &mut Runner, api: &Api, _args: &[&Variant]) -> Variant {
        api.string_variant(&r.last_error())
    }
}

mod spawn {
    use super::*;
    /// `spawn() -> int`: a new agent's id, or -1.
    pub fn body(r: &mut Runner, api: &Api, _args: &[&Variant]) -> Variant {
        api.int_variant(r.spawn())
    }
}

/// `despawn(id)` and `respawn(id)`: one int argument, a bool answer.
fn with_id(
    r: &mut ScriptRunner,
    api: &Api,
    args: &[&Variant],
    name: &str,
    f: fn(&mut ScriptRunner, i64) -> bool,
) -> Variant {
    match arg(api, name, args, 0, &[variant_type::INT]) {
        // SAFETY: an int variant.
        Ok(v) => api.bool_variant(f(r, unsafe { api.variant_as_int()(v) })),
        Err(e) => refuse(r, e, api.bool_variant(false)),
    }
}

mod despawn {
    use super::*;
    /// `despawn(id: int) -> bool`: the agent is gone; its id is refused from now on.
    pub fn body(r: &mut Runner, api: &Api, args: &[&Variant]) -> Variant {
        with_id(r, api, args, "despawn", ScriptRunner::despawn)
    }
}

mod respawn {
    use super::*;
    /// `respawn(id: int) -> bool`: a new episode at the agent's next tick.
    pub fn body(r: &mut Runner, api: &Api, args: &[&Variant]) -> Variant {
        with_id(r, api, args, "respawn", ScriptRunner::respawn)
    }
}

/// The last tick's discrete actions (none: an empty array) in the runner's held PoolIntArray (`Runner::actions`),
/// as a variant. Discrete actions are indices below the policy's action count, far inside i32.
fn discrete_variant(r: &mut Runner, api: &Api, none: bool) -> Variant {
    let Runner {
        script, actions, ..
    } = r;
    let held = actions.get_or_insert_with(|| api.pool_int_array(std::iter::empty()));
    match none {
        true => api.write_pool_int_array(held, std::iter::empty()),
        false => {
            api.write_pool_int_array(held, script.outputs().discrete.iter().map(|a| *a as i32))
        }
    }
    api.pool_int_array_variant(held)
}

/// `tick`, `tick_masked` and `tick_discrete`: ids (an Array of ints), observations (a PoolRealArray or an Array of
/// numbers) and, masked, one 0/1 byte per logit per id (a PoolByteArray). Whether it acted (refused:
/// `last_error()` says why).
fn tick_with(r: &mut Runner, api: &Api, args: &[&Variant], name: &str, masked: bool) -> bool {
    let ids_arg = match arg(
        api,
        name,
        args,
        0,
        &[variant_type::ARRAY, variant_type::POOL_INT_ARRAY],
    ) {
        Ok(v) => v,
        Err(e) => return r.fail(e),
    };
    // SAFETY: a live variant.
    if unsafe { api.variant_get_type()(ids_arg) } == variant_type::POOL_INT_ARRAY {
        let e = ScriptError::Argument(format!(
            "{name}(): ids must be an Array of ints, not a PoolIntArray (it holds 32-bit ints; agent ids are 64-bit)"
        ));
        return r.fail(e);
    }
    let obs_arg = match arg(
        api,
        name,
        args,
        1,
        &[variant_type::POOL_REAL_ARRAY, variant_type::ARRAY],
    ) {
        Ok(v) => v,
        Err(e) => return r.fail(e),
    };
    let mut ids = std::mem::take(&mut r.ids);
    let result = tick_ids(r, api, args, name, [ids_arg, obs_arg], masked, &mut ids);
    r.ids = ids;
    result
}

/// [`tick_with`] past its first argument's type check, the ids read into `ids` (the runner's buffer).
fn tick_ids(
    r: &mut ScriptRunner,
    api: &Api,
    args: &[&Variant],
    name: &str,
    [ids_arg, obs_arg]: [&Variant; 2],
    masked: bool,
    ids: &mut Vec<i64>,
) -> bool {
    // SAFETY: an Array variant.
    if let Err((i, t)) = unsafe { api.array_ints(ids_arg, ids) } {
        let e = ScriptError::Argument(format!(
            "{name}(): ids[{i}] is {}, not an int (agent ids are the ints spawn() answered)",
            variant_type::name(t)
        ));
        return r.fail(e);
    }
    let mask_arg = if masked {
        match arg(api, name, args, 2, &[variant_type::POOL_BYTE_ARRAY]) {
            Ok(m) => Some(m),
            Err(e) => return r.fail(e),
        }
    } else {
        None
    };
    // The observations are read where Godot keeps them (one copy, into the agents' staging, not two).
    // SAFETY: a PoolRealArray or Array variant (Godot converts the numbers of an Array; others read as 0), and
    // the mask a PoolByteArray variant.
    let ok = unsafe {
        api.with_f32s(obs_arg, |obs| match mask_arg {
            Some(m) => api.with_bytes(m, |mask| r.tick(ids.iter().copied(), obs, Some(mask))),
            None => r.tick(ids.iter().copied(), obs, None),
        })
    };
    ok
}

mod tick {
    use super::*;
    /// `tick(ids: Array, observations: PoolRealArray) -> bool`.
    pub fn body(r: &mut Runner, api: &Api, args: &[&Variant]) -> Variant {
        api.bool_variant(tick_with(r, api, args, "tick", false))
    }
}

mod tick_masked {
    use super::*;
    /// `tick_masked(ids: Array, observations: PoolRealArray, masks: PoolByteArray) -> bool`.
    pub fn body(r: &mut Runner, api: &Api, args: &[&Variant]) -> Variant {
        api.bool_variant(tick_with(r, api, args, "tick_masked", true))
    }
}

mod discrete_actions {
    use super::*;
    /// `discrete_actions() -> PoolIntArray`: the last tick's actions, `ids × action_len`.
    pub fn body(r: &mut Runner, api: &Api, _args: &[&Variant]) -> Variant {
        discrete_variant(r, api, false)
    }
}

mod tick_discrete {
    use super::*;
    /// `tick_discrete(ids: Array, observations: PoolRealArray) -> PoolIntArray`: `tick()` and
    /// `discrete_actions()` in one call (one GDScript call into the runner a frame, not two: ~0.25 µs each);
    /// refused, an empty array (`last_error()` says why; the tick changed nothing).
    pub fn body(r: &mut Runner, api: &Api, args: &[&Variant]) -> Variant {
        let acted = tick_with(r, api, args, "tick_discrete", false);
        discrete_variant(r, api, !acted)
    }
}

mod continuous_actions {
    use super::*;
    /// `continuous_actions() -> PoolRealArray`: the last tick's actions, `ids × action_len`.
    pub fn body(r: &mut Runner, api: &Api, _args: &[&Variant]) -> Variant {
        api.real_array_variant(&r.outputs().continuous)
    }
}

mod set_values {
    use super::*;
    /// `set_values(on: bool) -> bool`: compute value estimates from the next tick on (off by default: a policy's
    /// separate critic is then not run at all).
    pub fn body(r: &mut Runner, api: &Api, args: &[&Variant]) -> Variant {
        match arg(api, "set_values", args, 0, &[variant_type::BOOL]) {
            Ok(on) => {
                // SAFETY: a typed live variant.
                r.set_values(unsafe { api.variant_as_bool()(on) });
                api.bool_variant(true)
            }
            Err(e) => refuse(r, e, api.bool_variant(false)),
        }
    }
}

mod values {
    use super::*;
    /// `values() -> PoolRealArray`: the last tick's value estimates, one per id (empty without a value head, or
    /// with values off: `set_values`).
    pub fn body(r: &mut Runner, api: &Api, _args: &[&Variant]) -> Variant {
        api.real_array_variant(&r.outputs().value)
    }
}

mod info {
    use super::*;
    /// `info() -> Dictionary`: obs_len, action_len, mask_len, discrete, alive, tick, backend (empty before load);
    /// with the `bench-timing` feature also bench_act_seconds.
    pub fn body(r: &mut Runner, api: &Api, _args: &[&Variant]) -> Variant {
        let mut entries = match r.agents() {
            Some(a) => vec![
                ("obs_len", api.int_variant(a.obs_len() as i64)),
                ("action_len", api.int_variant(a.action_len() as i64)),
                ("mask_len", api.int_variant(a.mask_len() as i64)),
                ("discrete", api.bool_variant(a.is_discrete())),
                ("alive", api.int_variant(a.len() as i64)),
                ("tick", api.int_variant(a.tick() as i64)),
                ("backend", api.string_variant(&a.backend())),
                // Whether tick() reads the ids' Array in place (gdnative::Api::probe_ints_in_place).
                ("ids_in_place", api.bool_variant(api.ints_in_place())),
            ],
            None => vec![],
        };
        // Built with `bench-timing` (engine-bench.sh): the seconds this process has spent in the runners' acts
        // (policyport_agents::bench_timing), which bench.gd reads around the calls it times.
        match policyport_agents::bench_timing::act_seconds() {
            Some(secs) if !entries.is_empty() => {
                entries.push(("bench_act_seconds", api.real_variant(secs)))
            }
            _ => {}
        }
        api.dictionary_variant(entries)
    }
}

methods!(
    load_bytes,
    last_error,
    spawn,
    despawn,
    respawn,
    tick,
    tick_masked,
    tick_discrete,
    discrete_actions,
    continuous_actions,
    set_values,
    values,
    info,
);
