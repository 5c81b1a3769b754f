// Per-env recurrent state kept on the device: gather the rows of a batch's env ids before a step, scatter the next
// state back after it. One invocation per (row, element); MODE is 0 (gather: out[r, j] = state[ids[r], j]) or
// 1 (scatter: state[ids[r], j] = src[r, j]; env ids in a batch are distinct, so writes never race).
//
// Bindings: 0 state [num_envs, n] f32, 1 rows [batch, n] f32 (gather: written; scatter: read), 2 ids [batch] u32,
// 3 params [batch, n, mode] u32.

@group(0) @binding(0) var<storage, read_write> state: array<f32>;
@group(0) @binding(1) var<storage, read_write> rows: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> params: array<u32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * 256u + gid.x;
    let batch = params[0];
    let n = params[1];
    if (i >= batch * n) {
        return;
    }
    let r = i / n;
    let j = i % n;
    let s = ids[r] * n + j;
    if (params[2] == 0u) {
        rows[i] = state[s];
    } else {
        state[s] = rows[i];
    }
}
