//! Observation checks and preprocessing (scale, normalise + clip, one-hot), done on the host side into a
//! reused buffer before upload: cheap, exact, and the same on every backend.

use policyport_format::{ObsDType, ObservationSpace, PreprocessPlan, PreprocessStep};

use crate::error::ObservationError;

/// A batch of raw observations, row-major, `batch x observation.raw_len()` numbers.
#[derive(Debug, Clone, Copy)]
pub enum Observations<'a> {
    F32(&'a [f32]),
    /// Raw bytes, for policies whose observation space is uint8 (image frames).
    U8(&'a [u8]),
}

#[derive(Debug, Clone)]
pub(crate) struct Preprocessor {
    out_len: usize,
    space: ObservationSpace,
    plan: PreprocessPlan,
}

impl Preprocessor {
    pub(crate) fn new(space: &ObservationSpace, plan: &PreprocessPlan, out_len: usize) -> Self {
        Preprocessor {
            out_len,
            space: space.clone(),
            plan: plan.clone(),
        }
    }

    /// Whether f32 observations reach the graph as they are (no preprocessing step: most MLP policies); the session
    /// then only [`Preprocessor::check`]s them and hands the executor the caller's numbers. Why: the copy was ~2 %
    /// of a 1 000-row CartPole act().
    pub(crate) fn passes_through(&self) -> bool {
        self.plan.steps.is_empty()
    }

    /// The checks of [`Preprocessor::run`] alone.
    pub(crate) fn check(
        &self,
        obs: Observations<'_>,
        batch: usize,
    ) -> Result<(), ObservationError> {
        check_observations(&self.space, &self.plan.one_hot_width(), obs, batch)
    }

    /// Check `obs` and write the preprocessed batch into `out` (resized; no allocation once warm).
    pub(crate) fn run(
        &self,
        obs: Observations<'_>,
        batch: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), ObservationError> {
        self.check(obs, batch)?;
        out.clear();
        match obs {
            Observations::F32(x) => out.extend_from_slice(x),
            Observations::U8(x) => out.extend(x.iter().map(|&b| b as f32)),
        }
        for step in &self.plan.steps {
            match step {
                PreprocessStep::Scale(f) => out.iter_mut().for_each(|v| *v *= f),
                PreprocessStep::Normalize { mean, std, clip } => {
                    let n = mean.len();
                    for row in out.chunks_exact_mut(n) {
                        for ((v, m), s) in row.iter_mut().zip(mean).zip(std) {
                            let z = (*v - m) / s;
                            *v = match clip {
                                Some(c) => z.clamp(-c, *c),
                                None => z,
                            };
                        }
                    }
                }
                PreprocessStep::OneHot(n) => {
                    // Discrete spaces have raw_len 1: expand in place from the back.
                    let n = *n;
                    out.resize(batch * n, 0.0);
                    for env in (0..batch).rev() {
                        let k = out[env] as usize;
                        let row = &mut out[env * n..(env + 1) * n];
                        row.iter_mut().for_each(|x| *x = 0.0);
                        row[k] = 1.0;
                    }
                }
            }
        }
        debug_assert_eq!(out.len(), batch * self.out_len);
        Ok(())
    }
}

/// The checks every executor applies to raw observations before preprocessing (on any device): length,
/// element type, finiteness, and for one-hot inputs an integer in range. Executors that preprocess on a device
/// (the libtorch host) call this on the host first, so bad input is a typed error everywhere.
/// The shape of one env's observation as a caller's array holds it after the batch axis: the Box's shape, `[]`
/// for a Discrete observation (one integer; `[1]` is accepted too), the flat `[raw_len]` of a Dict's parts.
pub fn env_shape(space: &ObservationSpace) -> Vec<usize> {
    match space {
        ObservationSpace::Box { shape, .. } => shape.clone(),
        ObservationSpace::Discrete { .. } => vec![],
        ObservationSpace::Dict { .. } => vec![space.raw_len()],
    }
}

/// How a caller's array is laid out relative to the policy's observation (see [`layout_of_shape`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObsLayout {
    /// `[batch, *the policy's shape]`: used as it is.
    AsIs,
    /// `[batch, H, W, C]` frames for a policy that takes `[C, H, W]` ones: transposed on the way in
    /// ([`channels_last_to_first`]), as SB3's `predict` does (`maybe_transpose`).
    ChannelsLast { c: usize, h: usize, w: usize },
}

impl ObsLayout {
    /// `rows` observations in this layout, as the policy takes them (moved through unchanged when `AsIs`).
    pub fn into_policy_layout<T: Copy>(self, data: Vec<T>, rows: usize) -> Vec<T> {
        match self {
            ObsLayout::AsIs => data,
            ObsLayout::ChannelsLast { c, h, w } => channels_last_to_first(&data, rows, c, h, w),
        }
    }
}

