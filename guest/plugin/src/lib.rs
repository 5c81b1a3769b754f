//! policyport as a plain wasm module for sandboxed hosts: the exports of ABI.md (its version: `policyport_abi`). Build with
//! `cargo build --release -p policyport-plugin --target wasm32-unknown-unknown`. The module imports only the two
//! functions of the host-lent dense kernel (`policyport_abi::host`; a host that lends nothing declines every
//! layer); everything crosses the boundary as offsets into its own memory. A panic aborts (traps) the instance; the host
//! turns the trap into a typed error and drops the instance.

use std::cell::RefCell;

use policyport::{ActMode, CompiledPolicy, EnvIds, Observations, PolicyError, Request, Session};

use policyport_abi::{ABI_VERSION, ErrorCode, Mode, ObsDType, PluginInfo};

// The codes as `i32`s, for the export bodies (the one definition is `policyport_abi::ErrorCode`).
const ERR_CALL: i32 = ErrorCode::Call.code();
const ERR_STATE: i32 = ErrorCode::State.code();
const ERR_HANDLE: i32 = ErrorCode::Handle.code();

/// The `cpu` backend, its dense layers offered to the host (the host-lent kernel, ABI.md): a host that declines
/// them all leaves the plain sandbox.
#[cfg(target_arch = "wasm32")]
fn builder() -> std::sync::Arc<dyn policyport::executor::ExecutorBuilder> {
    std::sync::Arc::new(policyport::lend::CpuWithLender::new(std::sync::Arc::new(
        host_lent::HostLender,
    )))
}

/// Natively (this crate's own unit builds) there is no host to lend: the plain `cpu` backend.
#[cfg(not(target_arch = "wasm32"))]
fn builder() -> std::sync::Arc<dyn policyport::executor::ExecutorBuilder> {
    std::sync::Arc::new(policyport::Backend::Cpu)
}

#[cfg(target_arch = "wasm32")]
mod host_lent {
    use policyport::Activation;
    use policyport::lend::DenseLender;
    use policyport_abi::host;

    #[link(wasm_import_module = "policyport_host")]
    unsafe extern "C" {
        /// `policyport_abi::host::LEND_DENSE`.
        fn pp_host_lend_dense(w: *const f32, n: u32, k: u32, bias: *const f32) -> i32;
        /// `policyport_abi::host::DENSE`.
        fn pp_host_dense(
            id: i32,
            x: *const f32,
            m: u32,
            y: *mut f32,
            act: u32,
            a: f32,
            b: f32,
        ) -> i32;
    }

    /// The host behind the imports. Sizes past `u32` (impossible in a 4 GiB memory) are never offered.
    pub(super) struct HostLender;

