// Fused dense layer + bias + activation for small batches: y[r, o] = act(sum_i x[r, i] * w[i, o] + b[o]).
// One invocation per output column o and block of ROWS rows: w is read once per row block, coalesced across the
// workgroup (consecutive o), x is a broadcast read. Latency-bound batches (1..~64 rows) want many columns in
// flight, not tiling. The ACT_FN placeholder below becomes `fn act(v: f32) -> f32` (see lib.rs).
//
// Bindings: 0 x [rows, k] f32, 1 w [k, n] f32 (pre-transposed at load), 2 b [n] f32 (ignored if !has_bias),
// 3 y [rows, n] f32, 4 params [rows, k, n, has_bias] u32.

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> params: array<u32>;

const ROWS: u32 = 4u;

{{ACT_FN}}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let rows = params[0];
    let k = params[1];
    let n = params[2];
    let has_bias = params[3];
    let o = gid.x;
    let r0 = gid.y * ROWS;
    if (o >= n || r0 >= rows) {
        return;
    }
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    let nr = min(ROWS, rows - r0);
    for (var i = 0u; i < k; i = i + 1u) {
        let wv = w[i * n + o];
        for (var r = 0u; r < nr; r = r + 1u) {
            acc[r] = fma(x[(r0 + r) * k + i], wv, acc[r]);
        }
    }
    var bias = 0.0;
    if (has_bias != 0u) {
        bias = b[o];
    }
    for (var r = 0u; r < nr; r = r + 1u) {
        y[(r0 + r) * n + o] = act(acc[r] + bias);
    }
}
