//! The one lowering and the one fusion pass, shared by every executor (native CPU, burn flex, burn-wgpu, and the
//! libtorch host): each value of the namespace gets a slot index, each node becomes (op, input slots, output
//! slot) with the sizes its kernels need, and a Dense whose only reader is an elementwise activation absorbs it
//! ([`LoweredNode::act`]). Executors only translate these nodes into their own instructions, so all of them run
//! exactly the same graph with the same fusion. Adding an op: one IR entry (format), one arm per executor.

use std::collections::HashMap;

use policyport_format::{Artifact, OBS_VALUE, Op, STATE_PREFIX, ValidatedPlan};

use crate::kernels::Act;

pub struct LoweredNode<'a> {
    pub op: &'a Op,
    pub ins: Vec<usize>,
    /// Where the result goes: the node's own output, or, when an activation was fused into it, the activation's.
    pub out: usize,
    /// Size of the last feature axis of each input.
    pub in_last: Vec<usize>,
    /// Feature shape of each input, and of the node's own output (before fusion: the activation keeps it).
    pub in_shapes: Vec<Vec<usize>>,
    pub out_shape: Vec<usize>,
    /// The activation applied to the result (fused from the activation node that was the only reader of this
    /// node's output; `Identity` when none). Only Dense and Conv2d nodes absorb activations.
    pub act: Act,
}

pub struct Lowered<'a> {
    pub nodes: Vec<LoweredNode<'a>>,
    /// Per-env element count of every slot.
    pub slot_numel: Vec<usize>,
    pub obs_slot: usize,
    /// (slot, numel) of each recurrent state input.
    pub state_slots: Vec<(usize, usize)>,
    /// (slot, numel) of each value read back after a step, in the order asked for.
    pub readback: Vec<(usize, usize)>,
    /// How many nodes read each slot (before fusion).
    pub readers: Vec<usize>,
}

/// What one step reads back: the head's values (distribution values, then the value estimate), then the next
/// value of every recurrent state, in manifest order.
pub fn step_readback<'a>(art: &'a Artifact, plan: &'a ValidatedPlan) -> Vec<&'a str> {
    let mut values = plan.head.readback_values();
    values.extend(
        art.manifest
            .recurrent
            .iter()
            .flat_map(|r| &r.states)
            .map(|s| s.next.as_str()),
    );
    values
}

/// Lower the artifact's graph (validated by `plan`) for a step that reads back `readback_values`.
pub fn lower<'a>(art: &'a Artifact, plan: &ValidatedPlan, readback_values: &[&str]) -> Lowered<'a> {
    let mut slots: HashMap<String, usize> = HashMap::new();
    let mut slot_numel = vec![];
    let slot_of =
        |name: &str, slots: &mut HashMap<String, usize>, slot_numel: &mut Vec<usize>| -> usize {
            if let Some(s) = slots.get(name) {
                return *s;
            }
            slot_numel.push(plan.shapes[name].iter().product());
            slots.insert(name.to_string(), slot_numel.len() - 1);
            slot_numel.len() - 1
        };
    let obs_slot = slot_of(OBS_VALUE, &mut slots, &mut slot_numel);
    let state_names: Vec<String> = art
        .manifest
        .recurrent
        .iter()
        .flat_map(|r| &r.states)
        .map(|s| format!("{STATE_PREFIX}{}", s.name))
        .collect();
    let state_slots = state_names
        .iter()
        .map(|n| {
            let s = slot_of(n, &mut slots, &mut slot_numel);
            (s, slot_numel[s])
        })
        .collect();
    let mut nodes = vec![];
    for node in art.manifest.modules.iter().flat_map(|m| &m.nodes) {
        let ins = node
            .inputs
            .iter()
            .map(|i| slot_of(i, &mut slots, &mut slot_numel))
            .collect();
        let in_last = node
            .inputs
            .iter()
            .map(|i| *plan.shapes[i].last().unwrap())
            .collect();
        let in_shapes = node.inputs.iter().map(|i| plan.shapes[i].clone()).collect();
        let out = slot_of(&node.output, &mut slots, &mut slot_numel);
        nodes.push(LoweredNode {
            op: &node.op,
            ins,
            out,
            in_last,
            in_shapes,
            out_shape: plan.shapes[&node.output].clone(),
            act: Act::Identity,
        });
    }
    let readback: Vec<(usize, usize)> = readback_values
        .iter()
        .map(|v| {
            let s = slot_of(v, &mut slots, &mut slot_numel);
            (s, slot_numel[s])
        })
        .collect();
    let mut readers = vec![0; slot_numel.len()];
    for n in &nodes {
        for i in &n.ins {
            readers[*i] += 1;
        }
    }
    let nodes = fuse_dense_activations(nodes, &readers, &readback);
    Lowered {
        nodes,
        slot_numel,
        obs_slot,
        state_slots,
        readback,
        readers,
    }
}