/// [`batch_of_shape`], also accepting channels-last frames for a policy whose observation is a channels-first
/// uint8 image `[C, H, W]` (C its smallest axis: SB3's rule for channels-first image spaces, which is what an SB3
/// `CnnPolicy` stores after wrapping a channels-last env in `VecTransposeImage`). What an Atari / gymnasium env
/// returns, `[H, W, C]`, then works where SB3's `predict` takes it. An exact match always wins (square frames with
/// as many channels as rows are read as given).
pub fn layout_of_shape(
    space: &ObservationSpace,
    shape: &[usize],
) -> Result<(usize, ObsLayout), ObservationError> {
    let exact = batch_of_shape(space, shape);
    if let (
        Err(_),
        ObservationSpace::Box {
            shape: s,
            dtype: ObsDType::U8,
        },
    ) = (&exact, space)
        && let [c, h, w] = s[..]
        && c <= h.min(w)
        && shape.len() == 4
        && shape[1..] == [h, w, c]
    {
        return Ok((shape[0], ObsLayout::ChannelsLast { c, h, w }));
    }
    exact.map(|b| (b, ObsLayout::AsIs))
}

/// `batch` frames `[H, W, C]` (row-major) as `[C, H, W]`.
pub fn channels_last_to_first<T: Copy>(
    src: &[T],
    batch: usize,
    c: usize,
    h: usize,
    w: usize,
) -> Vec<T> {
    let frame = c * h * w;
    let mut out = Vec::with_capacity(src.len());
    for b in 0..batch {
        let f = &src[b * frame..(b + 1) * frame];
        for ch in 0..c {
            for y in 0..h {
                for x in 0..w {
                    out.push(f[(y * w + x) * c + ch]);
                }
            }
        }
    }
    out
}

/// The batch of observations whose container carries a shape (a `.npy` header, a NumPy array, the JS API's
/// optional shape), checked in full: `[batch, *env_shape]` or the error names both shapes. Only the count of
/// numbers was checked before, so channels-last frames given to a policy that takes channels-first ones (the
/// same count) were acted on silently (regression test `observations_of_another_shape_are_refused`).
pub fn batch_of_shape(
    space: &ObservationSpace,
    shape: &[usize],
) -> Result<usize, ObservationError> {
    let expected = env_shape(space);
    let fits = match (shape.split_first(), space) {
        (Some((_, rest)), ObservationSpace::Discrete { .. }) => rest.is_empty() || rest == [1],
        (Some((_, rest)), _) => rest == expected.as_slice(),
        (None, _) => false,
    };
    if !fits {
        return Err(ObservationError::Shape {
            found: shape.to_vec(),
            expected,
            layout: match space {
                ObservationSpace::Box { shape, .. } if shape.len() == 3 => {
                    "frames as [channels, height, width] unless the importer says otherwise (policyport inspect)"
                }
                ObservationSpace::Discrete { .. } => "one integer per env",
                ObservationSpace::Dict { .. } => "each env's parts flattened and concatenated",
                _ => "row-major",
            },
        });
    }
    Ok(shape[0])
}

pub fn check_observations(
    space: &ObservationSpace,
    one_hot: &Option<usize>,
    obs: Observations<'_>,
    batch: usize,
) -> Result<(), ObservationError> {
    let raw_len = space.raw_len();
    let found = match obs {
        Observations::F32(x) => x.len(),
        Observations::U8(x) => x.len(),
    };
    if found != batch * raw_len {
        return Err(ObservationError::Length {
            expected: batch * raw_len,
            found,
            batch,
            per_env: raw_len,
        });
    }
    match (obs, space) {
        (Observations::F32(x), _) => {
            if let Some(i) = first_non_finite(x) {
                return Err(ObservationError::NonFinite {
                    env: i / raw_len,
                    element: i % raw_len,
                    value: x[i],
                });
            }
            if let Some(n) = one_hot {
                for (env, v) in x.iter().enumerate() {
                    if v.fract() != 0.0 || *v < 0.0 || *v >= *n as f32 {
                        return Err(ObservationError::Discrete {
                            env,
                            value: *v,
                            n: *n,
                        });
                    }
                }
            }
        }
        (Observations::U8(_), space) if space.raw_dtype() == ObsDType::U8 => {}
        (Observations::U8(_), _) => {
            return Err(ObservationError::DType {
                expected: "f32",
                found: "u8",
            });
        }
    }
    Ok(())
}

