//! The policyport plugin ABI (`guest/plugin/ABI.md`, version 6) as code: one definition of the version, the export
//! names, the error codes, the `pp_info` words and the `pp_act` argument encodings, shared by the plugin (inside the
//! sandbox), the wasmtime host and the C ABI. Before this crate each side kept its own copy (the plugin's `ERR_*`
//! constants were unused by the host, which matched literal `-1`..`-4`, and decoded `pp_info` by index).

#![no_std]

/// The ABI version a plugin reports from `pp_abi_version` and a host requires. Version 2 added `pp_act`'s
/// `episode_starts` (the one state model: a per-row flag that zeroes the env's state before the step); version 3
/// added `pp_state` (reading the recurrent state back, so the plugin is a runtime `Executor` like any other);
/// version 4 the codes [`ErrorCode::TooLarge`] and [`ErrorCode::NonFinite`]; version 5 the two imports of
/// [`host`] (the host-lent dense kernel: a host that lends nothing declines every offer); version 6 the export
/// `pp_act_masked` (format 1.4's action masks and epsilon override, [`ActMaskedParams`]).
pub const ABI_VERSION: u32 = 6;

/// Export names (and the one exported memory).
pub mod export {
    pub const MEMORY: &str = "memory";
    pub const ABI_VERSION: &str = "pp_abi_version";
    pub const ALLOC: &str = "pp_alloc";
    pub const FREE: &str = "pp_free";
    pub const LOAD: &str = "pp_load";
    pub const INFO: &str = "pp_info";
    pub const ACT: &str = "pp_act";
    pub const ACT_MASKED: &str = "pp_act_masked";
    pub const RESET: &str = "pp_reset";
    pub const STATE: &str = "pp_state";
    pub const LAST_ERROR: &str = "pp_last_error";
    pub const DROP: &str = "pp_drop";
}

/// The plugin's imports (module [`host::MODULE`]): the host-lent dense kernel. Every host provides both; one that
/// lends nothing returns [`host::DECLINED`] from `pp_host_lend_dense`, and the plugin then computes every layer
/// itself (the plain sandbox). A host that lends computes `y = act(x Wᵀ + b)` natively on ranges of the guest's
/// memory it checked (ABI.md, "Host-lent dense layers"): the guest never gives the host code, only numbers.
pub mod host {
    use policyport_shaders::Activation;

    pub const MODULE: &str = "policyport_host";
    /// `pp_host_lend_dense(w: u32, n: u32, k: u32, bias: u32) -> i32`: offer one dense layer (`w`: `n × k` `f32`
    /// row-major, PyTorch's layout; `bias`: `n` `f32`, or 0 for none). The host copies what it takes: a layer id
    /// (`≥ 0`), or [`DECLINED`] (the plugin computes the layer itself).
    pub const LEND_DENSE: &str = "pp_host_lend_dense";
    /// `pp_host_dense(id: i32, x: u32, m: u32, y: u32, act: u32, a: f32, b: f32) -> i32`: `y[m × n] = act(x[m × k]
    /// Wᵀ + b)` for a lent layer; 0, or a negative [`DenseRefusal`] (the plugin then computes the layer itself).
    pub const DENSE: &str = "pp_host_dense";
    /// What `pp_host_lend_dense` returns for a layer the host does not take.
    pub const DECLINED: i32 = -1;

