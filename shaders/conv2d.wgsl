// Fused 2-D convolution (PyTorch's Conv2d: cross-correlation, zero padding, stride, dilation, groups) + bias +
// activation: y[r, o, oh, ow] = act(b[o] + sum_{c, kh, kw} x[r, g*Cg + c, ih, iw] * w[o, c, kh, kw]) with
// ih = oh*sh + kh*dh - pad_top, iw = ow*sw + kw*dw - pad_left (terms outside the input are zeros), g = o / Og.
//
// One invocation computes one output position (oh, ow) of one env for a block of up to OB = 4 output channels of
// one group: each input value loaded is used OB times from a register, and the invocations of a workgroup (64
// consecutive positions of the same channel block, while a plane holds >= 64 positions) read the same weights, so
// those loads are uniform. Invocations are numbered position-fastest, then channel block, then env, so the
// writes of a workgroup are contiguous. The count may pass the 65535 workgroups of one dispatch axis: the index
// spans gid.x and gid.y (see `linear_workgroups` in lib.rs). The ACT_FN placeholder becomes
// `fn act(v: f32) -> f32` (lib.rs), as in the dense kernels.
//
// Bindings (params[0], rows, is read by the host only): 0 x [rows, C*H*W] f32 (CHW per env), 1 w [O, Cg, KH, KW] f32 (PyTorch's layout, as stored),
// 2 b [O] f32 (ignored if !has_bias), 3 y [rows, O*OH*OW] f32, 4 params u32:
// [rows, C, H, W, O, OH, OW, KH, KW, sh, sw, dh, dw, pad_top, pad_left, groups, has_bias, invocations] where
// invocations = rows * groups * ceil(O / groups / OB) * OH * OW (computed on the host, where it is checked to fit).

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> params: array<u32>;

const OB: u32 = 4u;
// Invocations per row of the dispatch grid: 65535 workgroups of 64.
const GRID_X: u32 = 4194240u;

{{ACT_FN}}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c_in = params[1];
    let h = params[2];
    let w_in = params[3];
    let o_n = params[4];
    let oh_n = params[5];
    let ow_n = params[6];
    let kh_n = params[7];
    let kw_n = params[8];
    let sh = params[9];
    let sw = params[10];
    let dh = params[11];
    let dw = params[12];
    let pad_top = params[13];
    let pad_left = params[14];
    let groups = params[15];
    let has_bias = params[16];
    let invocations = params[17];

    let og = o_n / groups;
    let cg = c_in / groups;
    let blocks_per_group = (og + OB - 1u) / OB;
    let blocks = blocks_per_group * groups;
    let positions = oh_n * ow_n;
    let idx = gid.y * GRID_X + gid.x;
    if (idx >= invocations) {
        return;
    }
    let p = idx % positions;
    let blk = (idx / positions) % blocks;
    let r = idx / (positions * blocks);
    let oh = p / ow_n;
    let ow = p % ow_n;
    let g = blk / blocks_per_group;
    let o0 = g * og + (blk % blocks_per_group) * OB;
    let nb = min(OB, g * og + og - o0);

    let ksize = kh_n * kw_n;
    let plane = h * w_in;
    let x_base = r * c_in * plane + g * cg * plane;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var c = 0u; c < cg; c = c + 1u) {
        let xc = x_base + c * plane;
        let wc = c * ksize;
        for (var kh = 0u; kh < kh_n; kh = kh + 1u) {
            // Unsigned arithmetic: a position above the top (or left of the left edge) wraps to a huge value
            // and fails the `< h` test like one past the bottom.
            let ih = oh * sh + kh * dh - pad_top;
            if (ih >= h) {
                continue;
            }
            for (var kw = 0u; kw < kw_n; kw = kw + 1u) {
                let iw = ow * sw + kw * dw - pad_left;
                if (iw >= w_in) {
                    continue;
                }
                let xv = x[xc + ih * w_in + iw];
                let wk = wc + kh * kw_n + kw;
                for (var j = 0u; j < nb; j = j + 1u) {
                    acc[j] = fma(xv, w[(o0 + j) * cg * ksize + wk], acc[j]);
                }
            }
        }
    }
    for (var j = 0u; j < nb; j = j + 1u) {
        var bias = 0.0;
        if (has_bias != 0u) {
            bias = b[o0 + j];
        }
        y[r * o_n * positions + (o0 + j) * positions + p] = act(acc[j] + bias);
    }
}
