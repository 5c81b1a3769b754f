//! Lowering shared by every executor: each value of the namespace gets a slot index, each node becomes
//! (op, input slots, output slot) with the sizes its kernels need. Executors (burn, native CPU) only translate
//! these into their own instructions, so both run exactly the same graph.

use std::collections::HashMap;

use policyport_format::{Artifact, OBS_VALUE, Op, STATE_PREFIX, ValidatedPlan};

use crate::kernels::Act;

pub(crate) struct LoweredNode<'a> {
    pub op: &'a Op,
    pub ins: Vec<usize>,
    pub out: usize,
    /// Size of the last feature axis of each input.
    pub in_last: Vec<usize>,
}

pub(crate) struct Lowered<'a> {
    pub nodes: Vec<LoweredNode<'a>>,
    /// Per-env element count of every slot.
    pub slot_numel: Vec<usize>,
    pub obs_slot: usize,
    /// (slot, numel) of each recurrent state input.
    pub state_slots: Vec<(usize, usize)>,
    /// (slot, numel) of each value read back after a step, in the order asked for.
    pub readback: Vec<(usize, usize)>,
    /// How many nodes read each slot (fusion may only consume a value nobody else reads).
    pub readers: Vec<usize>,
}

pub(crate) fn lower<'a>(
    art: &'a Artifact,
    plan: &ValidatedPlan,
    readback_values: &[&str],
) -> Lowered<'a> {
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
        let out = slot_of(&node.output, &mut slots, &mut slot_numel);
        nodes.push(LoweredNode {
            op: &node.op,
            ins,
            out,
            in_last,
        });
    }
    let readback = readback_values
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
    Lowered {
        nodes,
        slot_numel,
        obs_slot,
        state_slots,
        readback,
        readers,
    }
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
        _ => return None,
    })
}

/// Affine tensors broadcast over the whole feature vector (numel == total) or over the last axis.
pub(crate) fn affine_group(
    art: &Artifact,
    scale: &Option<String>,
    shift: &Option<String>,
    total: usize,
    last: usize,
) -> usize {
    let cols = |n: &String| {
        if art.tensors[n].data.len() == total {
            total
        } else {
            last
        }
    };
    scale.as_ref().or(shift.as_ref()).map(cols).unwrap_or(total)
}

/// A one-element affine tensor repeated over its group.
pub(crate) fn expand_affine(d: &[f32], group: usize) -> Vec<f32> {
    if d.len() == 1 {
        vec![d[0]; group]
    } else {
        d.to_vec()
    }
}
