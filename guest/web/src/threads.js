// The Web Workers that the threads bundle (web/pkg/cpu-threads: wasm32 with +atomics and shared memory) lends to
// its cpu backend; see guest/src/web_workers.rs for the Rust side.
//
// This file is two things: on the page, `spawnWorkers` (called by startThreads() through the wasm-bindgen glue,
// which imports this file as a snippet); in a worker, the worker's own module script (spawnWorkers starts each
// worker on this very file). A worker instantiates the page's compiled module on the page's shared memory and
// calls workerServe, which lends its thread, has it say it is ready, and serves jobs forever (it blocks, parked
// while idle: a worker may block, the page's main thread may not).

const IN_WORKER = typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope;

// The glue module, relative to this snippet: wasm-bindgen writes snippets to
// <pkg>/snippets/<crate>-<hash>/src/threads.js next to <pkg>/policyport_web.js.
const GLUE = new URL("../../../policyport_web.js", import.meta.url).href;

export function spawnWorkers(module, memory, n) {
  if (!globalThis.crossOriginIsolated) {
    return Promise.reject(new Error(
      "wasm threads need a cross-origin isolated page (served with Cross-Origin-Opener-Policy: same-origin and " +
      "Cross-Origin-Embedder-Policy: require-corp): SharedArrayBuffer is unavailable here"));
  }
  const one = () => new Promise((resolve, reject) => {
    const worker = new Worker(import.meta.url, { type: "module", name: "policyport-cpu" });
    let ready = false;
    worker.onmessage = ({ data }) => {
      if (data.ready) {
        ready = true;
        resolve();
      } else if (data.error && !ready) {
        worker.terminate();
        reject(new Error(`a policyport worker failed to start: ${data.error}`));
      } else if (data.trapped) {
        // A panic in the runtime (a bug): the session that held this worker already got a typed error.
        console.error(`a policyport worker trapped (a bug, please report it): ${data.trapped}`);
      }
    };
    worker.onerror = (e) => {
      if (!ready) reject(new Error(`a policyport worker failed to start: ${e.message || e}`));
    };
    worker.postMessage({ glue: GLUE, module, memory });
  });
  return Promise.all(Array.from({ length: n }, one)).then(() => n);
}

if (IN_WORKER) {
  self.onmessage = async ({ data }) => {
    let pp, ready = false;
    try {
      pp = await import(data.glue);
      await pp.default({ module_or_path: data.module, memory: data.memory });
      // Lends this thread, calls back once it is on the idle list, then serves (blocks) until the page closes.
      pp.workerServe(() => {
        ready = true;
        self.postMessage({ ready: true });
      });
    } catch (e) {
      if (!ready) {
        self.postMessage({ error: String(e?.message || e) });
        return;
      }
      try {
        pp.workerTrapped();
      } catch {
        // The instance is unusable; the session waiting on this worker keeps spinning only if this failed too.
      }
      self.postMessage({ trapped: String(e?.message || e) });
    }
  };
}