/// Per node of `low`: whether it is needed for the step's readback values other than `dropped` (an index into
/// [`Lowered::readback`]) — the nodes a step may skip when the caller does not want that value (the value
/// estimate: [`crate::Request::skip_value`]). Backward liveness over the SSA node list: a node is needed when a
/// needed node reads its output or a kept readback value is its output. A slot read back both as the dropped
/// value and as a kept one (a graph whose value is also a logit) stays needed.
pub fn needed_without_readback(low: &Lowered<'_>, dropped: usize) -> Vec<bool> {
    let mut live = vec![false; low.slot_numel.len()];
    for (i, (slot, _)) in low.readback.iter().enumerate() {
        if i != dropped {
            live[*slot] = true;
        }
    }
    let mut needed = vec![false; low.nodes.len()];
    for (i, n) in low.nodes.iter().enumerate().rev() {
        if live[n.out] {
            needed[i] = true;
            for &s in &n.ins {
                live[s] = true;
            }
        }
    }
    needed
}

/// The fusion pass: a Dense (or Conv2d) whose output is read by exactly one node, an elementwise activation, and is not
/// read back, computes that activation itself (the activation node disappears; the Dense writes the
/// activation's output slot). Moving the activation up to the Dense is sound because values are SSA: its only
/// input is ready there. Every executor runs the fused graph (one rule for all; before, the cpu backend fused
/// with a later reader anywhere and wgpu only with the very next node).
fn fuse_dense_activations<'a>(
    nodes: Vec<LoweredNode<'a>>,
    readers: &[usize],
    readback: &[(usize, usize)],
) -> Vec<LoweredNode<'a>> {
    let mut absorbed = vec![None; nodes.len()];
    let mut gone = vec![false; nodes.len()];
    // The first node reading each slot, in one pass (a scan of the later nodes per Dense made this O(N^2) in
    // node count: a hostile 100k-node graph). Values are SSA, so a slot's readers all come after its writer.
    let mut first_reader = vec![usize::MAX; readers.len()];
    for (j, m) in nodes.iter().enumerate() {
        for &s in &m.ins {
            if let Some(r) = first_reader.get_mut(s)
                && *r == usize::MAX
            {
                *r = j;
            }
        }
    }
    let read_back: std::collections::HashSet<usize> = readback.iter().map(|(s, _)| *s).collect();
    for (i, n) in nodes.iter().enumerate() {
        if !matches!(n.op, Op::Dense { .. } | Op::Conv2d { .. })
            || readers[n.out] != 1
            || read_back.contains(&n.out)
        {
            continue;
        }
        let j = first_reader[n.out];
        if j != usize::MAX
            && j > i
            && let Some(f) = act_of(nodes[j].op)
        {
            let reader = &nodes[j];
            absorbed[i] = Some((f, reader.out));
            gone[j] = true;
        }
    }
    nodes
        .into_iter()
        .zip(absorbed)
        .zip(gone)
        .filter(|(_, gone)| !gone)
        .map(|((mut n, fused), _)| {
            if let Some((f, out)) = fused {
                n.act = f;
                n.out = out;
            }
            n
        })
        .collect()
}

