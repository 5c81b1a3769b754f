//! The fused WGSL kernels of `shaders/` launched on burn's wgpu device (feature `wgpu`).
//!
//! Why raw WGSL templates and not CubeCL `#[cube]` kernels: the kernels are plain text that naga validates on the
//! CPU in `shaders/`'s tests, the same text runs natively (Vulkan/Metal/DX12 through wgpu) and in the browser
//! (WebGPU, where WGSL is the only language), and sampling must be bit-exact integer code (Philox) that is easiest
//! to review as WGSL. The cost: burn's `vulkan` (SPIR-V) feature must stay off, since a WGSL template cannot
//! run when the runtime compiles to SPIR-V, and burn's fusion must stay off (its tensors cannot be rebuilt from
//! a raw buffer handle).
//!
//! Each launch takes the inputs' cubecl buffer handles (made contiguous), allocates the output on the same
//! client, binds buffers in the shader's binding order, and wraps the output back into a burn tensor, so fused
//! kernels and ordinary burn ops mix in one program.

use std::hash::{Hash, Hasher};

use burn::backend::Cube;
use burn::backend::wgpu::{
    CubeDim, CubeTensor, KernelSource, SourceKernel, SourceTemplate, into_contiguous,
};
use burn::cubecl::prelude::{BufferIOAttr, CubeCount, KernelId};
use burn::cubecl::server::{Handle, KernelArguments};
use burn::tensor::{DType, Shape, Tensor};
use policyport_shaders::{Activation, DenseVariant};

use crate::burn_graph::count_dispatch;

/// A WGSL source as a burn kernel; the id carries a hash of the text (templates differ per activation/steps).
struct Wgsl {
    source: std::sync::Arc<String>,
    hash: u64,
}

impl KernelSource for Wgsl {
    fn source(&self) -> SourceTemplate {
        SourceTemplate::new(self.source.as_str())
    }
    fn id(&self) -> KernelId {
        KernelId::new::<Self>().info(self.hash)
    }
    fn lang(&self) -> &'static str {
        "wgsl"
    }
}

/// A compiled-once WGSL kernel (pipelines are cached by the runtime under the id).
#[derive(Clone)]
pub(crate) struct Kernel {
    source: std::sync::Arc<String>,
    hash: u64,
    workgroup: (u32, u32, u32),
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({:016x})", self.hash)
    }
}

impl Kernel {
    pub(crate) fn new(source: String, workgroup: (u32, u32, u32)) -> Self {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        source.hash(&mut h);
        Kernel {
            source: std::sync::Arc::new(source),
            hash: h.finish(),
            workgroup,
        }
    }

    fn launch(
        &self,
        client: &burn::cubecl::client::Client,
        groups: (u32, u32, u32),
        args: KernelArguments,
    ) {
        let k = Wgsl {
            source: self.source.clone(),
            hash: self.hash,
        };
        let (x, y, z) = self.workgroup;
        client.launch(
            Box::new(SourceKernel::new(k, CubeDim::new_3d(x, y, z))),
            CubeCount::Static(groups.0, groups.1, groups.2),
            args,
        );
        count_dispatch();
    }
}

pub(crate) fn cube(t: Tensor<2>) -> CubeTensor {
    into_contiguous(
        t.try_into_primitive::<Cube>()
            .expect("wgpu tensors are cube tensors (fusion and autodiff are off)"),
    )
}

fn wrap(like: &CubeTensor, handle: Handle, shape: [usize; 2]) -> Tensor<2> {
    let t = CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        handle,
        DType::F32,
    );
    Tensor::<2>::from_primitive::<Cube>(t)
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Dense + bias + activation of `[rows, k] x [k, n]`: one dispatch. The two variants' pipelines for this layer.
#[derive(Debug, Clone)]
pub(crate) struct DenseKernels {
    small: Kernel,
    tiled: Kernel,
}

impl DenseKernels {
    pub(crate) fn new(act: Activation) -> Self {
        DenseKernels {
            small: Kernel::new(
                policyport_shaders::dense_source(DenseVariant::Small, act),
                (64, 1, 1),
            ),
            tiled: Kernel::new(
                policyport_shaders::dense_source(DenseVariant::Tiled, act),
                (16, 16, 1),
            ),
        }
    }

