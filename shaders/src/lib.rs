//! The WGSL kernels of policyport's GPU path and their CPU references.
//!
//! - `dense_small.wgsl` / `dense_tiled.wgsl`: dense + bias + activation fused (one dispatch per layer): the
//!   small-batch variant keeps many output columns in flight, the tiled one stages 64x64 tiles in workgroup
//!   memory. The activation is spliced in as text ([`dense_source`]), so each (variant, activation) is its own
//!   pipeline, compiled at load.
//! - `sample.wgsl`: SPEC.md's seeded sampling (Philox4x32-10, inverse-CDF categorical, Box–Muller Gaussian, squash
//!   or clip) plus parameter finishing and output packing, so act() reads back one buffer.
//! - `preprocess.wgsl`: observation scale / normalise + clip ([`preprocess_source`]).
//! - `state.wgsl`: gather / scatter of per-env recurrent state rows kept on the device between steps.
//! - `conv2d.wgsl`: 2-D convolution + bias + activation fused (one dispatch per layer; [`conv2d_source`],
//!   [`Conv2dShape`]), a direct convolution with a block of output channels per invocation.
//!
//! Every storage buffer is declared `read_write`, inputs included: burn's allocator hands out slices of shared
//! pool buffers, and wgpu refuses a dispatch that binds one buffer both read-only and read-write (WebGPU usage
//! scopes); read-write bindings may alias. Kernels never write their inputs.
//!
//! Every variant is parsed and validated with naga in this crate's tests (no GPU needed); the guest's wgpu tests
//! run each kernel on a real device against the references in [`reference`].

// The kernels without their comments and indentation (build.rs): what ships, and what naga validates here.
pub const DENSE_SMALL: &str = include_str!(concat!(env!("OUT_DIR"), "/dense_small.wgsl"));
pub const DENSE_TILED: &str = include_str!(concat!(env!("OUT_DIR"), "/dense_tiled.wgsl"));
pub const SAMPLE: &str = include_str!(concat!(env!("OUT_DIR"), "/sample.wgsl"));
pub const PREPROCESS: &str = include_str!(concat!(env!("OUT_DIR"), "/preprocess.wgsl"));
pub const STATE: &str = include_str!(concat!(env!("OUT_DIR"), "/state.wgsl"));
pub const CONV2D: &str = include_str!(concat!(env!("OUT_DIR"), "/conv2d.wgsl"));

/// Activations a dense kernel can fuse (the guest's elementwise ops).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    Identity,
    Relu,
    Tanh,
    Sigmoid,
    Silu,
    Elu(f32),
    LeakyRelu(f32),
    Gelu,
    GeluTanh,
    Erf,
    Exp,
    /// `clamp(v, lo, hi)`; an open side is ±infinity.
    Clip(f32, f32),
}

impl Activation {
    pub const ALL: [Activation; 14] = [
        Activation::Identity,
        Activation::Relu,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::Silu,
        Activation::Elu(1.0),
        Activation::LeakyRelu(0.01),
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Erf,
        Activation::Exp,
        Activation::Clip(-1.5, 2.0),
        Activation::Clip(f32::NEG_INFINITY, 0.25),
        Activation::Clip(-20.0, f32::INFINITY),
    ];
}

/// An exact f32 constant in WGSL.
pub fn f32_lit(v: f32) -> String {
    format!("bitcast<f32>({:#010x}u)", v.to_bits())
}