    /// Why `pp_host_dense` did not compute a layer (the plugin falls back to its own kernels; nothing is lost).
    #[repr(i32)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum DenseRefusal {
        /// No lent layer with that id.
        Id = -1,
        /// A range outside the guest's memory, misaligned, or `x` and `y` overlapping.
        Range = -2,
        /// An activation code (or its parameters) this host does not know.
        Activation = -3,
    }

    /// Activation codes of `pp_host_dense` (`act`, with up to two `f32` parameters `a`, `b`).
    pub mod act {
        pub const IDENTITY: u32 = 0;
        pub const RELU: u32 = 1;
        pub const TANH: u32 = 2;
        pub const SIGMOID: u32 = 3;
        pub const SILU: u32 = 4;
        /// `a`: alpha.
        pub const ELU: u32 = 5;
        /// `a`: the negative slope.
        pub const LEAKY_RELU: u32 = 6;
        pub const GELU: u32 = 7;
        pub const GELU_TANH: u32 = 8;
        pub const ERF: u32 = 9;
        pub const EXP: u32 = 10;
        /// `a`, `b`: the bounds (an open side is ±infinity).
        pub const CLIP: u32 = 11;
    }

    /// `(code, a, b)` of an activation (unused parameters are 0).
    pub fn encode_activation(f: Activation) -> (u32, f32, f32) {
        match f {
            Activation::Identity => (act::IDENTITY, 0.0, 0.0),
            Activation::Relu => (act::RELU, 0.0, 0.0),
            Activation::Tanh => (act::TANH, 0.0, 0.0),
            Activation::Sigmoid => (act::SIGMOID, 0.0, 0.0),
            Activation::Silu => (act::SILU, 0.0, 0.0),
            Activation::Elu(a) => (act::ELU, a, 0.0),
            Activation::LeakyRelu(a) => (act::LEAKY_RELU, a, 0.0),
            Activation::Gelu => (act::GELU, 0.0, 0.0),
            Activation::GeluTanh => (act::GELU_TANH, 0.0, 0.0),
            Activation::Erf => (act::ERF, 0.0, 0.0),
            Activation::Exp => (act::EXP, 0.0, 0.0),
            Activation::Clip(lo, hi) => (act::CLIP, lo, hi),
        }
    }

    /// The activation of `(code, a, b)`; `None` for an unknown code or a NaN parameter (a hostile guest's).
    pub fn decode_activation(code: u32, a: f32, b: f32) -> Option<Activation> {
        if a.is_nan() || b.is_nan() {
            return None;
        }
        Some(match code {
            act::IDENTITY => Activation::Identity,
            act::RELU => Activation::Relu,
            act::TANH => Activation::Tanh,
            act::SIGMOID => Activation::Sigmoid,
            act::SILU => Activation::Silu,
            act::ELU => Activation::Elu(a),
            act::LEAKY_RELU => Activation::LeakyRelu(a),
            act::GELU => Activation::Gelu,
            act::GELU_TANH => Activation::GeluTanh,
            act::ERF => Activation::Erf,
            act::EXP => Activation::Exp,
            act::CLIP => Activation::Clip(a, b),
            _ => return None,
        })
    }
}

/// `pp_act(handle, obs, obs_dtype, batch, env_ids, env_offset, mode, seed, step, actions, value, dist,
/// episode_starts) -> i32`: the wasm parameter types in order (pointers are `u32` offsets into the plugin's memory;
/// `episode_starts` is `batch` bytes, non-zero = the row's env starts a new episode, or 0 for none).
pub type ActParams = (
    i32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u64,
    u64,
    u32,
    u32,
    u32,
    u32,
);

/// `pp_act_masked(.. pp_act's 13 ..., action_mask, epsilon) -> i32`: [`ActParams`] then `action_mask` (`u32`:
/// `batch × dist params` bytes, non-zero allowing the action, or 0 for none) and `epsilon` (`f32`: a Q-value
/// policy's exploration rate for this call, NaN for the artifact's).
pub type ActMaskedParams = (
    i32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u64,
    u64,
    u32,
    u32,
    u32,
    u32,
    u32,
    f32,
);

