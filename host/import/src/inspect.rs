//! Human-readable summary of an artifact: spaces, preprocessing, submodules, parameters, FLOPs per env step.

use std::fmt::Write;

use policyport_format::{Artifact, Op, ValidatedPlan};

/// Multiply-adds count as 2 FLOPs; elementwise ops 1 per element (transcendentals too: a count, not a cost).
pub fn flops_per_env(art: &Artifact, plan: &ValidatedPlan) -> u64 {
    art.manifest
        .modules
        .iter()
        .flat_map(|m| &m.nodes)
        .map(|n| node_flops(art, plan, n))
        .sum()
}

/// FLOPs of one node per env step (the rule of [`flops_per_env`]).
pub fn node_flops(art: &Artifact, plan: &ValidatedPlan, n: &policyport_format::Node) -> u64 {
    let numel = |v: &str| plan.shapes[v].iter().product::<usize>() as u64;
    match &n.op {
        Op::Dense { weight, bias } => {
            let s = &art.tensors[weight].shape;
            2 * (s[0] * s[1]) as u64 + bias.as_ref().map_or(0, |_| s[0] as u64)
        }
        Op::Conv2d { weight, bias, .. } => {
            // Per output element: C/g·KH·KW multiply-adds (+ the bias).
            let s = &art.tensors[weight].shape;
            let per = (s[1] * s[2] * s[3]) as u64;
            numel(&n.output) * (2 * per + bias.as_ref().map_or(0, |_| 1))
        }
        Op::MaxPool2d { kernel, .. } => numel(&n.output) * (kernel[0] * kernel[1]) as u64,
        Op::LayerNorm { .. } => 8 * numel(&n.output),
        Op::Flatten | Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. } | Op::Concat => {
            0
        }
        Op::Softmax | Op::LogSoftmax => 4 * numel(&n.output),
        _ => numel(&n.output),
    }
}

