//! Safe wrapper over the CUDA-graph shim (cuda_graph.cpp, built by host/torch/build.rs against tch's libtorch).

use std::ffi::{c_char, c_int};

use super::TorchError;

#[repr(C)]
struct PpGraph {
    _private: [u8; 0],
}

unsafe extern "C" {
    fn pp_cuda_device_count() -> c_int;
    fn pp_graph_new(err: *mut c_char, cap: usize) -> *mut PpGraph;
    fn pp_graph_enter_stream(g: *mut PpGraph, device: c_int, err: *mut c_char, cap: usize)
    -> c_int;
    fn pp_graph_sync_stream(g: *mut PpGraph, err: *mut c_char, cap: usize) -> c_int;
    fn pp_graph_capture_begin(g: *mut PpGraph, err: *mut c_char, cap: usize) -> c_int;
    fn pp_graph_capture_end(g: *mut PpGraph, err: *mut c_char, cap: usize) -> c_int;
    fn pp_graph_leave_stream(g: *mut PpGraph, err: *mut c_char, cap: usize) -> c_int;
    fn pp_graph_replay(g: *mut PpGraph, err: *mut c_char, cap: usize) -> c_int;
    fn pp_graph_free(g: *mut PpGraph);
}

pub(crate) fn device_count() -> usize {
    // SAFETY: no arguments; the shim catches every exception.
    unsafe { pp_cuda_device_count() }.max(0) as usize
}

fn call(f: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), TorchError> {
    let mut buf = [0u8; 1024];
    if f(buf.as_mut_ptr().cast(), buf.len()) == 0 {
        return Ok(());
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Err(TorchError::Torch(format!(
        "CUDA graph: {}",
        String::from_utf8_lossy(&buf[..end])
    )))
}

/// One captured CUDA graph.
pub(crate) struct CudaGraph {
    ptr: *mut PpGraph,
}

// SAFETY: a CUDAGraph may be replayed from any thread (not concurrently: the owner holds it behind &mut).
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Capture what `work` enqueues. `work` runs three times on a side stream first (warm-up: cuBLAS handles,
    /// workspaces and the caching allocator settle outside the capture, as torch.cuda.graph does), then once
    /// under capture.
    pub(crate) fn capture(
        device: usize,
        mut work: impl FnMut() -> Result<(), TorchError>,
    ) -> Result<Self, TorchError> {
        let mut ptr = std::ptr::null_mut();
        call(|e, c| {
            // SAFETY: a plain constructor: `e` is `call`'s buffer of `c` bytes, where the shim writes at most `c`
            // bytes of message (NUL included); every exception is caught there.
            ptr = unsafe { pp_graph_new(e, c) };
            (ptr.is_null()) as c_int
        })?;
        // Non-null here (a null pointer was an error above): `g` owns it and frees it once, on drop.
        let g = CudaGraph { ptr };
        // SAFETY: `g.ptr` is a live graph owned by `g`; `e`/`c` are `call`'s message buffer (as for `pp_graph_new`).
        call(|e, c| unsafe { pp_graph_enter_stream(g.ptr, device as c_int, e, c) })?;
        let captured = (|| {
            for _ in 0..3 {
                work()?;
            }
            // SAFETY: `g.ptr` is live (owned by `g`); `e`/`c` are `call`'s message buffer.
            call(|e, c| unsafe { pp_graph_sync_stream(g.ptr, e, c) })?;
            // SAFETY: as above.
            call(|e, c| unsafe { pp_graph_capture_begin(g.ptr, e, c) })?;
            let r = work();
            // End the capture even when `work` failed, so the stream leaves capture mode.
            // SAFETY: as above.
            let end = call(|e, c| unsafe { pp_graph_capture_end(g.ptr, e, c) });
            r.and(end)?;
            // SAFETY: as above.
            call(|e, c| unsafe { pp_graph_sync_stream(g.ptr, e, c) })
        })();
        // SAFETY: as above (`g` is still alive: it is returned or dropped below).
        let left = call(|e, c| unsafe { pp_graph_leave_stream(g.ptr, e, c) });
        captured.and(left)?;
        Ok(g)
    }

    pub(crate) fn replay(&mut self) -> Result<(), TorchError> {
        // SAFETY: `self.ptr` is a live, captured graph.
        call(|e, c| unsafe { pp_graph_replay(self.ptr, e, c) })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: owned pointer, freed once.
        unsafe { pp_graph_free(self.ptr) }
    }
}