/// The negative result codes of the exports (`0` is ok, `≥ 0` from `pp_load` is a handle).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The artifact is not a valid `.policy` file (format, checksums, limits, unsupported version).
    Artifact = -1,
    /// Observations of the wrong length, NaN / Inf, or the wrong dtype.
    Observation = -2,
    /// A bad call: batch, env ids, a null / misaligned / out-of-range pointer, an unknown mode or dtype.
    Call = -3,
    /// Recurrent state.
    State = -4,
    /// The runtime's backend failed.
    Backend = -5,
    /// No policy with that handle.
    Handle = -6,
    /// The plugin ran out of memory.
    Memory = -7,
    /// The request (batch, envs) or the policy is over the policy's memory limit: refused before allocating.
    TooLarge = -8,
    /// The policy computed a non-finite output.
    NonFinite = -9,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 9] = [
        ErrorCode::Artifact,
        ErrorCode::Observation,
        ErrorCode::Call,
        ErrorCode::State,
        ErrorCode::Backend,
        ErrorCode::Handle,
        ErrorCode::Memory,
        ErrorCode::TooLarge,
        ErrorCode::NonFinite,
    ];

    pub const fn code(self) -> i32 {
        self as i32
    }

    /// The code for a negative export result; `None` for a value the ABI does not define.
    pub fn from_code(code: i32) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.code() == code)
    }

    /// The words ABI.md uses for this code.
    pub const fn description(self) -> &'static str {
        match self {
            ErrorCode::Artifact => "invalid artifact",
            ErrorCode::Observation => "bad observations",
            ErrorCode::Call => "bad call",
            ErrorCode::State => "recurrent state",
            ErrorCode::Backend => "backend",
            ErrorCode::Handle => "unknown handle",
            ErrorCode::Memory => "out of memory",
            ErrorCode::TooLarge => "over the memory limit",
            ErrorCode::NonFinite => "non-finite output",
        }
    }
}

/// How many `u32` words `pp_info` writes.
pub const INFO_WORDS: usize = 8;

/// What `pp_info` reports about a loaded policy, in word order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PluginInfo {
    /// Observation numbers per env.
    pub obs_len: u32,
    /// Action numbers per env.
    pub action_len: u32,
    /// Distribution parameters per env.
    pub dist_params_len: u32,
    pub has_value: bool,
    /// Discrete / multi-discrete actions (`i32` in `pp_act`'s actions buffer) rather than a box (`f32`).
    pub discrete: bool,
    /// Recurrent state tensors.
    pub recurrent_states: u32,
    /// Observations are `u8` (`ObsDType::U8`) rather than `f32`.
    pub u8_obs: bool,
    /// The plugin's ABI version (repeated for hosts that only read `pp_info`).
    pub abi_version: u32,
}

/// `pp_info` words that are not a valid [`PluginInfo`] (a flag other than 0/1): a broken or hostile plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadInfoWord {
    pub index: usize,
    pub value: u32,
}

impl PluginInfo {
    /// Names of the words, in order (as ABI.md lists them).
    pub const WORD_NAMES: [&'static str; INFO_WORDS] = [
        "obs numbers per env",
        "action numbers per env",
        "dist params per env",
        "has value (0/1)",
        "discrete actions (0/1)",
        "recurrent state tensors",
        "obs dtype (0 f32, 1 u8)",
        "ABI version",
    ];

    pub fn to_words(&self) -> [u32; INFO_WORDS] {
        [
            self.obs_len,
            self.action_len,
            self.dist_params_len,
            self.has_value as u32,
            self.discrete as u32,
            self.recurrent_states,
            self.u8_obs as u32,
            self.abi_version,
        ]
    }

    pub fn from_words(w: [u32; INFO_WORDS]) -> Result<PluginInfo, BadInfoWord> {
        let flag = |index: usize| match w[index] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(BadInfoWord { index, value }),
        };
        Ok(PluginInfo {
            obs_len: w[0],
            action_len: w[1],
            dist_params_len: w[2],
            has_value: flag(3)?,
            discrete: flag(4)?,
            recurrent_states: w[5],
            u8_obs: flag(6)?,
            abi_version: w[7],
        })
    }

    /// Little-endian bytes of the words (what the host reads out of the plugin's memory).
    pub fn from_le_bytes(b: [u8; INFO_WORDS * 4]) -> Result<PluginInfo, BadInfoWord> {
        let mut w = [0u32; INFO_WORDS];
        for (i, word) in w.iter_mut().enumerate() {
            *word = u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
        }
        PluginInfo::from_words(w)
    }
}

/// `pp_act`'s `obs_dtype`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObsDType {
    F32 = 0,
    U8 = 1,
}

impl ObsDType {
    pub fn from_u32(v: u32) -> Option<ObsDType> {
        match v {
            0 => Some(ObsDType::F32),
            1 => Some(ObsDType::U8),
            _ => None,
        }
    }
}

/// `pp_act`'s `mode`: deterministic, or seeded sampling with `(seed, env id, step)`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Deterministic = 0,
    Sample = 1,
}