/// Text from an untrusted file made safe to print on a terminal: control characters other than newline and
/// tab, and the bidirectional overrides that reorder what a reader sees, are written as `\u{..}` escapes.
/// (`inspect` printed names carrying escape sequences raw: a file could rewrite the user's terminal.)
pub fn terminal_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if (c.is_control() && c != '\n' && c != '\t') || bidi {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

pub fn summary(art: &Artifact, plan: &ValidatedPlan, file_len: usize) -> String {
    let m = &art.manifest;
    let mut s = String::new();
    let params: usize = art.tensors.values().map(|t| t.data.len()).sum();
    let _ = writeln!(
        s,
        "policy      {}  (format v{}.{}, {} bytes)",
        m.name, art.version.0, art.version.1, file_len
    );
    let _ = writeln!(
        s,
        "producer    {} {} from {}",
        m.producer.tool, m.producer.version, m.producer.source
    );
    if !m.producer.notes.is_empty() {
        let _ = writeln!(s, "            {}", m.producer.notes);
    }
    let _ = writeln!(
        s,
        "observation {}",
        serde_json::to_string(&m.observation).unwrap_or_default()
    );
    for p in &m.preprocess {
        let _ = writeln!(
            s,
            "  then      {}",
            serde_json::to_string(p).unwrap_or_default()
        );
    }
    let _ = writeln!(
        s,
        "action      {}",
        serde_json::to_string(&m.action).unwrap_or_default()
    );
    let _ = writeln!(
        s,
        "distribution {}",
        serde_json::to_string(&m.distribution).unwrap_or_default()
    );
    write_acting_notes(&mut s, m);
    let _ = writeln!(s, "submodules:");
    for module in &m.modules {
        write_module(&mut s, art, plan, module);
    }
    let _ = writeln!(s, "parameters  {params} ({} tensors)", art.tensors.len());
    let _ = writeln!(s, "FLOPs/step  {} per env", flops_per_env(art, plan));
    let _ = writeln!(
        s,
        "golden      {} case(s): {}",
        m.golden.len(),
        m.golden
            .iter()
            .map(|g| format!("{} (batch {})", g.name, g.batch))
            .collect::<Vec<_>>()
            .join(", ")
    );
    s
}

/// How the policy acts beyond its distribution (Q-values, deterministic actors), frame layout, masks, the value
/// output and the recurrent states.
fn write_acting_notes(s: &mut String, m: &policyport_format::Manifest) {
    match &m.distribution {
        policyport_format::Distribution::QValues { epsilon, .. } => {
            let _ = writeln!(
                s,
                "acting      greedy when deterministic; sampled: epsilon-greedy at {epsilon} (per-request \
                 override: epsilon)"
            );
        }
        policyport_format::Distribution::Deterministic { noise, .. } => {
            let _ = writeln!(
                s,
                "acting      a deterministic actor; sampled: {}",
                if noise.is_some() {
                    "the recorded exploration noise added"
                } else {
                    "no exploration noise recorded, the deterministic action"
                }
            );
        }
        _ => {}
    }
    if let policyport_format::ObservationSpace::Box {
        shape,
        dtype: policyport_format::ObsDType::U8,
    } = &m.observation
        && let [c, h, w] = shape[..]
        && c <= h.min(w)
    {
        let _ = writeln!(
            s,
            "layout      frames as [C, H, W] = [{c}, {h}, {w}] (channels first); the CLI (.npy) and Python also \
             take the env's channels-last [{h}, {w}, {c}] and transpose them, as SB3's predict does"
        );
    }
    if m.action_masks {
        let _ = writeln!(
            s,
            "masks       trained with action masks: pass one per call (one flag per logit); without one, \
             acting is unmasked"
        );
    }
    if let Some(v) = &m.value {
        let _ = writeln!(s, "value       '{v}'");
    }
    if let Some(r) = &m.recurrent {
        for st in &r.states {
            let _ = writeln!(
                s,
                "state       '{}' {:?} (next: '{}')",
                st.name, st.shape, st.next
            );
        }
    }
}

/// One submodule: its role, inputs and outputs with shapes, size and cost, then a line per node.
fn write_module(
    s: &mut String,
    art: &Artifact,
    plan: &ValidatedPlan,
    module: &policyport_format::Module,
) {
    let mp: usize = module
        .nodes
        .iter()
        .flat_map(|n| n.op.tensors())
        .map(|t| art.tensors[t].data.len())
        .sum();
    let mf: u64 = module.nodes.iter().map(|n| node_flops(art, plan, n)).sum();
    let _ = writeln!(
        s,
        "  {:<10} {:<14} {} -> {}  ({} nodes, {} params, {} FLOPs/step)",
        module.name,
        format!("{:?}", module.role),
        module
            .inputs
            .iter()
            .map(|i| format!("{i}{:?}", plan.shapes[i]))
            .collect::<Vec<_>>()
            .join(", "),
        module
            .outputs
            .iter()
            .map(|o| format!("{o}{:?}", plan.shapes[o]))
            .collect::<Vec<_>>()
            .join(", "),
        module.nodes.len(),
        mp,
        mf
    );
    for n in &module.nodes {
        let op = match &n.op {
            Op::Dense { weight, .. } => format!("dense {:?}", art.tensors[weight].shape),
            Op::Conv2d { weight, stride, .. } => {
                format!("conv2d {:?}/{}", art.tensors[weight].shape, stride[0])
            }
            Op::MaxPool2d { kernel, stride, .. } => {
                format!("max_pool2d {}x{}/{}", kernel[0], kernel[1], stride[0])
            }
            other => other.kind(),
        };
        let _ = writeln!(
            s,
            "      {:<22} {} -> {}{:?}",
            op,
            n.inputs.join(", "),
            n.output,
            plan.shapes[&n.output]
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn terminal_escapes_in_names_are_not_printed_raw() {
        let s = super::terminal_safe(
            "policy \u{1b}]0;pwned\u{7}\u{1b}[2J name\u{202e}txt.exe\nnext\tline",
        );
        assert!(
            !s.contains('\u{1b}') && !s.contains('\u{7}') && !s.contains('\u{202e}'),
            "{s}"
        );
        assert!(
            s.contains("\\u{1b}]0;pwned") && s.contains("\nnext\tline"),
            "{s}"
        );
    }
}