    impl DenseLender for HostLender {
        fn lend(&self, w: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> Option<u32> {
            let (n32, k32) = (u32::try_from(n).ok()?, u32::try_from(k).ok()?);
            let b = bias.map_or(std::ptr::null(), <[f32]>::as_ptr);
            // SAFETY: the host only reads `n·k` and `n` numbers at these pointers (ranges of this memory).
            let id = unsafe { pp_host_lend_dense(w.as_ptr(), n32, k32, b) };
            u32::try_from(id).ok()
        }

        fn run(&self, id: u32, x: &[f32], y: &mut [f32], m: usize, act: Activation) -> bool {
            let (Ok(id), Ok(m)) = (i32::try_from(id), u32::try_from(m)) else {
                return false;
            };
            let (code, a, b) = host::encode_activation(act);
            // SAFETY: the host reads `x` (m·k numbers) and writes `y` (m·n), the slices' own lengths.
            unsafe { pp_host_dense(id, x.as_ptr(), m, y.as_mut_ptr(), code, a, b) == 0 }
        }
    }
}

/// One loaded policy: a runtime session (its state, outputs and scratch) and the policy's info.
struct Slot {
    session: Session,
    /// Cached: `CompiledPolicy::info` clones the spaces, too slow for every act.
    info: policyport::PolicyInfo,
    /// `pp_act`'s episode-start bytes as flags (reused across calls).
    starts: Vec<bool>,
    /// `pp_act_masked`'s mask bytes as flags (reused across calls).
    mask: Vec<bool>,
}

thread_local! {
    static SLOTS: RefCell<Vec<Option<Slot>>> = const { RefCell::new(Vec::new()) };
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn fail(code: i32, msg: impl std::fmt::Display) -> i32 {
    LAST_ERROR.with(|e| *e.borrow_mut() = msg.to_string());
    code
}

/// The ABI code of a policy error: its kind's code, which is the ABI's by definition (`ErrorKind::code`; the
/// test `every_error_kind_is_an_abi_code` holds them together).
fn code_of(e: &PolicyError) -> i32 {
    e.kind().code()
}

/// Bytes of this module's linear memory now (it only grows, so a range checked here stays valid for the call).
fn memory_bytes() -> u64 {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::memory_size(0) as u64 * 65536
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        u64::MAX
    }
}

/// Whether `ptr .. ptr + len * size_of::<T>()` is a usable range of `T`s: empty, or non-null, aligned for `T` and
/// inside this module's memory. A host bug (or a hostile host) passing a range past the memory's end gets a code,
/// not a trap (found by the `plugin_abi` fuzz target: `pp_info` at the memory's last bytes trapped).
fn valid_range<T>(ptr: *const T, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let Some(bytes) = (len as u64).checked_mul(std::mem::size_of::<T>() as u64) else {
        return false;
    };
    !ptr.is_null()
        && (ptr as usize) % std::mem::align_of::<T>() == 0
        && (ptr as usize as u64)
            .checked_add(bytes)
            .is_some_and(|end| end <= memory_bytes())
}

/// A guest-memory slice from an ABI pointer and element count, or None when the range is unusable
/// ([`valid_range`]).
///
/// # Safety
/// The host promises a range that passes [`valid_range`] is a buffer of its own (not this module's heap or stack);
/// a lie can only corrupt this sandboxed instance, never the host.
unsafe fn slice<'a, T>(ptr: *const T, len: usize) -> Option<&'a [T]> {
    if len == 0 {
        return Some(&[]);
    }
    if !valid_range(ptr, len) {
        return None;
    }
    // SAFETY: `valid_range` checked non-null, aligned and (in wasm32) inside this module's memory, which never
    // shrinks, so the range stays readable for the call and its size fits isize; natively (this crate's unit
    // tests) the pointers are live Rust buffers. The caller's contract: the host's own buffer, which nothing in
    // this instance writes while the slice lives. `T` is only ever u8, u32 or f32 here: every bit pattern is a
    // value.
    Some(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// [`slice`], writable.
///
/// # Safety
/// As for [`slice`], and the range is not read or written through anything else while the slice lives.
unsafe fn slice_mut<'a, T>(ptr: *mut T, len: usize) -> Option<&'a mut [T]> {
    if len == 0 {
        return Some(&mut []);
    }
    if !valid_range(ptr as *const T, len) {
        return None;
    }
    // SAFETY: as in `slice` (non-null, aligned, inside the memory: checked), and the caller's contract: a host
    // buffer that no other live reference in this instance reads or writes while this one lives.
    Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

fn with_slot<R>(handle: i32, f: impl FnOnce(&mut Slot) -> Result<R, i32>) -> Result<R, i32> {
    SLOTS.with(|s| {
        let mut slots = s.borrow_mut();
        match usize::try_from(handle)
            .ok()
            .and_then(|h| slots.get_mut(h))
            .and_then(|s| s.as_mut())
        {
            Some(slot) => f(slot),
            None => Err(fail(ERR_HANDLE, format!("no policy with handle {handle}"))),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn pp_abi_version() -> u32 {
    ABI_VERSION
}

#[unsafe(no_mangle)]
pub extern "C" fn pp_alloc(len: u32) -> *mut u8 {
    let Ok(layout) = std::alloc::Layout::from_size_align(len.max(1) as usize, 16) else {
        return std::ptr::null_mut();
    };
    // SAFETY: non-zero size.
    unsafe { std::alloc::alloc(layout) }
}

/// # Safety
/// `ptr` came from `pp_alloc(len)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_free(ptr: *mut u8, len: u32) {
    // A pointer outside this module's memory cannot be one pp_alloc returned: ignored, like null.
    if let (true, Ok(layout)) = (
        !ptr.is_null() && valid_range(ptr as *const u8, len.max(1) as usize),
        std::alloc::Layout::from_size_align(len.max(1) as usize, 16),
    ) {
        // SAFETY: the caller passes back what pp_alloc returned, with its size.
        unsafe { std::alloc::dealloc(ptr, layout) }
    }
}

/// # Safety
/// `ptr .. ptr + len` is guest memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_load(ptr: *const u8, len: u32) -> i32 {
    // SAFETY: this function's contract: the host's artifact bytes, unchanged during the call (`read_artifact`
    // copies what the policy keeps); `slice` checks the range.
    let Some(bytes) = (unsafe { slice(ptr, len as usize) }) else {
        return fail(ERR_CALL, "artifact pointer is null or out of range");
    };
    let policy = policyport::format::read_artifact(bytes)
        .map_err(PolicyError::from)
        .and_then(|art| CompiledPolicy::with_builder(art, builder()));
    match policy {
        Ok(policy) => SLOTS.with(|s| {
            let mut slots = s.borrow_mut();
            let slot = Some(Slot {
                info: policy.info(),
                session: policy.session(),
                starts: vec![],
                mask: vec![],
            });
            match slots.iter().position(|s| s.is_none()) {
                Some(i) => {
                    slots[i] = slot;
                    i as i32
                }
                None => {
                    slots.push(slot);
                    slots.len() as i32 - 1
                }
            }
        }),
        Err(e) => fail(code_of(&e), e),
    }
}

/// # Safety
/// `out` points to 8 writable `u32`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_info(handle: i32, out: *mut u32) -> i32 {
    with_slot(handle, |slot| {
        // SAFETY: this function's contract: `out` is the host's buffer of INFO_WORDS words, written only here;
        // `slice_mut` checks the range.
        let Some(out) = (unsafe { slice_mut(out, policyport_abi::INFO_WORDS) }) else {
            return Err(fail(
                ERR_CALL,
                "info pointer is null, misaligned or out of range",
            ));
        };
        let i = &slot.info;
        let u8_obs = i.observation.raw_dtype() == policyport::format::ObsDType::U8;
        let info = PluginInfo {
            obs_len: i.obs_len as u32,
            action_len: i.action_len as u32,
            dist_params_len: i.dist_params_len as u32,
            has_value: i.has_value,
            discrete: i.action.is_discrete(),
            recurrent_states: i.recurrent_states as u32,
            u8_obs,
            abi_version: ABI_VERSION,
        };
        out.copy_from_slice(&info.to_words());
        Ok(0)
    })
    .unwrap_or_else(|code| code)
}

/// # Safety
/// Every non-zero pointer covers the sizes ABI.md gives for this call.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn pp_act(
    handle: i32,
    obs: *const u8,
    obs_dtype: u32,
    batch: u32,
    env_ids: *const u32,
    env_offset: u32,
    mode: u32,
    seed: u64,
    step: u64,
    actions: *mut u8,
    value: *mut f32,
    dist: *mut f32,
    episode_starts: *const u8,
) -> i32 {
    // SAFETY: pp_act_masked's contract without a mask.
    unsafe {
        pp_act_masked(
            handle,
            obs,
            obs_dtype,
            batch,
            env_ids,
            env_offset,
            mode,
            seed,
            step,
            actions,
            value,
            dist,
            episode_starts,
            core::ptr::null(),
            f32::NAN,
        )
    }
}

/// `pp_act` with an action mask (`batch × dist params` bytes, or null) and an epsilon override (NaN for none):
/// ABI version 6 (ABI.md).
///
/// # Safety
/// As `pp_act`; a non-null `action_mask` is checked against the memory like every other range.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn pp_act_masked(
    handle: i32,
    obs: *const u8,
    obs_dtype: u32,
    batch: u32,
    env_ids: *const u32,
    env_offset: u32,
    mode: u32,
    seed: u64,
    step: u64,
    actions: *mut u8,
    value: *mut f32,
    dist: *mut f32,
    episode_starts: *const u8,
    action_mask: *const u8,
    epsilon: f32,
) -> i32 {
    with_slot(handle, |slot| {
        let info = &slot.info;
        let b = batch as usize;
        let bad = |what: &str| {
            fail(
                ERR_CALL,
                format!("{what} pointer is null, misaligned or out of range"),
            )
        };
        // Every size from the caller's batch, checked (usize is 32 bits here).
        let sizes = [info.obs_len, info.action_len, info.dist_params_len].map(|n| b.checked_mul(n));
        let [Some(obs_n), Some(action_n), Some(dist_n)] = sizes else {
            return Err(fail(
                ERR_CALL,
                format!("batch {b} overflows the buffer sizes"),
            ));
        };
        // The outputs are checked before act() runs: a refused call must not advance recurrent state.
        if !valid_range(actions as *const f32, action_n) {
            return Err(bad("actions"));
        }
        if !value.is_null() && info.has_value && !valid_range(value as *const f32, b) {
            return Err(bad("value"));
        }
        if !dist.is_null() && !valid_range(dist as *const f32, dist_n) {
            return Err(bad("dist"));
        }
        let observations = match ObsDType::from_u32(obs_dtype) {
            Some(ObsDType::F32) => Observations::F32(
                // SAFETY: the contract: a host buffer of `batch × obs_len` observations that only act() reads
                // (the outputs are written after it); `slice` checks the range and its f32 alignment.
                unsafe { slice(obs as *const f32, obs_n) }.ok_or_else(|| bad("obs"))?,
            ),
            Some(ObsDType::U8) => {
                // SAFETY: as for f32, in bytes.
                Observations::U8(unsafe { slice(obs, obs_n) }.ok_or_else(|| bad("obs"))?)
            }
            None => {
                return Err(fail(
                    ERR_CALL,
                    format!("obs dtype {obs_dtype} (0 = f32, 1 = u8)"),
                ));
            }
        };
        let ids = if env_ids.is_null() {
            EnvIds::Range(env_offset)
        } else {
            // SAFETY: the contract: a host buffer of `batch` ids, only read during the call; `slice` checks it.
            EnvIds::List(unsafe { slice(env_ids, b) }.ok_or_else(|| bad("env ids"))?)
        };
        let mode = match Mode::from_u32(mode) {
            Some(Mode::Deterministic) => ActMode::Deterministic,
            Some(Mode::Sample) => ActMode::Sample { seed, step },
            None => {
                let m = mode;
                return Err(fail(
                    ERR_CALL,
                    format!("mode {m} (0 = deterministic, 1 = sample)"),
                ));
            }
        };
        let mut req = Request::new(observations, b, mode).envs(ids);
        if !episode_starts.is_null() {
            // SAFETY: the contract: `batch` host bytes, copied into `slot.starts` at once; `slice` checks them.
            let flags = unsafe { slice(episode_starts, b) }.ok_or_else(|| bad("episode starts"))?;
            policyport::flags_into(flags, &mut slot.starts);
            req = req.episode_starts(&slot.starts);
        }
        if !action_mask.is_null() {
            // SAFETY: the contract: `batch × dist params` host bytes, copied into `slot.mask` at once; `slice`
            // checks them.
            let flags = unsafe { slice(action_mask, dist_n) }.ok_or_else(|| bad("action mask"))?;
            policyport::flags_into(flags, &mut slot.mask);
            req = req.action_mask(&slot.mask);
        }
        if !epsilon.is_nan() {
            req = req.epsilon(epsilon);
        }
        if value.is_null() {
            // The host does not want the value: it is not computed (a separate critic's layers are skipped).
            req = req.skip_value();
        }
        let out = slot.session.act(&req).map_err(|e| fail(code_of(&e), e))?;
        let n = action_n;
        if info.action.is_discrete() {
            // SAFETY: the contract: the host's actions buffer (`batch × action_len` i32s), written only here after
            // act() has returned (no input slice is used any more); `slice_mut` checks the range.
            let a = unsafe { slice_mut(actions as *mut i32, n) }.ok_or_else(|| bad("actions"))?;
            for (d, s) in a.iter_mut().zip(&out.discrete) {
                *d = *s as i32;
            }
        } else {
            // SAFETY: as for discrete actions, as f32s.
            let a = unsafe { slice_mut(actions as *mut f32, n) }.ok_or_else(|| bad("actions"))?;
            a.copy_from_slice(&out.continuous);
        }
        if !value.is_null() && info.has_value {
            // SAFETY: the contract: the host's `batch` values, written only here; `slice_mut` checks the range.
            unsafe { slice_mut(value, b) }
                .ok_or_else(|| bad("value"))?
                .copy_from_slice(&out.value);
        }
        if !dist.is_null() {
            // SAFETY: the contract: the host's `batch × dist params` numbers, written only here; `slice_mut`
            // checks the range.
            unsafe { slice_mut(dist, dist_n) }
                .ok_or_else(|| bad("dist"))?
                .copy_from_slice(&out.dist_params);
        }
        Ok(0)
    })
    .unwrap_or_else(|code| code)
}

/// # Safety
/// `env_ids` covers `n` `u32`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_reset(handle: i32, env_ids: *const u32, n: u32) -> i32 {
    with_slot(handle, |slot| {
        // SAFETY: this function's contract: `n` host ids, only read during the call; `slice` checks the range.
        let ids = unsafe { slice(env_ids, n as usize) }
            .ok_or_else(|| fail(ERR_CALL, "env ids pointer"))?;
        slot.session.reset(ids).map_err(|e| fail(code_of(&e), e))?;
        Ok(0)
    })
    .unwrap_or_else(|code| code)
}

/// # Safety
/// `out` covers `cap` writable `f32`s when `cap` holds the whole tensor (it is not touched otherwise).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_state(handle: i32, k: u32, out: *mut f32, cap: u32) -> i32 {
    with_slot(handle, |slot| {
        let count = slot.info.recurrent_states;
        if k as usize >= count {
            let e = PolicyError::from(policyport::StateError::NoSuchTensor {
                index: k as usize,
                count,
            });
            return Err(fail(code_of(&e), e));
        }
        let envs = slot.session.num_envs();
        if envs == 0 {
            return Ok(0);
        }
        let numel = slot
            .session
            .state(k as usize, 0)
            .map_err(|e| fail(code_of(&e), e))?
            .len();
        let total = match envs.checked_mul(numel).filter(|t| *t <= i32::MAX as usize) {
            Some(t) => t,
            None => return Err(fail(ERR_STATE, "recurrent state too large to report")),
        };
        if cap as usize >= total {
            // SAFETY: the contract: `out` covers `cap` ≥ `total` host floats, written only here; `slice_mut`
            // checks the range.
            let dst = unsafe { slice_mut(out, total) }.ok_or_else(|| {
                fail(
                    ERR_CALL,
                    "state pointer is null, misaligned or out of range",
                )
            })?;
            for (env, row) in dst.chunks_exact_mut(numel).enumerate() {
                let src = slot
                    .session
                    .state(k as usize, env as u32)
                    .map_err(|e| fail(code_of(&e), e))?;
                row.copy_from_slice(src);
            }
        }
        Ok(total as i32)
    })
    .unwrap_or_else(|code| code)
}

/// # Safety
/// `buf` covers `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pp_last_error(buf: *mut u8, len: u32) -> u32 {
    LAST_ERROR.with(|e| {
        let e = e.borrow();
        let n = e.len().min(len as usize);
        // SAFETY: this function's contract: `buf` covers `len` ≥ n writable host bytes; `slice_mut` checks them.
        if let Some(dst) = unsafe { slice_mut(buf, n) } {
            dst.copy_from_slice(&e.as_bytes()[..n]);
        }
        e.len() as u32
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn pp_drop(handle: i32) -> i32 {
    SLOTS.with(|s| {
        let mut slots = s.borrow_mut();
        match usize::try_from(handle).ok().and_then(|h| slots.get_mut(h)) {
            Some(slot @ Some(_)) => {
                *slot = None;
                0
            }
            _ => fail(ERR_HANDLE, format!("no policy with handle {handle}")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use policyport::ErrorKind;

    /// `code_of` returns a policy error's kind's code as the ABI's: every kind a plugin's runtime can report must
    /// be an ABI code, and the one the ABI documents for it (the ABI's own codes, Handle and Memory, are no
    /// kind's; `ErrorKind::Sandbox` is the host's, for the sandbox failing, never a plugin's answer).
    #[test]
    fn every_error_kind_is_an_abi_code() {
        assert_eq!(ErrorCode::from_code(ErrorKind::Sandbox.code()), None);
        for kind in ErrorKind::ALL
            .into_iter()
            .filter(|k| *k != ErrorKind::Sandbox)
        {
            let code = ErrorCode::from_code(kind.code())
                .unwrap_or_else(|| panic!("{kind} has no ABI code"));
            let want = match kind {
                ErrorKind::Artifact => ErrorCode::Artifact,
                ErrorKind::Observation => ErrorCode::Observation,
                ErrorKind::Call => ErrorCode::Call,
                ErrorKind::State => ErrorCode::State,
                ErrorKind::Backend => ErrorCode::Backend,
                ErrorKind::TooLarge => ErrorCode::TooLarge,
                ErrorKind::NonFinite => ErrorCode::NonFinite,
                _ => panic!("{kind}: a new kind needs its ABI code (policyport_abi::ErrorCode)"),
            };
            assert_eq!(code, want, "{kind}");
        }
        for code in [ErrorCode::Handle, ErrorCode::Memory] {
            assert_eq!(ErrorKind::from_code(code.code()), None);
        }
    }
}
