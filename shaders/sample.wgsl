// Seeded sampling on the device, exactly as guest/format/SPEC.md ("Seeded sampling") defines it, one invocation
// per env row. Reads the raw head row (distribution values, then the value estimate), finishes the distribution
// parameters (log-std broadcast / clamp), draws the actions from Philox4x32-10 keyed by (seed, env, step), and
// writes the packed output row [actions | finished parameters | value] that act() reads back in one copy.
//
// Bindings: 0 head [rows, hw] f32, 1 envs [rows] u32, 2 out [rows, k + p + v] f32,
//   3 params u32: rows, hw, k, p, v, kind (0 categorical / multi-categorical, 1 Gaussian, 2 deterministic actor,
//     3 Q values), mode (0 deterministic, 1 sample), seed_lo, seed_hi, step_lo, step_hi, epsilon (f32 bits; Q
//     values), flags (1 squashed, 2 clip, 4 log-std is a parameter, 8 log-std range, 16 squashed with a linear
//     deterministic action: the mean rescaled without tanh and clamped, SPEC.md's `clipped_mean`; 32 the
//     deterministic actor's output is rescaled from [-1, 1], 64 it has exploration noise), n_seg, then n_seg
//     segment sizes;
//   4 fparams f32: range_lo, range_hi, low[k], high[k], log_std_param[k] (already clamped), noise_mean[k],
//     noise_sigma[k].

@group(0) @binding(0) var<storage, read_write> head: array<f32>;
@group(0) @binding(1) var<storage, read_write> envs: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> params: array<u32>;
@group(0) @binding(4) var<storage, read_write> fparams: array<f32>;

// 32x32 -> high 32 bits, from 16-bit limbs (WGSL has no mul-hi; u32 products wrap).
fn mulhi(a: u32, m: u32) -> u32 {
    let al = a & 0xFFFFu;
    let ah = a >> 16u;
    let ml = m & 0xFFFFu;
    let mh = m >> 16u;
    let ll = al * ml;
    let lh = al * mh;
    let hl = ah * ml;
    let hh = ah * mh;
    let mid = (ll >> 16u) + (lh & 0xFFFFu) + (hl & 0xFFFFu);
    return hh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
}

