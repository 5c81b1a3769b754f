//! The ONNX importer's op registry, as tract's `register_all_ops`: each op family registers its ops (name, the
//! inputs its handler reads unconditionally, the handler) in one place, and `Importer::node` looks the node's
//! op up here after the checks every op shares. A new op is one handler and one line in its family's
//! `register` (the unsupported-op error lists what is registered, so it cannot go stale).
//!
//! Families: the core ops (`register_core` in onnx.rs: constants, dense layers, arithmetic, activations, reshapes,
//! concatenations, slices) and the layout ops (`layout::register`: casts, transposes, shape arithmetic,
//! convolutions, pooling, layer normalisation). LSTM and GRU read their inputs by position and are dispatched
//! before the shared checks (`recurrent.rs`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::{Importer, Val};
use crate::ImportError;
use crate::onnx_proto as pb;

/// One node, as its handler sees it: its inputs resolved (constants folded, run-time values named and shaped).
pub(super) struct NodeIn<'a> {
    pub node: &'a pb::NodeProto,
    /// The node's position in the graph (for error labels).
    pub idx: usize,
    pub ins: Vec<Val>,
    /// The node's first output's name.
    pub out: String,
}

impl NodeIn<'_> {
    /// The node, its position and its inputs: what most handlers read first.
    pub fn parts(&self) -> (&pb::NodeProto, usize, &[Val]) {
        (self.node, self.idx, &self.ins)
    }
}

pub(super) type Handler = fn(&mut Importer, &NodeIn<'_>) -> Result<(), ImportError>;

/// What the registry holds per op type.
#[derive(Clone, Copy)]
pub(super) struct OpDef {
    /// Inputs the handler reads unconditionally (a node with fewer is malformed).
    pub min_inputs: usize,
    pub handler: Handler,
}

#[derive(Default)]
pub(super) struct OpRegistry(BTreeMap<&'static str, OpDef>);

impl OpRegistry {
    /// Register `handler` for each op type of `names` (one handler may serve a family of similar ops).
    pub fn insert(&mut self, names: &[&'static str], min_inputs: usize, handler: Handler) {
        for name in names {
            let previous = self.0.insert(
                name,
                OpDef {
                    min_inputs,
                    handler,
                },
            );
            debug_assert!(previous.is_none(), "{name} registered twice");
        }
    }

    pub fn get(&self, op: &str) -> Option<OpDef> {
        self.0.get(op).copied()
    }

    /// Every registered op type, and the recurrent ones dispatched before the registry, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.0.keys().copied().chain(["GRU", "LSTM"]).collect();
        names.sort_unstable();
        names
    }
}

fn register_all_ops(reg: &mut OpRegistry) {
    super::register_core(reg);
    super::layout::register(reg);
}

/// The registry, built once per process.
pub(super) fn registry() -> &'static OpRegistry {
    static REGISTRY: OnceLock<OpRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut reg = OpRegistry::default();
        register_all_ops(&mut reg);
        reg
    })
}

#[cfg(test)]
mod tests {
    use super::registry;

    /// The ops the README and the fixtures rely on are all registered, each once (a duplicate trips the debug
    /// assertion while the registry is built).
    #[test]
    fn every_supported_op_is_registered() {
        let names = registry().names();
        for op in [
            "Gemm",
            "MatMul",
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Neg",
            "Relu",
            "Tanh",
            "Sigmoid",
            "Erf",
            "Elu",
            "LeakyRelu",
            "Gelu",
            "Exp",
            "Clip",
            "Softmax",
            "LogSoftmax",
            "Conv",
            "MaxPool",
            "LayerNormalization",
            "Transpose",
            "Concat",
            "Reshape",
            "Flatten",
            "Squeeze",
            "Unsqueeze",
            "Slice",
            "Split",
            "Shape",
            "Gather",
            "Cast",
            "Constant",
            "Identity",
            "Dropout",
            "LSTM",
            "GRU",
        ] {
            assert!(names.contains(&op), "{op} is not registered");
        }
        assert_eq!(registry().get("Slice").map(|d| d.min_inputs), Some(3));
        assert_eq!(registry().get("Constant").map(|d| d.min_inputs), Some(0));
        assert!(registry().get("NonMaxSuppression").is_none());
    }
}