impl Mode {
    pub fn from_u32(v: u32) -> Option<Mode> {
        match v {
            0 => Some(Mode::Deterministic),
            1 => Some(Mode::Sample),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;
    use std::string::String;
    use std::vec::Vec;

    const ABI_MD: &str = include_str!("../../plugin/ABI.md");

    /// The prose contract names every code with its number, every info word in order, and every export.
    #[test]
    fn abi_md_matches_the_code() {
        // Line breaks in the prose are not differences.
        let md: String = ABI_MD.split_whitespace().collect::<Vec<_>>().join(" ");
        let md = md.as_str();
        assert!(md.starts_with(&format!("# policyport plugin ABI, version {ABI_VERSION}")));
        for c in ErrorCode::ALL {
            let text = format!("`{}` {}", c.code(), c.description());
            assert!(md.contains(&text), "ABI.md lacks {text:?}");
        }
        let words = PluginInfo::WORD_NAMES.join(", ");
        assert!(
            md.contains(&words),
            "ABI.md's pp_info words differ from {words:?}"
        );
        for name in [
            export::ABI_VERSION,
            export::ALLOC,
            export::FREE,
            export::LOAD,
            export::INFO,
            export::ACT,
            export::ACT_MASKED,
            export::RESET,
            export::STATE,
            export::LAST_ERROR,
            export::DROP,
        ] {
            assert!(
                md.contains(&format!("| `{name}` |")),
                "ABI.md lacks export {name}"
            );
        }
    }

    #[test]
    fn abi_md_names_the_imports_and_activation_codes() {
        let md: String = ABI_MD.split_whitespace().collect::<Vec<_>>().join(" ");
        for name in [host::MODULE, host::LEND_DENSE, host::DENSE] {
            assert!(
                md.contains(&format!("`{name}`")),
                "ABI.md lacks import {name}"
            );
        }
        for (code, name) in [
            (host::act::IDENTITY, "identity"),
            (host::act::RELU, "relu"),
            (host::act::TANH, "tanh"),
            (host::act::SIGMOID, "sigmoid"),
            (host::act::SILU, "silu"),
            (host::act::ELU, "elu"),
            (host::act::LEAKY_RELU, "leaky relu"),
            (host::act::GELU, "gelu"),
            (host::act::GELU_TANH, "gelu (tanh)"),
            (host::act::ERF, "erf"),
            (host::act::EXP, "exp"),
            (host::act::CLIP, "clip"),
        ] {
            assert!(
                md.contains(&format!("`{code}` {name}")),
                "ABI.md lacks activation {code} {name}"
            );
        }
    }

    #[test]
    fn every_activation_round_trips_and_unknown_codes_are_refused() {
        for f in policyport_shaders::Activation::ALL {
            let (c, a, b) = host::encode_activation(f);
            assert_eq!(host::decode_activation(c, a, b), Some(f));
        }
        assert_eq!(host::decode_activation(12, 0.0, 0.0), None);
        assert_eq!(host::decode_activation(u32::MAX, 0.0, 0.0), None);
        assert_eq!(
            host::decode_activation(host::act::CLIP, f32::NAN, 1.0),
            None
        );
    }

    #[test]
    fn codes_and_words_round_trip() {
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_code(c.code()), Some(c));
        }
        assert_eq!(ErrorCode::from_code(0), None);
        assert_eq!(ErrorCode::from_code(-10), None);
        assert_eq!(ErrorCode::from_code(i32::MIN), None);
        let info = PluginInfo {
            obs_len: 4,
            action_len: 1,
            dist_params_len: 2,
            has_value: true,
            discrete: true,
            recurrent_states: 3,
            u8_obs: false,
            abi_version: ABI_VERSION,
        };
        assert_eq!(PluginInfo::from_words(info.to_words()), Ok(info));
        let mut w = info.to_words();
        w[4] = 7;
        assert_eq!(
            PluginInfo::from_words(w),
            Err(BadInfoWord { index: 4, value: 7 })
        );
        let mut b = [0u8; 32];
        for (i, x) in info.to_words().iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
        }
        assert_eq!(PluginInfo::from_le_bytes(b), Ok(info));
    }
}