/// WGSL helpers + `fn act(v: f32) -> f32` for one activation. tanh and exp arguments are clamped so no
/// implementation can overflow to inf/NaN (WGSL lets them assume finite math); the clamps do not change f32
/// results (tanh(±15) and sigmoid at the clamp are already ±1 / 0 / 1 in f32).
pub fn act_fn(a: Activation) -> String {
    let helpers = "fn pp_tanh(v: f32) -> f32 { return tanh(clamp(v, -15.0, 15.0)); }\n\
fn pp_sigmoid(v: f32) -> f32 { return 1.0 / (1.0 + exp(clamp(-v, -88.0, 88.0))); }\n\
fn pp_erf(x: f32) -> f32 {\n\
    let a = abs(x);\n\
    let t = 1.0 / fma(0.3275911, a, 1.0);\n\
    var p = 1.0614054;\n\
    p = fma(p, t, -1.4531521);\n\
    p = fma(p, t, 1.4214137);\n\
    p = fma(p, t, -0.28449674);\n\
    p = fma(p, t, 0.2548296);\n\
    let y = 1.0 - t * p * exp(-min(a * a, 88.0));\n\
    return select(-y, y, x >= 0.0);\n\
}\n";
    let body = match a {
        Activation::Identity => "v".to_string(),
        Activation::Relu => "max(v, 0.0)".to_string(),
        Activation::Tanh => "pp_tanh(v)".to_string(),
        Activation::Sigmoid => "pp_sigmoid(v)".to_string(),
        Activation::Silu => "v * pp_sigmoid(v)".to_string(),
        Activation::Elu(al) => format!(
            "select({} * (exp(min(v, 0.0)) - 1.0), v, v > 0.0)",
            f32_lit(al)
        ),
        Activation::LeakyRelu(al) => format!("select({} * v, v, v > 0.0)", f32_lit(al)),
        Activation::Gelu => "0.5 * v * (1.0 + pp_erf(v * 0.70710677))".to_string(),
        Activation::GeluTanh => {
            "0.5 * v * (1.0 + pp_tanh(0.7978846 * (v + 0.044715 * v * v * v)))".to_string()
        }
        Activation::Erf => "pp_erf(v)".to_string(),
        // exp overflows f32 above 88.72; the clamp keeps WGSL's finite-math assumption (and matches the CPU kernel).
        Activation::Exp => "exp(clamp(v, -104.0, 88.7))".to_string(),
        Activation::Clip(lo, hi) => {
            let mut e = "v".to_string();
            if lo.is_finite() {
                e = format!("max({e}, {})", f32_lit(lo));
            }
            if hi.is_finite() {
                e = format!("min({e}, {})", f32_lit(hi));
            }
            e
        }
    };
    format!("{helpers}fn act(v: f32) -> f32 {{ return {body}; }}\n")
}

/// Which dense kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenseVariant {
    Small,
    Tiled,
}

impl DenseVariant {
    /// The variant act() uses for a batch of `rows` (tiles pay off once a 64-row tile is mostly full).
    pub fn for_rows(rows: usize) -> Self {
        if rows >= 48 {
            DenseVariant::Tiled
        } else {
            DenseVariant::Small
        }
    }

    /// Workgroups to dispatch for `rows x n` outputs.
    pub fn workgroups(self, rows: usize, n: usize) -> (u32, u32, u32) {
        match self {
            DenseVariant::Small => (n.div_ceil(64) as u32, rows.div_ceil(4) as u32, 1),
            DenseVariant::Tiled => (n.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1),
        }
    }
}

pub fn dense_source(variant: DenseVariant, act: Activation) -> String {
    let t = match variant {
        DenseVariant::Small => DENSE_SMALL,
        DenseVariant::Tiled => DENSE_TILED,
    };
    t.replace("{{ACT_FN}}", &act_fn(act))
}

pub fn conv2d_source(act: Activation) -> String {
    CONV2D.replace("{{ACT_FN}}", &act_fn(act))
}

/// Output channels one invocation of `conv2d.wgsl` computes (its `OB`).
pub const CONV2D_CHANNEL_BLOCK: usize = 4;
/// Invocations per workgroup of `conv2d.wgsl`, and per row of its dispatch grid (its `GRID_X`).
const CONV2D_WORKGROUP: usize = 64;
const CONV2D_GRID_X: usize = 65535 * CONV2D_WORKGROUP;

