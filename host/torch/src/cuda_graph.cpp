// CUDA-graph shim for the libtorch executor (host/src/torch/graph.rs). tch has no binding for
// at::cuda::CUDAGraph, so this wraps the few calls policyport needs behind a C ABI. Every function catches every
// C++ exception and reports it as a message: nothing unwinds into Rust.
//
// Capture protocol (what torch.cuda.graph does): switch the thread's current stream to a side stream from the
// pool, warm up on it, then capture_begin / enqueue work / capture_end, then switch back. Replays are enqueued on
// the current stream of the calling thread.

#include <cstddef>
#include <cstring>
#include <exception>
#include <optional>

#ifndef PP_NO_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#ifdef PP_NO_CUDA
// The libtorch this was built against has no CUDA (or no CUDA headers were found): same ABI, every call fails.
extern "C" {
struct PpGraph;
static void pp_no_cuda(char* err, size_t cap) {
  const char* m = "policyport was built against a libtorch without CUDA (see host/build.rs)";
  if (err && cap) { std::strncpy(err, m, cap - 1); err[cap - 1] = '\0'; }
}
int pp_cuda_device_count() { return 0; }
PpGraph* pp_graph_new(char* err, size_t cap) { pp_no_cuda(err, cap); return nullptr; }
int pp_graph_enter_stream(PpGraph*, int, char* err, size_t cap) { pp_no_cuda(err, cap); return 1; }
int pp_graph_sync_stream(PpGraph*, char* err, size_t cap) { pp_no_cuda(err, cap); return 1; }
int pp_graph_capture_begin(PpGraph*, char* err, size_t cap) { pp_no_cuda(err, cap); return 1; }
int pp_graph_capture_end(PpGraph*, char* err, size_t cap) { pp_no_cuda(err, cap); return 1; }
int pp_graph_leave_stream(PpGraph*, char* err, size_t cap) { pp_no_cuda(err, cap); return 1; }
int pp_graph_replay(PpGraph*, char* err, size_t cap) { pp_no_cuda(err, cap); return 1; }
void pp_graph_free(PpGraph*) {}
}
#else

namespace {

struct PpGraph {
  at::cuda::CUDAGraph graph;
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
  std::optional<c10::cuda::CUDAGuard> device_guard;
};

void set_err(char* err, size_t cap, const char* msg) {
  if (err == nullptr || cap == 0) return;
  std::strncpy(err, msg, cap - 1);
  err[cap - 1] = '\0';
}

template <typename F>
int guarded(char* err, size_t cap, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    set_err(err, cap, e.what());
  } catch (...) {
    set_err(err, cap, "unknown C++ exception");
  }
  return 1;
}

}  // namespace

extern "C" {

int pp_cuda_device_count() {
  try {
    return static_cast<int>(c10::cuda::device_count());
  } catch (...) {
    return 0;
  }
}

PpGraph* pp_graph_new(char* err, size_t cap) {
  PpGraph* g = nullptr;
  guarded(err, cap, [&] { g = new PpGraph(); });
  return g;
}

// Make a pool side stream of `device` current for this thread (until pp_graph_leave_stream).
int pp_graph_enter_stream(PpGraph* g, int device, char* err, size_t cap) {
  return guarded(err, cap, [&] {
    g->device_guard.emplace(static_cast<c10::DeviceIndex>(device));
    auto stream = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
    g->stream_guard.emplace(stream);
  });
}

int pp_graph_sync_stream(PpGraph* g, char* err, size_t cap) {
  return guarded(err, cap, [&] { c10::cuda::getCurrentCUDAStream().synchronize(); });
}

int pp_graph_capture_begin(PpGraph* g, char* err, size_t cap) {
  return guarded(err, cap, [&] { g->graph.capture_begin(); });
}

int pp_graph_capture_end(PpGraph* g, char* err, size_t cap) {
  return guarded(err, cap, [&] { g->graph.capture_end(); });
}

int pp_graph_leave_stream(PpGraph* g, char* err, size_t cap) {
  return guarded(err, cap, [&] {
    g->stream_guard.reset();
    g->device_guard.reset();
  });
}

int pp_graph_replay(PpGraph* g, char* err, size_t cap) {
  return guarded(err, cap, [&] { g->graph.replay(); });
}

void pp_graph_free(PpGraph* g) {
  try {
    delete g;
  } catch (...) {
  }
}

}  // extern "C"
#endif  // PP_NO_CUDA
