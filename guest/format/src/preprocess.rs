//! The observation's preprocessing, decoded once: validation checks the manifest's `preprocess` steps (tensor
//! names and shapes, a one-hot only of a discrete space and first, positive std, finite factors) and then
//! resolves them here, with their statistics read out of the artifact's tensors, so every executor builds its
//! preprocessing from one list of plain values (the host preprocessor, the wgpu kernel, the libtorch ops) instead
//! of decoding `Preprocess` and looking tensors up by name itself (as [`crate::HeadPlan`] does for the head).

use crate::container::Artifact;
use crate::manifest::Preprocess;

/// One preprocessing step, in the order the manifest lists them.
#[derive(Debug, Clone, PartialEq)]
pub enum PreprocessStep {
    /// `x * factor` elementwise.
    Scale(f32),
    /// `clamp((x - mean) / std, -clip, clip)` per feature; `mean` and `std` hold one number per feature of the
    /// observation at this step (every `std` > 0).
    Normalize {
        mean: Vec<f32>,
        std: Vec<f32>,
        clip: Option<f32>,
    },
    /// A discrete observation (an index) expanded to a one-hot row of this many numbers; only ever first.
    OneHot(usize),
}

/// The observation's preprocessing, resolved from a validated artifact.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PreprocessPlan {
    pub steps: Vec<PreprocessStep>,
}

impl PreprocessPlan {
    /// Resolve `art`'s steps. Only for an artifact whose steps validation accepted (tensors present).
    pub(crate) fn new(art: &Artifact) -> Self {
        let tensor = |name: &String| {
            art.tensors
                .get(name)
                .map(|t| t.data.clone())
                .unwrap_or_default()
        };
        let steps = art
            .manifest
            .preprocess
            .iter()
            .map(|p| match p {
                Preprocess::Scale { factor } => PreprocessStep::Scale(*factor),
                Preprocess::Normalize { mean, std, clip } => PreprocessStep::Normalize {
                    mean: tensor(mean),
                    std: tensor(std),
                    clip: *clip,
                },
                Preprocess::OneHot { n } => PreprocessStep::OneHot(*n),
            })
            .collect();
        PreprocessPlan { steps }
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The width of the one-hot expansion, if the observation is a discrete index expanded by the first step.
    pub fn one_hot_width(&self) -> Option<usize> {
        self.steps.iter().find_map(|s| match s {
            PreprocessStep::OneHot(n) => Some(*n),
            _ => None,
        })
    }

    /// Steps a device can run on the raw observation as uploaded: there are some, and none is a one-hot (the
    /// host expands discrete indices, checking each against the space first).
    pub fn runs_on_device(&self) -> bool {
        !self.steps.is_empty() && self.one_hot_width().is_none()
    }
}