    pub(crate) fn run(
        &self,
        x: Tensor<2>,
        w: &CubeTensor,
        b: Option<&CubeTensor>,
        n: usize,
    ) -> Tensor<2> {
        let x = cube(x);
        let (rows, k) = (x.meta.shape()[0], x.meta.shape()[1]);
        let client = x.client.clone();
        let out = client.empty(rows * n * 4);
        let params = client.create_from_slice(&u32_bytes(&[
            rows as u32,
            k as u32,
            n as u32,
            b.is_some() as u32,
        ]));
        let variant = forced_dense_variant().unwrap_or(DenseVariant::for_rows(rows));
        let kernel = match variant {
            DenseVariant::Small => &self.small,
            DenseVariant::Tiled => &self.tiled,
        };
        // An absent bias still needs a binding of its own (never read: has_bias = 0). Not the weights' buffer:
        // WebGPU refuses two writable storage bindings of one buffer in a dispatch (every binding of these
        // kernels is `read_write`), so a dense without bias failed validation in the browser and the act read
        // back zeros (found by the browser's recurrent test; native Vulkan does not check aliasing).
        let bias = match b {
            Some(b) => b.handle.clone(),
            None => client.create_from_slice(&[0u8; 4]),
        };
        kernel.launch(
            &client,
            variant.workgroups(rows, n),
            KernelArguments::new()
                .with_buffer_io(x.handle.clone().binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(w.handle.clone().binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(bias.binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(out.clone().binding(), BufferIOAttr::WriteOnly)
                .with_buffer_io(params.binding(), BufferIOAttr::ReadOnly),
        );
        wrap(&x, out, [rows, n])
    }
}

/// `POLICYPORT_WGPU_DENSE=small|tiled` forces one dense kernel for every batch (to time or test one variant);
/// read once per process, not per dispatch (it was read on every dense layer of every act()).
fn forced_dense_variant() -> Option<DenseVariant> {
    static FORCED: std::sync::OnceLock<Option<DenseVariant>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| match std::env::var("POLICYPORT_WGPU_DENSE").as_deref() {
        Ok("small") => Some(DenseVariant::Small),
        Ok("tiled") => Some(DenseVariant::Tiled),
        _ => None,
    })
}

/// Conv2d + bias + activation over `[rows, C*H*W]` values: one dispatch (`shaders/conv2d.wgsl`). The geometry
/// and weights are fixed at load; the batch comes with each call.
#[derive(Debug, Clone)]
pub(crate) struct Conv2dKernel {
    kernel: Kernel,
    /// The layer's geometry for one env (`rows` is set per call).
    shape: policyport_shaders::Conv2dShape,
    w: CubeTensor,
    b: Option<CubeTensor>,
}

impl Conv2dKernel {
    /// `w`: `[O, C / groups, KH, KW]` as the artifact stores it; `b`: `[O]`.
    pub(crate) fn new(
        shape: policyport_shaders::Conv2dShape,
        w: &[f32],
        b: Option<&[f32]>,
        act: Activation,
        device: &burn::tensor::Device,
    ) -> Self {
        let row = |d: &[f32]| {
            cube(Tensor::<2>::from_data(
                burn::tensor::TensorData::new(d.to_vec(), [1, d.len()]),
                device,
            ))
        };
        Conv2dKernel {
            kernel: Kernel::new(policyport_shaders::conv2d_source(act), (64, 1, 1)),
            shape,
            w: row(w),
            b: b.map(row),
        }
    }

    /// Values per env of the output.
    pub(crate) fn out_numel(&self) -> usize {
        let [oh, ow] = self.shape.output_hw().expect("validated geometry");
        self.shape.out_channels * oh * ow
    }

    /// Whether a batch of `rows` envs fits the kernel's 32-bit indexing (checked before every act(): a wgpu
    /// storage binding is far smaller than 2^32 values anyway, so only absurd batches fail).
    pub(crate) fn fits(&self, rows: usize) -> bool {
        let shape = policyport_shaders::Conv2dShape { rows, ..self.shape };
        shape.params(self.b.is_some()).is_some() && shape.workgroups().is_some()
    }

    /// The convolution of `x` (`[rows, C*H*W]`), for a batch [`Conv2dKernel::fits`] accepted.
    pub(crate) fn run(&self, x: Tensor<2>) -> Tensor<2> {
        let x = cube(x);
        let rows = x.meta.shape()[0];
        let shape = policyport_shaders::Conv2dShape { rows, ..self.shape };
        let (params, groups) = shape
            .params(self.b.is_some())
            .zip(shape.workgroups())
            .expect("WgpuExecutor::launch checks the batch (Conv2dKernel::fits)");
        let n = self.out_numel();
        let client = x.client.clone();
        let out = client.empty(rows * n * 4);
        let params = client.create_from_slice(&u32_bytes(&params));
        // An absent bias still needs its own binding (see DenseKernels::run).
        let bias = match &self.b {
            Some(b) => b.handle.clone(),
            None => client.create_from_slice(&[0u8; 4]),
        };
        self.kernel.launch(
            &client,
            groups,
            KernelArguments::new()
                .with_buffer_io(x.handle.clone().binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(self.w.handle.clone().binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(bias.binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(out.clone().binding(), BufferIOAttr::WriteOnly)
                .with_buffer_io(params.binding(), BufferIOAttr::ReadOnly),
        );
        wrap(&x, out, [rows, n])
    }
}

/// Observation scale / normalise + clip: one elementwise dispatch.
#[derive(Debug, Clone)]
pub(crate) struct PreprocessKernel {
    kernel: Kernel,
    stats: CubeTensor,
}

impl PreprocessKernel {
    /// `steps` on `input` values (see [`policyport_shaders::PreInput`]), the normalisation statistics in
    /// `stats`.
    pub(crate) fn new(
        input: policyport_shaders::PreInput,
        steps: &[policyport_shaders::PreStep],
        stats: &[f32],
        device: &burn::tensor::Device,
    ) -> Self {
        let stats = if stats.is_empty() {
            vec![0.0]
        } else {
            stats.to_vec()
        };
        let t = Tensor::<2>::from_data(
            burn::tensor::TensorData::new(stats.clone(), [1, stats.len()]),
            device,
        );
        PreprocessKernel {
            kernel: Kernel::new(
                policyport_shaders::preprocess_source_for(input, steps),
                (256, 1, 1),
            ),
            stats: cube(t),
        }
    }

    /// The steps on f32 values `x` (`[rows, len]`, on the device).
    pub(crate) fn run(&self, x: Tensor<2>) -> Tensor<2> {
        let x = cube(x);
        let (rows, len) = (x.meta.shape()[0], x.meta.shape()[1]);
        let handle = x.handle.clone();
        self.launch(&x, handle, rows, len)
    }

    /// uint8 frames `x` (`[rows, len]` bytes on the host) uploaded as their bytes and widened on the device,
    /// then the steps: for a kernel made for [`PreInput::U8`](policyport_shaders::PreInput).
    pub(crate) fn run_u8(&self, like: &CubeTensor, x: &[u8], rows: usize) -> Tensor<2> {
        let len = x.len() / rows.max(1);
        // Four bytes to a word: a frame batch whose size is not a multiple of 4 gets its last word padded.
        let handle = if x.len() % 4 == 0 {
            like.client.create_from_slice(x)
        } else {
            let mut padded = x.to_vec();
            padded.resize(x.len().next_multiple_of(4), 0);
            like.client.create_from_slice(&padded)
        };
        self.launch(like, handle, rows, len)
    }

    fn launch(&self, like: &CubeTensor, input: Handle, rows: usize, len: usize) -> Tensor<2> {
        let total = rows * len;
        let client = like.client.clone();
        let out = client.empty(total * 4);
        let params = client.create_from_slice(&u32_bytes(&[total as u32, len as u32]));
        self.kernel.launch(
            &client,
            policyport_shaders::elementwise_workgroups(total),
            KernelArguments::new()
                .with_buffer_io(input.binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(out.clone().binding(), BufferIOAttr::WriteOnly)
                .with_buffer_io(self.stats.handle.clone().binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(params.binding(), BufferIOAttr::ReadOnly),
        );
        wrap(like, out, [rows, len])
    }
}

/// Parameter finishing + seeded sampling + output packing: one dispatch (see shaders/sample.wgsl).
#[derive(Debug, Clone)]
pub(crate) struct SampleKernel {
    kernel: Kernel,
    /// params words 1.. after `rows` that do not change per call: hw, k, p, v, kind, then flags and segments.
    hw: u32,
    k: u32,
    p: u32,
    v: u32,
    kind: u32,
    /// Q values: the exploration rate's f32 bits (params word 11).
    epsilon: u32,
    flags: u32,
    segments: Vec<u32>,
    pub(crate) fparams: CubeTensor,
}

/// Which branch of shaders/sample.wgsl a head takes (its `kind` word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SampleFamily {
    Categorical = 0,
    Gaussian = 1,
    Deterministic = 2,
    QValues = 3,
}

pub(crate) struct SampleSpec {
    pub hw: usize,
    pub k: usize,
    pub p: usize,
    pub has_value: bool,
    pub family: SampleFamily,
    /// Deterministic actors: the output is rescaled from [-1, 1] to the bounds (else clipped to them).
    pub rescale: bool,
    /// Deterministic actors: the recorded exploration noise `(mean, sigma)` per element.
    pub noise: Option<(Vec<f32>, Vec<f32>)>,
    /// Q values: the artifact's exploration rate.
    pub epsilon: f32,
    pub squashed: bool,
    pub clip: bool,
    /// Squashed only: the deterministic action is the mean rescaled without tanh and clipped (format 1.3).
    pub linear_deterministic: bool,
    pub log_std_param: Option<Vec<f32>>,
    pub log_std_range: Option<(f32, f32)>,
    pub low: Vec<f32>,
    pub high: Vec<f32>,
    pub segments: Vec<usize>,
}

impl SampleKernel {
    pub(crate) fn new(s: SampleSpec, device: &burn::tensor::Device) -> Self {
        let (lo, hi) = s.log_std_range.unwrap_or((0.0, 0.0));
        // WGSL may assume finite math: unbounded action dims clip at ±f32::MAX instead of ±inf.
        let fin = |v: &f32| v.clamp(f32::MIN, f32::MAX);
        let mut f = vec![lo, hi];
        f.extend(s.low.iter().map(fin));
        f.extend(s.high.iter().map(fin));
        f.extend(s.log_std_param.clone().unwrap_or_else(|| vec![0.0; s.k]));
        f.resize(f.len().max(2 + 3 * s.k), 0.0);
        let (nm, ns) = s
            .noise
            .clone()
            .unwrap_or_else(|| (vec![0.0; s.k], vec![0.0; s.k]));
        f.extend(nm);
        f.extend(ns);
        let fparams = cube(Tensor::<2>::from_data(
            burn::tensor::TensorData::new(f.clone(), [1, f.len()]),
            device,
        ));
        let flags = (s.squashed as u32)
            | ((s.clip as u32) << 1)
            | ((s.log_std_param.is_some() as u32) << 2)
            | ((s.log_std_range.is_some() as u32) << 3)
            | ((s.linear_deterministic as u32) << 4)
            | ((s.rescale as u32) << 5)
            | ((s.noise.is_some() as u32) << 6);
        SampleKernel {
            kernel: Kernel::new(policyport_shaders::SAMPLE.to_string(), (64, 1, 1)),
            hw: s.hw as u32,
            k: s.k as u32,
            p: s.p as u32,
            v: s.has_value as u32,
            kind: s.family as u32,
            epsilon: s.epsilon.to_bits(),
            flags,
            segments: s.segments.iter().map(|n| *n as u32).collect(),
            fparams,
        }
    }

    /// `head`: `[rows, hw]` raw distribution values then the value; `envs`: the rows' env ids (see
    /// [`upload_ids`]); returns `[rows, k + p + v]` packed rows.
    pub(crate) fn run(
        &self,
        head: Tensor<2>,
        envs: &Handle,
        sample: Option<(u64, u64)>,
    ) -> Tensor<2> {
        let head = cube(head);
        let rows = head.meta.shape()[0];
        let client = head.client.clone();
        let width = (self.k + self.p + self.v) as usize;
        let out = client.empty(rows * width * 4);
        let (seed, step) = sample.unwrap_or((0, 0));
        let mut params = vec![
            rows as u32,
            self.hw,
            self.k,
            self.p,
            self.v,
            self.kind,
            sample.is_some() as u32,
            seed as u32,
            (seed >> 32) as u32,
            step as u32,
            (step >> 32) as u32,
            self.epsilon,
            self.flags,
            self.segments.len() as u32,
        ];
        params.extend(&self.segments);
        let params = client.create_from_slice(&u32_bytes(&params));
        self.kernel.launch(
            &client,
            (rows.div_ceil(64) as u32, 1, 1),
            KernelArguments::new()
                .with_buffer_io(head.handle.clone().binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(envs.clone().binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(out.clone().binding(), BufferIOAttr::WriteOnly)
                .with_buffer_io(params.binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(
                    self.fparams.handle.clone().binding(),
                    BufferIOAttr::ReadOnly,
                ),
        );
        wrap(&head, out, [rows, width])
    }
}

/// Gather / scatter of state rows (shaders/state.wgsl).
#[derive(Debug, Clone)]
pub(crate) struct StateKernel {
    kernel: Kernel,
}

impl StateKernel {
    pub(crate) fn new() -> Self {
        StateKernel {
            kernel: Kernel::new(policyport_shaders::STATE.to_string(), (256, 1, 1)),
        }
    }

    fn launch(
        &self,
        state: &CubeTensor,
        rows: &Handle,
        ids: &Handle,
        batch: usize,
        n: usize,
        mode: u32,
    ) {
        let client = &state.client;
        let params = client.create_from_slice(&u32_bytes(&[batch as u32, n as u32, mode]));
        self.kernel.launch(
            client,
            policyport_shaders::elementwise_workgroups(batch * n),
            KernelArguments::new()
                .with_buffer_io(state.handle.clone().binding(), BufferIOAttr::ReadWrite)
                .with_buffer_io(rows.clone().binding(), BufferIOAttr::ReadWrite)
                .with_buffer_io(ids.clone().binding(), BufferIOAttr::ReadOnly)
                .with_buffer_io(params.binding(), BufferIOAttr::ReadOnly),
        );
    }

    /// Rows `ids` of `state` (`[num_envs, n]`) as a new `[batch, n]` tensor.
    pub(crate) fn gather(
        &self,
        state: &CubeTensor,
        ids: &Handle,
        batch: usize,
        n: usize,
    ) -> Tensor<2> {
        let out = state.client.empty(batch * n * 4);
        self.launch(state, &out, ids, batch, n, 0);
        wrap(state, out, [batch, n])
    }

    /// Write `rows` (`[batch, n]`) into rows `ids` of `state`, in place.
    pub(crate) fn scatter(
        &self,
        state: &CubeTensor,
        rows: Tensor<2>,
        ids: &Handle,
        batch: usize,
        n: usize,
    ) {
        let rows = cube(rows);
        self.launch(state, &rows.handle, ids, batch, n, 1);
    }
}

/// Upload env ids (u32) for the gather / scatter / sampling kernels of one act().
pub(crate) fn upload_ids(like: &CubeTensor, ids: &[u32]) -> Handle {
    like.client.create_from_slice(&u32_bytes(ids))
}

/// `[rows, cols]` f32 values as a tensor on `like`'s device, uploaded straight from `data` (no host copy first:
/// burn's `from_data` needs an owned buffer, which was one more copy of every observation batch per act()).
pub(crate) fn upload_f32(like: &CubeTensor, data: &[f32], shape: [usize; 2]) -> Tensor<2> {
    debug_assert_eq!(data.len(), shape[0] * shape[1]);
    let handle = if cfg!(target_endian = "little") {
        // SAFETY: an f32 is 4 bytes without padding or invalid bit patterns as u8; the byte slice covers exactly
        // `data`'s memory and lives as long as the borrow. The device reads little-endian f32, which these
        // bytes are on a little-endian target.
        let bytes =
            unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len() * 4) };
        like.client.create_from_slice(bytes)
    } else {
        like.client.create_from_slice(&f32_bytes(data))
    };
    wrap(like, handle, shape)
}

/// The device copy of one session's recurrent state: one `[num_envs, n]` tensor per state, written in place by
/// scatters, never read back per step (only when the session is asked for its state).
#[derive(Clone)]
pub(crate) struct DeviceState {
    pub(crate) tensors: Vec<CubeTensor>,
    pub(crate) sizes: Vec<usize>,
    pub(crate) num_envs: usize,
    kernel: StateKernel,
}

impl std::fmt::Debug for DeviceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceState")
            .field("sizes", &self.sizes)
            .field("num_envs", &self.num_envs)
            .finish()
    }
}

fn zeros(rows: usize, n: usize, device: &burn::tensor::Device) -> CubeTensor {
    cube(Tensor::<2>::from_data(
        burn::tensor::TensorData::new(vec![0.0f32; rows * n], [rows, n]),
        device,
    ))
}

impl DeviceState {
    /// Zero state for `num_envs` envs.
    pub(crate) fn zeros(sizes: &[usize], num_envs: usize, device: &burn::tensor::Device) -> Self {
        DeviceState {
            // Never empty (a zero-env state still needs a buffer to bind).
            tensors: sizes
                .iter()
                .map(|n| zeros(num_envs.max(1), *n, device))
                .collect(),
            sizes: sizes.to_vec(),
            num_envs,
            kernel: StateKernel::new(),
        }
    }

    /// Grow to `num_envs` envs on the device (new rows zero; no readback); never shrinks.
    pub(crate) fn grow(&mut self, num_envs: usize) {
        if num_envs <= self.num_envs {
            return;
        }
        for (t, n) in self.tensors.iter_mut().zip(&self.sizes) {
            let old = Tensor::<2>::from_primitive::<Cube>(t.clone());
            let device = old.device();
            *t = if self.num_envs == 0 {
                zeros(num_envs, *n, &device)
            } else {
                let fresh = Tensor::<2>::from_primitive::<Cube>(zeros(
                    num_envs - self.num_envs,
                    *n,
                    &device,
                ));
                cube(Tensor::cat(vec![old.narrow(0, 0, self.num_envs), fresh], 0))
            };
        }
        self.num_envs = num_envs;
    }

    pub(crate) fn kernel(&self) -> &StateKernel {
        &self.kernel
    }

    /// Every state tensor read back, `num_envs x n` values each.
    pub(crate) fn read(&self) -> Result<Vec<Vec<f32>>, crate::error::PolicyError> {
        if cfg!(target_family = "wasm") {
            return Err(crate::error::BackendError::NeedsAsync {
                use_instead: "an async state read (not available yet)",
            }
            .into());
        }
        self.tensors
            .iter()
            .zip(&self.sizes)
            .map(|(t, n)| {
                let data = Tensor::<2>::from_primitive::<Cube>(t.clone())
                    .try_into_data()
                    .map_err(crate::burn_graph::readback_error)?;
                let mut v = data
                    .try_to_vec::<f32>()
                    .map_err(crate::burn_graph::readback_error)?;
                v.truncate(self.num_envs * n);
                Ok(v)
            })
            .collect()
    }

    /// Zero rows `envs` on the device (scatter of zeros); ids beyond the device copy are zero already.
    pub(crate) fn zero_rows(&mut self, envs: &[u32]) {
        let ids: Vec<u32> = envs
            .iter()
            .copied()
            .filter(|e| (*e as usize) < self.num_envs)
            .collect();
        if ids.is_empty() {
            return;
        }
        for (t, n) in self.tensors.iter().zip(&self.sizes) {
            let handle = upload_ids(t, &ids);
            let zeros = t.client.create_from_slice(&vec![0u8; ids.len() * n * 4]);
            self.kernel.launch(t, &zeros, &handle, ids.len(), *n, 1);
        }
    }

    /// Overwrite rows `envs` (distinct, below `num_envs` after growing) with caller values, `envs.len() x n`
    /// per state tensor: one upload and one scatter per tensor.
    pub(crate) fn write_rows(&mut self, envs: &[u32], values: &[&[f32]], num_envs: usize) {
        self.grow(num_envs);
        if envs.is_empty() {
            return;
        }
        for ((t, n), v) in self.tensors.iter().zip(&self.sizes).zip(values) {
            debug_assert_eq!(v.len(), envs.len() * n);
            let handle = upload_ids(t, envs);
            let rows = t.client.create_from_slice(&f32_bytes(v));
            self.kernel.launch(t, &rows, &handle, envs.len(), *n, 1);
        }
    }
}

/// Each kernel against its CPU reference on random inputs, on the real wgpu device (lavapipe in CI).
#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use policyport_format::philox::Stream;
    use policyport_shaders::{PreInput, PreStep, reference};

    fn device() -> burn::tensor::Device {
        crate::builtin::wgpu_device()
            .expect("a wgpu adapter (install mesa-vulkan-drivers for lavapipe)")
    }

    fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = Stream::new(seed, 0, 0);
        (0..n)
            .map(|i| (policyport_format::philox::u01(s.word(i as u32)) * 2.0 - 1.0) * scale)
            .collect()
    }

    fn read(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn dense_kernels_match_the_reference() {
        let dev = device();
        for (rows, k, n) in [(1, 64, 256), (5, 7, 3), (64, 256, 256), (130, 33, 70)] {
            let x = random(rows * k, 1 + rows as u64, 1.0);
            let w = random(k * n, 2, 0.3);
            let b = random(n, 3, 0.5);
            for act in Activation::ALL {
                for bias in [true, false] {
                    let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, k]), &dev);
                    let wt = cube(Tensor::<2>::from_data(
                        TensorData::new(w.clone(), [k, n]),
                        &dev,
                    ));
                    let bt = cube(Tensor::<2>::from_data(
                        TensorData::new(b.clone(), [1, n]),
                        &dev,
                    ));
                    let got = read(DenseKernels::new(act).run(xt, &wt, bias.then_some(&bt), n));
                    let want = reference::dense(&x, &w, bias.then_some(&b[..]), rows, k, n, act);
                    let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
                    // exp turns the sum's absolute rounding error (~1e-6 at k = 256) into a relative one of the
                    // same size times the argument (up to ~8 here): compared in that light.
                    let tol = if act == Activation::Exp { 2e-5 } else { 2e-6 };
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - e).abs() / scale < tol,
                            "{rows}x{k}x{n} {act:?} bias {bias} [{i}]: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }

    /// The convolution kernel against the f64 reference over the geometries the importers produce (NatureCNN's
    /// strided layers, IMPALA's padded 3x3, RLlib's TF-"same" asymmetric padding) and the ones they might
    /// (groups whose channels are not a multiple of the kernel's 4-channel block, dilation, no bias, one row,
    /// rows spanning many workgroups).
    #[test]
    fn conv2d_kernel_matches_the_reference() {
        use policyport_shaders::Conv2dShape;
        let dev = device();
        let geometries = [
            // (input, out channels, kernel, stride, padding, dilation, groups, rows)
            ([4, 20, 20], 8, [8, 8], [4, 4], [0; 4], [1, 1], 1, 3),
            ([3, 9, 9], 16, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1, 5),
            ([5, 11, 7], 7, [4, 3], [2, 2], [1, 0, 2, 1], [1, 1], 1, 2),
            ([6, 8, 8], 10, [3, 3], [1, 2], [2, 2, 2, 2], [2, 1], 2, 4),
            ([6, 5, 5], 6, [1, 1], [1, 1], [0; 4], [1, 1], 6, 1),
            ([2, 3, 3], 3, [2, 2], [1, 1], [0; 4], [1, 1], 1, 70),
        ];
        for (i, &(input, out_channels, kernel, stride, padding, dilation, groups, rows)) in
            geometries.iter().enumerate()
        {
            let shape = Conv2dShape {
                rows,
                input,
                out_channels,
                kernel,
                stride,
                padding,
                dilation,
                groups,
            };
            let x_len = rows * input.iter().product::<usize>();
            let w_len = out_channels * input[0] / groups * kernel[0] * kernel[1];
            let x = random(x_len, 40 + i as u64, 2.0);
            let w = random(w_len, 50 + i as u64, 0.5);
            let b = random(out_channels, 60 + i as u64, 1.0);
            for (act, bias) in [
                (Activation::Identity, true),
                (Activation::Relu, false),
                (Activation::Tanh, true),
            ] {
                let k = Conv2dKernel::new(shape, &w, bias.then_some(&b[..]), act, &dev);
                assert!(k.fits(rows));
                let xt =
                    Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, x_len / rows]), &dev);
                let got = read(k.run(xt));
                let want = reference::conv2d(&x, &w, bias.then_some(&b[..]), &shape, act);
                assert_eq!(got.len(), want.len(), "geometry {i}");
                let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
                for (j, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - e).abs() / scale < 2e-6,
                        "geometry {i} {act:?} bias {bias} [{j}]: {g} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn preprocess_kernel_matches_the_reference() {
        let dev = device();
        let (rows, len) = (37, 5);
        let x = random(rows * len, 9, 10.0);
        let mut stats = random(len, 10, 1.0);
        stats.extend(random(len, 11, 1.0).iter().map(|v| v.abs() + 0.5));
        let chains = [
            vec![
                PreStep::Scale(0.5),
                PreStep::Normalize {
                    mean_offset: 0,
                    std_offset: len,
                    clip: Some(3.0),
                },
            ],
            // Regression: a scale-only chain (uint8 frames / 255) left `stats` unused, the derived bind group
            // layout lost binding 2 and every act() failed validation (found by the SB3 CnnPolicy fixture).
            vec![PreStep::Scale(1.0 / 255.0)],
        ];
        // uint8 frames: 37 rows of 5 bytes (185: the last word padded), every byte value.
        let frames: Vec<u8> = (0..rows * len).map(|i| (i * 97 % 256) as u8).collect();
        let widened: Vec<f32> = frames.iter().map(|&b| b as f32).collect();
        let like = cube(Tensor::<2>::from_data(
            TensorData::new(vec![0.0f32], [1, 1]),
            &dev,
        ));
        for steps in chains.into_iter().chain([vec![]]) {
            let k = PreprocessKernel::new(PreInput::F32, &steps, &stats, &dev);
            let got = read(k.run(Tensor::<2>::from_data(
                TensorData::new(x.clone(), [rows, len]),
                &dev,
            )));
            let k8 = PreprocessKernel::new(PreInput::U8, &steps, &stats, &dev);
            let got8 = read(k8.run_u8(&like, &frames, rows));
            for (got, x) in [(got, &x), (got8, &widened)] {
                let want = reference::preprocess(x, len, &steps, &stats);
                assert_eq!(got.len(), want.len());
                for (g, e) in got.iter().zip(&want) {
                    assert!(
                        (g - e).abs() <= 1e-6 * e.abs().max(1.0),
                        "{steps:?}: {g} vs {e}"
                    );
                }
            }
        }
    }

    /// The device sampler against the host sampler of the artifact spec (policyport_format::sampling).
    #[test]
    fn sample_kernel_matches_the_host_sampler() {
        use policyport_format::sampling::{argmax, categorical, standard_normal};
        let dev = device();
        let rows = 300;
        let envs: Vec<u32> = (0..rows as u32).map(|r| r * 7 + 3).collect();
        // Multi-categorical [3, 5] with a value column.
        let segs = [3usize, 5];
        let head = random(rows * 9, 21, 4.0);
        let k = SampleKernel::new(
            SampleSpec {
                hw: 9,
                k: 2,
                p: 8,
                has_value: true,
                family: SampleFamily::Categorical,
                rescale: false,
                noise: None,
                epsilon: 0.0,
                squashed: false,
                clip: false,
                linear_deterministic: false,
                log_std_param: None,
                log_std_range: None,
                low: vec![0.0; 2],
                high: vec![0.0; 2],
                segments: segs.to_vec(),
            },
            &dev,
        );
        for sample in [None, Some((u64::MAX - 5, 1u64 << 33))] {
            let t = Tensor::<2>::from_data(TensorData::new(head.clone(), [rows, 9]), &dev);
            let ids = upload_ids(&k.fparams, &envs);
            let got = read(k.run(t, &ids, sample));
            let mut mismatches = 0;
            for r in 0..rows {
                let h = &head[r * 9..r * 9 + 9];
                let mut off = 0;
                for (s, n) in segs.iter().enumerate() {
                    let logits = &h[off..off + n];
                    let want = match sample {
                        None => argmax(logits),
                        Some((seed, step)) => {
                            let mut st = Stream::new(seed, envs[r], step);
                            categorical(logits, policyport_format::philox::u01(st.word(s as u32)))
                        }
                    };
                    mismatches += (got[r * 11 + s] != want as f32) as usize;
                    off += n;
                }
                assert_eq!(&got[r * 11 + 2..r * 11 + 10], &h[..8]);
                assert_eq!(got[r * 11 + 10], h[8]);
            }
            assert_eq!(mismatches, 0, "{sample:?}");
        }
        // Squashed Gaussian with a state-dependent, clamped log-std; and a clipped one with a parameter log-std.
        let kdim = 3;
        let head = random(rows * (2 * kdim + 1), 31, 2.0);
        for (squashed, param, linear) in [
            (true, None, false),
            (true, None, true),
            (false, Some(vec![-0.5f32, 0.1, 0.3]), false),
        ] {
            let (low, high) = (vec![-2.0f32, -1.0, 0.0], vec![2.0f32, 1.0, 5.0]);
            let hw = if param.is_some() {
                kdim + 1
            } else {
                2 * kdim + 1
            };
            let head: Vec<f32> = head
                .chunks(2 * kdim + 1)
                .flat_map(|c| {
                    let mut v = c[..hw - 1].to_vec();
                    v.push(c[2 * kdim]);
                    v
                })
                .collect();
            let range = Some((-1.5f32, 0.5f32));
            let k = SampleKernel::new(
                SampleSpec {
                    hw,
                    k: kdim,
                    p: 2 * kdim,
                    has_value: true,
                    family: SampleFamily::Gaussian,
                    rescale: false,
                    noise: None,
                    epsilon: 0.0,
                    squashed,
                    clip: !squashed,
                    linear_deterministic: linear,
                    log_std_param: param.clone(),
                    log_std_range: range,
                    low: low.clone(),
                    high: high.clone(),
                    segments: vec![],
                },
                &dev,
            );
            for sample in [Some((77u64, 5u64)), None] {
                let t = Tensor::<2>::from_data(TensorData::new(head.clone(), [rows, hw]), &dev);
                let ids = upload_ids(&k.fparams, &envs);
                let got = read(k.run(t, &ids, sample));
                let width = 3 * kdim + 1;
                for r in 0..rows {
                    let h = &head[r * hw..(r + 1) * hw];
                    let mut st = sample.map(|(seed, step)| Stream::new(seed, envs[r], step));
                    for d in 0..kdim {
                        let ls = match &param {
                            Some(p) => p[d],
                            None => h[kdim + d].clamp(range.unwrap().0, range.unwrap().1),
                        };
                        let mut a = match &mut st {
                            Some(st) => h[d] + ls.exp() * standard_normal(st, d as u32),
                            None => h[d],
                        };
                        a = if squashed && linear && st.is_none() {
                            (low[d] + (a + 1.0) * 0.5 * (high[d] - low[d])).clamp(low[d], high[d])
                        } else if squashed {
                            low[d] + (a.tanh() + 1.0) * 0.5 * (high[d] - low[d])
                        } else {
                            a.clamp(low[d], high[d])
                        };
                        let g = got[r * width + d];
                        assert!(
                            (g - a).abs() <= 1e-5 * a.abs().max(1.0),
                            "{sample:?} linear {linear} row {r} dim {d}: {g} vs {a}"
                        );
                        assert_eq!(got[r * width + kdim + d], h[d]);
                        assert_eq!(got[r * width + 2 * kdim + d], ls);
                    }
                    assert_eq!(got[r * width + 3 * kdim], h[hw - 1]);
                }
            }
        }
    }
}