/// The index of the first NaN or infinity in `x`. Why not `x.iter().position(|v| !v.is_finite())`: a loop that
/// can exit at any element does not vectorise (about one element per cycle: the observation check alone was
/// ~1.6 % of the benchmark MLP's act() at batch 64), so each chunk of 64 is tested without a branch first (the
/// exponent bits all set: NaN or ±inf), and only a chunk holding a bad value is searched.
pub(crate) fn first_non_finite(x: &[f32]) -> Option<usize> {
    const CHUNK: usize = 64;
    const EXP: u32 = 0x7f80_0000;
    for (c, chunk) in x.chunks(CHUNK).enumerate() {
        let bad = chunk
            .iter()
            .fold(0u32, |a, v| a | ((v.to_bits() & EXP == EXP) as u32));
        if bad != 0 {
            return chunk
                .iter()
                .position(|v| !v.is_finite())
                .map(|i| c * CHUNK + i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::first_non_finite;

    #[test]
    fn first_non_finite_finds_the_first_bad_value_in_any_chunk() {
        assert_eq!(first_non_finite(&[]), None);
        let mut x = vec![1.5f32; 300];
        assert_eq!(first_non_finite(&x), None);
        // Largest finite values and subnormals are finite.
        x[0] = f32::MAX;
        x[1] = -f32::MAX;
        x[2] = f32::from_bits(1);
        assert_eq!(first_non_finite(&x), None);
        for (at, bad) in [
            (299, f32::NAN),
            (64, f32::INFINITY),
            (63, f32::NEG_INFINITY),
            (130, -f32::NAN),
        ] {
            let mut y = x.clone();
            y[at] = bad;
            if at + 1 < y.len() {
                y[at + 1] = bad; // a later one in the same chunk must not win
            }
            assert_eq!(first_non_finite(&y), Some(at), "{bad} at {at}");
        }
        let mut y = x.clone();
        y[200] = f32::NAN;
        y[70] = f32::INFINITY;
        assert_eq!(first_non_finite(&y), Some(70));
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    /// Regression test for what issue 34 caught: an SB3 CnnPolicy's channels-first artifact fed the env's
    /// channels-last frames (the same count of numbers) answered wrong actions silently.
    #[test]
    fn observations_of_another_shape_are_refused() {
        let img = ObservationSpace::Box {
            shape: vec![4, 84, 84],
            dtype: ObsDType::U8,
        };
        assert_eq!(batch_of_shape(&img, &[2, 4, 84, 84]), Ok(2));
        let e = batch_of_shape(&img, &[2, 84, 84, 4]).unwrap_err();
        assert!(
            e.to_string().contains("[2, 84, 84, 4]") && e.to_string().contains("84, 84"),
            "{e}"
        );
        assert!(batch_of_shape(&img, &[2, 4 * 84 * 84]).is_err());
        let vec4 = ObservationSpace::Box {
            shape: vec![4],
            dtype: ObsDType::F32,
        };
        assert_eq!(batch_of_shape(&vec4, &[3, 4]), Ok(3));
        assert!(batch_of_shape(&vec4, &[4]).is_err());
        assert!(batch_of_shape(&vec4, &[3, 2, 2]).is_err());
        let disc = ObservationSpace::Discrete { n: 5 };
        assert_eq!(batch_of_shape(&disc, &[6]), Ok(6));
        assert_eq!(batch_of_shape(&disc, &[6, 1]), Ok(6));
        assert!(batch_of_shape(&disc, &[6, 2]).is_err());
        assert!(batch_of_shape(&disc, &[]).is_err());
        // Channels-last frames are accepted for a channels-first uint8 image, transposed.
        assert_eq!(
            layout_of_shape(&img, &[2, 84, 84, 4]),
            Ok((2, ObsLayout::ChannelsLast { c: 4, h: 84, w: 84 }))
        );
        assert_eq!(
            layout_of_shape(&img, &[2, 4, 84, 84]),
            Ok((2, ObsLayout::AsIs))
        );
        assert!(layout_of_shape(&vec4, &[3, 2, 2]).is_err());
    }

    #[test]
    fn channels_last_frames_transpose_to_channels_first() {
        // 1 frame, H=2, W=3, C=2: value = 100 y + 10 x + c.
        let hwc: Vec<u32> = (0..2)
            .flat_map(|y| (0..3).flat_map(move |x| (0..2).map(move |c| 100 * y + 10 * x + c)))
            .collect();
        let chw = channels_last_to_first(&hwc, 1, 2, 2, 3);
        let want: Vec<u32> = (0..2)
            .flat_map(|c| (0..2).flat_map(move |y| (0..3).map(move |x| 100 * y + 10 * x + c)))
            .collect();
        assert_eq!(chw, want);
    }
}