/// The geometry of one convolution over `[rows, C, H, W]` inputs (PyTorch's `Conv2d`; padding is
/// `[top, left, bottom, right]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dShape {
    pub rows: usize,
    pub input: [usize; 3],
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 4],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Conv2dShape {
    /// `[OH, OW]` (the format's formula); `None` where the kernel does not fit the padded input.
    pub fn output_hw(&self) -> Option<[usize; 2]> {
        let dim = |i: usize| {
            let span = self.dilation[i].checked_mul(self.kernel[i].checked_sub(1)?)? + 1;
            let padded = self.input[1 + i] + self.padding[i] + self.padding[i + 2];
            Some(padded.checked_sub(span)? / self.stride[i] + 1)
        };
        Some([dim(0)?, dim(1)?])
    }

    /// Invocations of one dispatch: env × group × channel block × output position.
    pub fn invocations(&self) -> Option<usize> {
        let [oh, ow] = self.output_hw()?;
        let og = self.out_channels / self.groups;
        self.rows
            .checked_mul(self.groups)?
            .checked_mul(og.div_ceil(CONV2D_CHANNEL_BLOCK))?
            .checked_mul(oh)?
            .checked_mul(ow)
    }

    /// The kernel's `params` buffer, or `None` when a count or an index of the dispatch does not fit the
    /// kernel's u32 arithmetic (input, weights, output and invocations all below 2^32 elements).
    pub fn params(&self, has_bias: bool) -> Option<Vec<u32>> {
        let [c, h, w] = self.input;
        let [oh, ow] = self.output_hw()?;
        let fits = |n: Option<usize>| n.filter(|n| *n < u32::MAX as usize);
        fits(self.rows.checked_mul(c)?.checked_mul(h)?.checked_mul(w))?;
        fits(
            self.rows
                .checked_mul(self.out_channels)?
                .checked_mul(oh)?
                .checked_mul(ow),
        )?;
        let invocations = fits(self.invocations())?;
        // The grid's last row must not wrap either (gid.y * GRID_X + gid.x).
        fits(invocations.checked_add(CONV2D_GRID_X))?;
        let v = [
            self.rows,
            c,
            h,
            w,
            self.out_channels,
            oh,
            ow,
            self.kernel[0],
            self.kernel[1],
            self.stride[0],
            self.stride[1],
            self.dilation[0],
            self.dilation[1],
            self.padding[0],
            self.padding[1],
            self.groups,
            has_bias as usize,
            invocations,
        ];
        v.iter().map(|x| u32::try_from(*x).ok()).collect()
    }

    /// Workgroups to dispatch (`None` as for [`Conv2dShape::params`]).
    pub fn workgroups(&self) -> Option<(u32, u32, u32)> {
        let n = self.invocations()?;
        let groups = n.div_ceil(CONV2D_WORKGROUP).max(1);
        if groups <= 65535 {
            Some((groups as u32, 1, 1))
        } else {
            Some((65535, u32::try_from(n.div_ceil(CONV2D_GRID_X)).ok()?, 1))
        }
    }
}

/// One preprocessing step, with offsets of its statistics in the `stats` buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum PreStep {
    Scale(f32),
    Normalize {
        mean_offset: usize,
        std_offset: usize,
        clip: Option<f32>,
    },
}

/// How the preprocessing kernel reads its input buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreInput {
    /// f32 values.
    F32,
    /// uint8 values as bytes packed four to a u32 word, little-endian: value i is bits `8·(i % 4)..` of word
    /// `i / 4` (the last word zero-padded). Widened to f32 by the kernel.
    U8,
}

/// The preprocessing kernel for f32 input.
pub fn preprocess_source(steps: &[PreStep]) -> String {
    preprocess_source_for(PreInput::F32, steps)
}

