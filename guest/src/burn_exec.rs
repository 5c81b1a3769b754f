//! The burn executor with everything around the graph on the host: the `flex` backend's executor, and the
//! golden probes of intermediate values on wgpu (op by op on that device). The session preprocesses, gathers
//! and scatters recurrent state rows and samples; a step uploads the observations and the gathered state rows,
//! runs the [`BurnGraph`] and leaves the readback values on the device for one read.

use burn::tensor::{Device, Tensor};
use policyport_format::{Artifact, ValidatedPlan};

use crate::backend::Backend;
use crate::burn_graph::{BurnGraph, DeviceRows, cat_rows};
use crate::error::PolicyError;
use crate::executor::{ExecScratch, Executor, Pending, Readback, StepInput};

/// A lowered artifact on one burn device, host placement: immutable, shared by every session.
#[derive(Debug, Clone)]
pub(crate) struct BurnExecutor {
    graph: BurnGraph,
    backend: Backend,
    readback: Readback,
}

impl BurnExecutor {
    /// `readback_values`: what a step reads back (see [`crate::executor::ExecutorBuilder::build`]); `readback`:
    /// whether `device` can block for its rows.
    pub(crate) fn new(
        art: &Artifact,
        plan: &ValidatedPlan,
        readback_values: &[&str],
        device: &Device,
        backend: Backend,
        readback: Readback,
    ) -> Self {
        BurnExecutor {
            graph: BurnGraph::build(art, plan, readback_values, device, None, false),
            backend,
            readback,
        }
    }
}

impl Executor for BurnExecutor {
    fn backend(&self) -> Backend {
        self.backend
    }

    fn state_sizes(&self) -> &[usize] {
        &self.graph.state_sizes
    }

    fn row_width(&self) -> usize {
        self.graph.readback.iter().map(|(_, n)| n).sum()
    }

    /// Nothing: every step's data comes from the session.
    fn new_scratch(&self) -> ExecScratch {
        Box::new(())
    }

    fn launch(
        &self,
        _scratch: &mut ExecScratch,
        step: &StepInput<'_>,
        _rows: &mut Vec<f32>,
    ) -> Result<Pending, PolicyError> {
        let g = &self.graph;
        let batch = step.batch;
        let x = g.upload(step.obs, batch, step.obs.len() / batch);
        let states: Vec<Tensor<2>> = g
            .state_slots
            .iter()
            .zip(step.states)
            .map(|((_, n), data)| g.upload(data, batch, *n))
            .collect();
        let slots = g.forward(batch, x, states);
        let parts: Vec<Tensor<2>> = g
            .readback
            .iter()
            .map(|(s, _)| slots[*s].clone().expect("validated: computed"))
            .collect();
        Ok(Pending::Deferred(Box::new(DeviceRows {
            rows: cat_rows(parts),
            readback: self.readback,
        })))
    }
}