/// The elementwise activation an op is, if it is one (every executor maps these the same way; public so
/// executors outside this crate, e.g. the libtorch host, share the mapping).
pub fn act_of(op: &Op) -> Option<Act> {
    Some(match op {
        Op::Relu => Act::Relu,
        Op::Tanh => Act::Tanh,
        Op::Sigmoid => Act::Sigmoid,
        Op::Silu => Act::Silu,
        Op::Elu { alpha } => Act::Elu(*alpha),
        Op::LeakyRelu { alpha } => Act::LeakyRelu(*alpha),
        Op::Gelu { approximate: false } => Act::Gelu,
        Op::Gelu { approximate: true } => Act::GeluTanh,
        Op::Erf => Act::Erf,
        Op::Exp => Act::Exp,
        Op::Clip { min, max } => Act::Clip(
            min.unwrap_or(f32::NEG_INFINITY),
            max.unwrap_or(f32::INFINITY),
        ),
        _ => return None,
    })
}

/// Affine tensors broadcast over the whole feature vector (numel == total) or over the last axis.
pub fn affine_group(
    art: &Artifact,
    scale: &Option<String>,
    shift: &Option<String>,
    total: usize,
    last: usize,
) -> usize {
    // Validation proved each tensor holds 1, `last` or `total` numbers and that scale and shift agree on the
    // group (one of them may be a single number): the group is `total` if either tensor spans the whole vector.
    // Choosing from `scale` alone let a one-number scale with a whole-vector shift index the shift by `last`
    // (regression test `affine_scale_and_shift_of_different_groups_are_refused`).
    let spans_total = |n: &Option<String>| {
        n.as_ref()
            .is_some_and(|n| art.tensors[n].data.len() == total)
    };
    if spans_total(scale) || spans_total(shift) {
        total
    } else {
        last
    }
}

/// A one-element affine tensor repeated over its group.
pub fn expand_affine(d: &[f32], group: usize) -> Vec<f32> {
    if d.len() == 1 {
        vec![d[0]; group]
    } else {
        d.to_vec()
    }
}

/// Per-env gather index of a feature-axis permutation: output element `i` is input element `index[i]`
/// (row-major over `shape`; output axis `a` is input axis `perm[a]`). Every executor runs Transpose as this gather.
pub fn transpose_index(shape: &[usize], perm: &[usize]) -> Vec<u32> {
    let rank = shape.len();
    let mut in_strides = vec![1usize; rank];
    for a in (0..rank.saturating_sub(1)).rev() {
        in_strides[a] = in_strides[a + 1] * shape[a + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let numel: usize = shape.iter().product();
    let mut index = Vec::with_capacity(numel);
    let mut pos = vec![0usize; rank];
    for _ in 0..numel {
        index.push(
            pos.iter()
                .zip(perm)
                .map(|(i, &p)| i * in_strides[p])
                .sum::<usize>() as u32,
        );
        for a in (0..rank).rev() {
            pos[a] += 1;
            if pos[a] < out_shape[a] {
                break;
            }
            pos[a] = 0;
        }
    }
    index
}

#[cfg(test)]
mod tests {
    use super::transpose_index;

    #[test]
    fn transpose_index_of_hwc_to_chw() {
        // [H=2, W=3, C=2] -> [C, H, W]
        let idx = transpose_index(&[2, 3, 2], &[2, 0, 1]);
        let x: Vec<u32> = (0..12).collect();
        let y: Vec<u32> = idx.iter().map(|&i| x[i as usize]).collect();
        assert_eq!(y, vec![0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11]);
        assert_eq!(transpose_index(&[4], &[0]), vec![0, 1, 2, 3]);
    }
}
