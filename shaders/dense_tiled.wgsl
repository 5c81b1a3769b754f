// Fused dense layer + bias + activation for large batches: 64x64 output tiles per workgroup of 16x16
// invocations, each computing a 4x4 block; x and w tiles of depth 16 staged in workgroup memory. Same bindings and
// semantics as dense_small.wgsl; the ACT_FN placeholder becomes `fn act(v: f32) -> f32`.

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> params: array<u32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> xs: array<f32, 1024>; // [TM][TK]
var<workgroup> ws: array<f32, 1024>; // [TK][TN]
// k, made workgroup-uniform: `params` is a read_write storage buffer, whose reads WGSL's uniformity analysis
// treats as non-uniform, and the k-loop below holds workgroupBarrier(). naga accepts the plain read; Tint
// (Chrome's WebGPU) rejects it. workgroupUniformLoad returns a value the analysis knows is uniform.
var<workgroup> k_shared: u32;

{{ACT_FN}}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let rows = params[0];
    if (lid.x == 0u && lid.y == 0u) {
        k_shared = params[1];
    }
    let k = workgroupUniformLoad(&k_shared);
    let n = params[2];
    let has_bias = params[3];
    let row0 = wid.y * TM;
    let col0 = wid.x * TN;
    let t = lid.y * 16u + lid.x; // 0..256
    var acc: array<f32, 16>;
    for (var q = 0u; q < 16u; q = q + 1u) {
        acc[q] = 0.0;
    }
    for (var k0 = 0u; k0 < k; k0 = k0 + TK) {
        // Stage: 256 invocations load 1024 values of each tile (4 each), zero-padding the edges.
        for (var s = 0u; s < 4u; s = s + 1u) {
            let e = t * 4u + s;
            let xr = e / TK;
            let xc = e % TK;
            var xv = 0.0;
            if (row0 + xr < rows && k0 + xc < k) {
                xv = x[(row0 + xr) * k + k0 + xc];
            }
            xs[e] = xv;
            let wr = e / TN;
            let wc = e % TN;
            var wv = 0.0;
            if (k0 + wr < k && col0 + wc < n) {
                wv = w[(k0 + wr) * n + col0 + wc];
            }
            ws[e] = wv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk = kk + 1u) {
            var a: array<f32, 4>;
            var bb: array<f32, 4>;
            for (var i = 0u; i < 4u; i = i + 1u) {
                a[i] = xs[(lid.y * 4u + i) * TK + kk];
                bb[i] = ws[kk * TN + lid.x * 4u + i];
            }
            for (var i = 0u; i < 4u; i = i + 1u) {
                for (var j = 0u; j < 4u; j = j + 1u) {
                    acc[i * 4u + j] = fma(a[i], bb[j], acc[i * 4u + j]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = row0 + lid.y * 4u + i;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let c = col0 + lid.x * 4u + j;
            if (r < rows && c < n) {
                var bias = 0.0;
                if (has_bias != 0u) {
                    bias = b[c];
                }
                y[r * n + c] = act(acc[i * 4u + j] + bias);
            }
        }
    }
}
