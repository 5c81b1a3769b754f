// Observation preprocessing on the device (scale, normalise + clip), elementwise over [rows, len] values into f32.
// The STEPS placeholder in main is replaced by the artifact's steps in order, each a statement on `v` with `c` the feature index
// (see lib.rs); normalisation statistics come from `stats` at offsets baked into the statements.
// The INPUT and LOAD placeholders say how the input is read (PreInput in lib.rs): f32 values, or uint8 frames uploaded
// as their bytes, four to a u32 word (WGSL has no 8-bit type), each widened here: a quarter of the upload an f32 copy
// of the same frames would be.
//
// Bindings: 0 x [rows * len] values, 1 y [rows * len] f32, 2 stats f32, 3 params [total, len] u32.

@group(0) @binding(0) var<storage, read_write> x: array<{{INPUT}}>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> stats: array<f32>;
@group(0) @binding(3) var<storage, read_write> params: array<u32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * 256u + gid.x;
    let total = params[0];
    if (i >= total) {
        return;
    }
    let c = i % params[1];
    var v = {{LOAD}};
{{STEPS}}
    y[i] = v;
}