fn philox(ctr_in: vec4<u32>, key_in: vec2<u32>) -> vec4<u32> {
    var c = ctr_in;
    var k = key_in;
    for (var round = 0u; round < 10u; round = round + 1u) {
        if (round > 0u) {
            k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
        }
        let hi0 = mulhi(0xD2511F53u, c.x);
        let lo0 = 0xD2511F53u * c.x;
        let hi1 = mulhi(0xCD9E8D57u, c.z);
        let lo1 = 0xCD9E8D57u * c.z;
        c = vec4<u32>(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    }
    return c;
}

var<private> cached_block: u32 = 0xFFFFFFFFu;
var<private> block: vec4<u32>;

fn word(i: u32, env: u32) -> u32 {
    let b = i / 4u;
    if (b != cached_block) {
        block = philox(vec4<u32>(b, env, params[9], params[10]), vec2<u32>(params[7], params[8]));
        cached_block = b;
    }
    return block[i % 4u];
}

fn u01(w: u32) -> f32 {
    return f32(w >> 8u) * (1.0 / 16777216.0);
}

fn u01_open_closed(w: u32) -> f32 {
    return f32((w >> 8u) + 1u) * (1.0 / 16777216.0);
}

// ln(x) for x in (0, 1] (the Box–Muller u1), to about 2 ulp. WGSL only bounds the builtin log to 3 ulp outside
// [0.5, 2] and some implementations (SwiftShader in Chrome) approximate it more loosely; the sampled actions must
// equal the CPU sampler's, so the sampler uses its own: x = m * 2^e with m in [sqrt(1/2), sqrt(2)),
// ln(m) = 2 atanh(s), s = (m - 1) / (m + 1) (|s| <= 0.172), odd series to s^11, plus e ln 2.
fn pp_ln(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    var e = i32((bits >> 23u) & 0xffu) - 127;
    var m = bitcast<f32>((bits & 0x007fffffu) | 0x3f800000u);
    if (m > 1.4142135) {
        m = m * 0.5;
        e = e + 1;
    }
    let f = m - 1.0;
    let sv = f / (2.0 + f);
    let z = sv * sv;
    var p = 1.0 / 11.0;
    p = fma(p, z, 1.0 / 9.0);
    p = fma(p, z, 1.0 / 7.0);
    p = fma(p, z, 1.0 / 5.0);
    p = fma(p, z, 1.0 / 3.0);
    p = fma(p, z, 1.0);
    return fma(f32(e), 0.6931472, 2.0 * sv * p);
}

// cos(2 pi t) for t in [0, 1), to about 2 ulp (WGSL's builtin cos is only bounded to 2^-11 absolute). The
// quadrant and the reflection are exact in turns (t * 4 and 1 - r are exact for the sampler's 24-bit t); the
// remaining angle x in [0, pi/4] goes through Taylor polynomials (truncation < 2e-9).
fn pp_cos_turns(t: f32) -> f32 {
    let t4 = t * 4.0;
    let q = u32(floor(t4)) & 3u;
    let r = t4 - floor(t4);
    let flip = r > 0.5;
    let x = select(r, 1.0 - r, flip) * 1.5707964;
    let x2 = x * x;
    var sn = -1.0 / 362880.0;
    sn = fma(sn, x2, 1.0 / 5040.0);
    sn = fma(sn, x2, -1.0 / 120.0);
    sn = fma(sn, x2, 1.0 / 6.0);
    sn = x - x * x2 * sn;
    var cs = -1.0 / 3628800.0;
    cs = fma(cs, x2, 1.0 / 40320.0);
    cs = fma(cs, x2, -1.0 / 720.0);
    cs = fma(cs, x2, 1.0 / 24.0);
    cs = fma(cs, x2, -0.5);
    cs = fma(cs, x2, 1.0);
    // theta = r * pi/2: cos(theta) and sin(theta), swapped when the reflected angle was used.
    let c = select(cs, sn, flip);
    let s = select(sn, cs, flip);
    switch q {
        case 0u: { return c; }
        case 1u: { return -s; }
        case 2u: { return -c; }
        default: { return s; }
    }
}

fn safe_tanh(v: f32) -> f32 {
    return tanh(clamp(v, -15.0, 15.0));
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let rows = params[0];
    let row = gid.x;
    if (row >= rows) {
        return;
    }
    let hw = params[1];
    let k = params[2];
    let p = params[3];
    let v = params[4];
    let kind = params[5];
    let sample = params[6] == 1u;
    let flags = params[12];
    let env = envs[row];
    let h0 = row * hw;
    let width = k + p + v;
    let o0 = row * width;
    if (kind == 0u) {
        let n_seg = params[13];
        var off = 0u;
        for (var s = 0u; s < n_seg; s = s + 1u) {
            let n = params[14u + s];
            var pick = 0u;
            if (!sample) {
                for (var i = 1u; i < n; i = i + 1u) {
                    if (head[h0 + off + i] > head[h0 + off + pick]) {
                        pick = i;
                    }
                }
            } else {
                var mx = head[h0 + off];
                for (var i = 1u; i < n; i = i + 1u) {
                    mx = max(mx, head[h0 + off + i]);
                }
                var total = 0.0;
                for (var i = 0u; i < n; i = i + 1u) {
                    total = total + exp(head[h0 + off + i] - mx);
                }
                let t = u01(word(s, env)) * total;
                var acc = 0.0;
                pick = n - 1u;
                for (var i = 0u; i < n; i = i + 1u) {
                    acc = acc + exp(head[h0 + off + i] - mx);
                    if (acc > t) {
                        pick = i;
                        break;
                    }
                }
            }
            out[o0 + s] = f32(pick);
            off = off + n;
        }
        for (var j = 0u; j < p; j = j + 1u) {
            out[o0 + k + j] = head[h0 + j];
        }
    } else if (kind == 3u) {
        // Q values: greedy, or with probability epsilon a uniform action, floor(w * n / 2^32) exactly.
        let n = params[14];
        var pick = 0u;
        for (var i = 1u; i < n; i = i + 1u) {
            if (head[h0 + i] > head[h0 + pick]) {
                pick = i;
            }
        }
        if (sample && u01(word(0u, env)) < bitcast<f32>(params[11])) {
            pick = mulhi(word(1u, env), n);
        }
        out[o0] = f32(pick);
        for (var j = 0u; j < p; j = j + 1u) {
            out[o0 + k + j] = head[h0 + j];
        }
    } else if (kind == 2u) {
        // A deterministic actor: its output, plus recorded exploration noise when sampled, mapped to the bounds.
        let rescale = (flags & 32u) != 0u;
        let noisy = sample && (flags & 64u) != 0u;
        for (var d = 0u; d < k; d = d + 1u) {
            let x = head[h0 + d];
            out[o0 + k + d] = x;
            var a = x;
            if (noisy) {
                let u1 = u01_open_closed(word(2u * d, env));
                let u2 = u01(word(2u * d + 1u, env));
                let z = sqrt(-2.0 * pp_ln(u1)) * pp_cos_turns(u2);
                a = a + (fparams[2u + 3u * k + d] + fparams[2u + 4u * k + d] * z);
                if (rescale) {
                    a = clamp(a, -1.0, 1.0);
                }
            }
            let lo = fparams[2u + d];
            let hi = fparams[2u + k + d];
            if (rescale) {
                a = lo + 0.5 * (a + 1.0) * (hi - lo);
            } else {
                a = clamp(a, lo, hi);
            }
            out[o0 + d] = a;
        }
    } else {
        let squashed = (flags & 1u) != 0u;
        let clip = (flags & 2u) != 0u;
        let ls_param = (flags & 4u) != 0u;
        let ranged = (flags & 8u) != 0u;
        let linear_det = (flags & 16u) != 0u;
        for (var d = 0u; d < k; d = d + 1u) {
            let mean = head[h0 + d];
            var ls: f32;
            if (ls_param) {
                ls = fparams[2u + 2u * k + d];
            } else {
                ls = head[h0 + k + d];
                if (ranged) {
                    ls = clamp(ls, fparams[0], fparams[1]);
                }
            }
            out[o0 + k + d] = mean;
            out[o0 + 2u * k + d] = ls;
            var a = mean;
            if (sample) {
                let u1 = u01_open_closed(word(2u * d, env));
                let u2 = u01(word(2u * d + 1u, env));
                let z = sqrt(-2.0 * pp_ln(u1)) * pp_cos_turns(u2);
                a = mean + exp(ls) * z;
            }
            let lo = fparams[2u + d];
            let hi = fparams[2u + k + d];
            if (squashed && linear_det && !sample) {
                a = clamp(lo + (a + 1.0) * 0.5 * (hi - lo), lo, hi);
            } else if (squashed) {
                a = lo + (safe_tanh(a) + 1.0) * 0.5 * (hi - lo);
            } else if (clip) {
                a = clamp(a, lo, hi);
            }
            out[o0 + d] = a;
        }
    }
    if (v == 1u) {
        out[o0 + k + p] = head[h0 + hw - 1u];
    }
}