/// The preprocessing kernel for `input`: `steps` in order on each value.
pub fn preprocess_source_for(input: PreInput, steps: &[PreStep]) -> String {
    let mut body = String::new();
    for s in steps {
        match s {
            PreStep::Scale(f) => body.push_str(&format!("    v = v * {};\n", f32_lit(*f))),
            PreStep::Normalize {
                mean_offset,
                std_offset,
                clip,
            } => {
                body.push_str(&format!(
                    "    v = (v - stats[{mean_offset}u + c]) / stats[{std_offset}u + c];\n"
                ));
                if let Some(c) = clip {
                    body.push_str(&format!("    v = clamp(v, -{0}, {0});\n", f32_lit(*c)));
                }
            }
        }
    }
    if !steps.iter().any(|s| matches!(s, PreStep::Normalize { .. })) {
        // Keep `stats` statically used: the bind group layout is derived from the shader, and a layout without
        // binding 2 refuses the runtime's 4-buffer bind group (a scale-only chain, e.g. /255 of uint8 frames,
        // failed validation on every wgpu device). Never executed: `total == 0` returned above.
        body.push_str("    if (total == 0u) { v = stats[0]; }\n");
    }
    let (ty, load) = match input {
        PreInput::F32 => ("f32", "x[i]"),
        PreInput::U8 => ("u32", "f32((x[i / 4u] >> (8u * (i % 4u))) & 255u)"),
    };
    PREPROCESS
        .replace("{{STEPS}}", &body)
        .replace("{{INPUT}}", ty)
        .replace("{{LOAD}}", load)
}

/// Every kernel variant the runtime can generate, by name: every dense variant × activation, the sampler, the
/// state mover, and representative preprocessing chains. The naga tests below validate each; the browser tests
/// (`tests/browser/run.mjs`, through `policyport serve-web`'s `/shaders.json`) compile each with Chrome's Tint,
/// which enforces WGSL rules naga does not (uniformity analysis).
pub fn all_sources() -> Vec<(String, String)> {
    let mut out = vec![];
    for v in [DenseVariant::Small, DenseVariant::Tiled] {
        for a in Activation::ALL {
            out.push((format!("dense {v:?} {a:?}"), dense_source(v, a)));
        }
    }
    for a in Activation::ALL {
        out.push((format!("conv2d {a:?}"), conv2d_source(a)));
    }
    out.push(("sample".into(), SAMPLE.into()));
    out.push(("state".into(), STATE.into()));
    for steps in [
        vec![],
        vec![PreStep::Scale(1.0 / 255.0)],
        vec![
            PreStep::Scale(0.5),
            PreStep::Normalize {
                mean_offset: 0,
                std_offset: 4,
                clip: Some(10.0),
            },
        ],
        vec![PreStep::Normalize {
            mean_offset: 3,
            std_offset: 9,
            clip: None,
        }],
    ] {
        out.push((format!("preprocess {steps:?}"), preprocess_source(&steps)));
        out.push((
            format!("preprocess u8 {steps:?}"),
            preprocess_source_for(PreInput::U8, &steps),
        ));
    }
    out
}

/// Workgroups for an elementwise pass over `total` values (256 per workgroup; 2-D past the 65535 limit).
pub fn elementwise_workgroups(total: usize) -> (u32, u32, u32) {
    let groups = total.div_ceil(256).max(1);
    if groups <= 65535 {
        (groups as u32, 1, 1)
    } else {
        (65535, groups.div_ceil(65535) as u32, 1)
    }
}

/// CPU references of the kernels (same arithmetic order where it matters).
pub mod reference {
    use super::{Activation, PreStep};

    fn erf(x: f32) -> f32 {
        let a = x.abs();
        let t = 1.0 / 0.327_591_1f32.mul_add(a, 1.0);
        let mut p = 1.061_405_4f32;
        for c in [-1.453_152_1, 1.421_413_7, -0.284_496_74, 0.254_829_6] {
            p = p.mul_add(t, c);
        }
        let y = 1.0 - t * p * (-(a * a).min(88.0)).exp();
        if x >= 0.0 { y } else { -y }
    }

    fn sigmoid(v: f32) -> f32 {
        1.0 / (1.0 + (-v).clamp(-88.0, 88.0).exp())
    }

    pub fn act(a: Activation, v: f32) -> f32 {
        match a {
            Activation::Identity => v,
            Activation::Relu => v.max(0.0),
            Activation::Tanh => v.tanh(),
            Activation::Sigmoid => sigmoid(v),
            Activation::Silu => v * sigmoid(v),
            Activation::Elu(al) => {
                if v > 0.0 {
                    v
                } else {
                    al * (v.exp() - 1.0)
                }
            }
            Activation::LeakyRelu(al) => {
                if v > 0.0 {
                    v
                } else {
                    al * v
                }
            }
            Activation::Gelu => 0.5 * v * (1.0 + erf(v * std::f32::consts::FRAC_1_SQRT_2)),
            Activation::GeluTanh => {
                0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044715 * v * v * v)).tanh())
            }
            Activation::Erf => erf(v),
            Activation::Exp => v.clamp(-104.0, 88.7).exp(),
            Activation::Clip(lo, hi) => v.max(lo).min(hi),
        }
    }

    /// y = act(x @ w + b), x `[rows, k]`, w `[k, n]` (pre-transposed), accumulated in f64 (the reference).
    pub fn dense(
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        rows: usize,
        k: usize,
        n: usize,
        a: Activation,
    ) -> Vec<f32> {
        let mut y = vec![0.0f32; rows * n];
        for r in 0..rows {
            for o in 0..n {
                let mut s = 0.0f64;
                for i in 0..k {
                    s += x[r * k + i] as f64 * w[i * n + o] as f64;
                }
                let s = s as f32 + b.map_or(0.0, |b| b[o]);
                y[r * n + o] = act(a, s);
            }
        }
        y
    }

    /// The convolution of `conv2d.wgsl` on `[rows, C, H, W]` inputs and `[O, C / groups, KH, KW]` weights,
    /// accumulated in f64 (the reference), written from PyTorch's definition (not from the kernel).
    pub fn conv2d(
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        s: &super::Conv2dShape,
        a: Activation,
    ) -> Vec<f32> {
        let [c, h, wi] = s.input;
        let [oh_n, ow_n] = s.output_hw().expect("a valid geometry");
        let (o_n, [kh_n, kw_n]) = (s.out_channels, s.kernel);
        let (og, cg) = (o_n / s.groups, c / s.groups);
        let mut y = vec![0.0f32; s.rows * o_n * oh_n * ow_n];
        for r in 0..s.rows {
            for o in 0..o_n {
                let g = o / og;
                for oh in 0..oh_n {
                    for ow in 0..ow_n {
                        let mut acc = 0.0f64;
                        for ci in 0..cg {
                            for kh in 0..kh_n {
                                for kw in 0..kw_n {
                                    let ih = (oh * s.stride[0] + kh * s.dilation[0]) as isize
                                        - s.padding[0] as isize;
                                    let iw = (ow * s.stride[1] + kw * s.dilation[1]) as isize
                                        - s.padding[1] as isize;
                                    if ih < 0 || iw < 0 || ih >= h as isize || iw >= wi as isize {
                                        continue;
                                    }
                                    let xv = x[((r * c + g * cg + ci) * h + ih as usize) * wi
                                        + iw as usize];
                                    let wv = w[((o * cg + ci) * kh_n + kh) * kw_n + kw];
                                    acc += xv as f64 * wv as f64;
                                }
                            }
                        }
                        let v = acc as f32 + b.map_or(0.0, |b| b[o]);
                        y[((r * o_n + o) * oh_n + oh) * ow_n + ow] = act(a, v);
                    }
                }
            }
        }
        y
    }

    /// Gather rows `ids` of a `[_, n]` state.
    pub fn gather(state: &[f32], ids: &[u32], n: usize) -> Vec<f32> {
        ids.iter()
            .flat_map(|&e| state[e as usize * n..(e as usize + 1) * n].to_vec())
            .collect()
    }

    /// Scatter `rows` (`[ids.len(), n]`) into rows `ids` of a `[_, n]` state.
    pub fn scatter(state: &mut [f32], ids: &[u32], rows: &[f32], n: usize) {
        for (r, &e) in ids.iter().enumerate() {
            state[e as usize * n..(e as usize + 1) * n].copy_from_slice(&rows[r * n..(r + 1) * n]);
        }
    }

    /// uint8 values as the preprocessing kernel's [`PreInput::U8`](super::PreInput) buffer reads them: four to
    /// a u32 word, little-endian, the last word zero-padded.
    pub fn pack_u8(x: &[u8]) -> Vec<u32> {
        x.chunks(4)
            .map(|c| {
                let mut w = [0u8; 4];
                w[..c.len()].copy_from_slice(c);
                u32::from_le_bytes(w)
            })
            .collect()
    }

    /// Preprocessing of `[rows, len]` values.
    pub fn preprocess(x: &[f32], len: usize, steps: &[PreStep], stats: &[f32]) -> Vec<f32> {
        x.iter()
            .enumerate()
            .map(|(i, v)| {
                let c = i % len;
                let mut v = *v;
                for s in steps {
                    match s {
                        PreStep::Scale(f) => v *= f,
                        PreStep::Normalize {
                            mean_offset,
                            std_offset,
                            clip,
                        } => {
                            v = (v - stats[mean_offset + c]) / stats[std_offset + c];
                            if let Some(cl) = clip {
                                v = v.clamp(-cl, *cl);
                            }
                        }
                    }
                }
                v
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(name: &str, src: &str) {
        let module = naga::front::wgsl::parse_str(src)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::default(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
        assert!(
            module.entry_points.iter().any(|e| e.name == "main"),
            "{name}: entry point must be `main` (burn's SourceKernel)"
        );
    }

    #[test]
    fn every_variant_validates() {
        let all = all_sources();
        // Dense small + tiled + conv per activation, the sampler and the state mover, four preprocessing chains on
        // f32 and on u8 input.
        assert_eq!(all.len(), 3 * Activation::ALL.len() + 2 + 2 * 4);
        for (name, src) in &all {
            validate(name, src);
        }
    }

    #[test]
    fn templates_leave_no_placeholders() {
        for src in [
            dense_source(DenseVariant::Small, Activation::Gelu),
            dense_source(DenseVariant::Tiled, Activation::Elu(0.5)),
            conv2d_source(Activation::Relu),
            preprocess_source(&[PreStep::Scale(2.0)]),
        ] {
            assert!(!src.contains("{{"), "{src}");
        }
        assert!(!SAMPLE.contains("{{"));
    }

    #[test]
    fn exact_literals() {
        assert_eq!(f32_lit(1.0), "bitcast<f32>(0x3f800000u)");
        assert_eq!(f32_lit(std::f32::consts::TAU), "bitcast<f32>(0x40c90fdbu)");
    }

    #[test]
    fn workgroup_counts_cover_the_output() {
        assert_eq!(DenseVariant::Small.workgroups(5, 256), (4, 2, 1));
        assert_eq!(DenseVariant::Tiled.workgroups(1024, 256), (4, 16, 1));
        assert_eq!(elementwise_workgroups(1), (1, 1, 1));
        let (x, y, _) = elementwise_workgroups(65536 * 64 * 256 + 1);
        assert!(x as usize * y as usize * 256 >= 65536 * 64 * 256 + 1);
    }

    fn nature_conv1(rows: usize) -> Conv2dShape {
        Conv2dShape {
            rows,
            input: [4, 84, 84],
            out_channels: 32,
            kernel: [8, 8],
            stride: [4, 4],
            padding: [0; 4],
            dilation: [1, 1],
            groups: 1,
        }
    }

    #[test]
    fn conv2d_geometry_and_dispatch() {
        let s = nature_conv1(3);
        assert_eq!(s.output_hw(), Some([20, 20]));
        assert_eq!(s.invocations(), Some(3 * 8 * 400));
        let p = s.params(true).unwrap();
        assert_eq!(p.len(), 18);
        assert_eq!(p[17], 3 * 8 * 400);
        assert_eq!(
            s.workgroups(),
            Some(((3 * 8 * 400usize).div_ceil(64) as u32, 1, 1))
        );
        // Groups with a channel block that does not divide the group's channels: blocks never straddle groups.
        let g = Conv2dShape {
            out_channels: 6,
            groups: 2,
            input: [4, 5, 5],
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1, 1, 1],
            ..s
        };
        assert_eq!(g.invocations(), Some(3 * 2 * 1 * 25));
        // Past the first grid row: a second row of workgroups, covering every invocation.
        let big = nature_conv1(70_000);
        let (x, y, _) = big.workgroups().unwrap();
        assert!(x as usize * y as usize * 64 >= big.invocations().unwrap());
        assert!(y > 1);
        // A kernel larger than the padded input, and counts past u32: refused, not wrapped.
        let tiny = Conv2dShape {
            input: [4, 3, 3],
            ..s
        };
        assert_eq!(tiny.output_hw(), None);
        assert_eq!(tiny.params(false), None);
        assert_eq!(nature_conv1(200_000).params(false), None);
    }

    #[test]
    fn references_agree_with_definitions() {
        use reference::conv2d;
        // A 1x1 kernel is a per-position dense layer; a padded 3x3 of ones sums each 3x3 neighbourhood.
        let s = Conv2dShape {
            rows: 1,
            input: [2, 2, 2],
            out_channels: 1,
            kernel: [1, 1],
            stride: [1, 1],
            padding: [0; 4],
            dilation: [1, 1],
            groups: 1,
        };
        let x = [1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0];
        assert_eq!(
            conv2d(&x, &[1.0, 0.5], Some(&[1.0]), &s, Activation::Identity),
            vec![7.0, 13.0, 19.0, 25.0]
        );
        let s3 = Conv2dShape {
            input: [1, 3, 3],
            kernel: [3, 3],
            padding: [1, 1, 1, 1],
            ..s
        };
        let ones = [1.0f32; 9];
        let x3 = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
        assert_eq!(
            conv2d(&x3, &ones, None, &s3, Activation::Identity),
            vec![12.0, 21.0, 16.0, 27.0, 45.0, 33.0, 24.0, 39.0, 28.0]
        );
        use reference::*;
        assert!((act(Activation::Gelu, 1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((act(Activation::Erf, 0.5) - 0.520_499_9).abs() < 1e-6);
        let y = dense(
            &[1.0, 2.0],
            &[1.0, 0.0, 0.0, 1.0],
            Some(&[0.5, -3.0]),
            1,
            2,
            2,
            Activation::Relu,
        );
        assert_eq!(y, vec![1.5, 0.0]);
        let p = preprocess(
            &[1.0, 3.0],
            2,
            &[PreStep::Normalize {
                mean_offset: 0,
                std_offset: 2,
                clip: Some(0.5),
            }],
            &[1.0, 1.0, 2.0, 2.0],
        );
        assert_eq!(p, vec![0.0, 0.5]);
    }

    /// The u8 input layout the kernel's `(x[i / 4u] >> (8u * (i % 4u))) & 255u` reads: byte i of the frame is
    /// byte i % 4 (little-endian) of word i / 4, and a partial last word is zero-padded.
    #[test]
    fn u8_frames_pack_four_to_a_little_endian_word() {
        let x = [1u8, 2, 3, 4, 250];
        let words = reference::pack_u8(&x);
        assert_eq!(words, vec![0x0403_0201, 250]);
        for (i, &b) in x.iter().enumerate() {
            assert_eq!((words[i / 4] >> (8 * (i % 4))) & 255, b as u32);
        }
        let src = preprocess_source_for(PreInput::U8, &[PreStep::Scale(0.5)]);
        assert!(src.contains("array<u32>") && !src.contains("{{"), "{src}");
    }
}
