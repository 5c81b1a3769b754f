// The browser benchmark: policyport's CPU-wasm and WebGPU act() against onnxruntime-web's wasm and WebGPU
// execution providers on the same ONNX model, at several batch sizes. Results land in `window.bench` for
// tests/scripts/web-bench.sh (headless Chromium) and in the page's table.
import * as ort from "./node_modules/onnxruntime-web/dist/ort.min.mjs";

const params = new URLSearchParams(location.search);
const BATCHES = (params.get("batches") || "1,64,1024").split(",").map(Number);
const SECONDS = Number(params.get("seconds") || 1);
const MODEL = params.get("model") || "mlp64";
// onnxruntime-web's wasm threads (its `numThreads` is global to the page: tests/browser/bench.mjs loads the page a
// second time with ?ortThreads=2&peerOnly=1 to time it next to policyport's threads bundle).
const ORT_THREADS = Number(params.get("ortThreads") || 1);
const PEER_ONLY = params.get("peerOnly") === "1";
const ORT_WASM = ORT_THREADS > 1 ? `onnxruntime-web wasm, ${ORT_THREADS} threads` : "onnxruntime-web wasm";
const bench = (window.bench = { done: false, error: null, rows: [], ratios: [], env: {} });
const $ = (id) => document.getElementById(id);

function inputs(batch, obsLen) {
  // Fixed pseudo-random observations in [-1, 1) (an LCG: the same on every run).
  const x = new Float32Array(batch * obsLen);
  let s = 12345;
  for (let i = 0; i < x.length; i++) { s = (s * 1103515245 + 12345) >>> 0; x[i] = (s / 2 ** 32) * 2 - 1; }
  return x;
}

// Mean µs per call: rounds of `per` calls until SECONDS have passed (at least 5 rounds); the median round.
async function time(call, batch) {
  // Warm up for 300 ms first: V8 compiles wasm with its baseline compiler (Liftoff) and tiers hot functions up to
  // TurboFan in the background; without this, whichever runtime is timed first after a bundle loads is measured
  // partly on baseline code (seen: the first cpu-wasm row 4x slower than the same kernels timed second).
  const warm = performance.now();
  let w = 0;
  while (performance.now() - warm < 300) await call(w++);
  let per = 1;
  for (;;) { // size a round to >= 20 ms so the timer's resolution does not matter
    const t0 = performance.now();
    for (let i = 0; i < per; i++) await call(i);
    if (performance.now() - t0 >= 20 || per >= 1 << 16) break;
    per *= 2;
  }
  const rounds = [];
  const start = performance.now();
  let k = 0;
  while (rounds.length < 5 || performance.now() - start < SECONDS * 1000) {
    const t0 = performance.now();
    for (let i = 0; i < per; i++) await call(k++);
    rounds.push(((performance.now() - t0) * 1000) / per);
    if (rounds.length >= 200) break;
  }
  rounds.sort((a, b) => a - b);
  return rounds[rounds.length >> 1];
}

function addRow(row) {
  bench.rows.push(row);
  const tr = document.createElement("tr");
  for (const v of [row.runtime, row.batch, row.us?.toFixed(1) ?? "–", row.firstMs?.toFixed(2) ?? "–", row.setupMs?.toFixed(0) ?? "–"]) {
    const td = document.createElement("td");
    td.textContent = v;
    tr.appendChild(td);
  }
  if (row.error) tr.title = row.error;
  $("table").tBodies[0].appendChild(tr);
}

// Web Workers started per bundle (the threads bundle lends them to its policies; they live as long as the page).
const workersStarted = {};

async function ours(bundleName, backend, bytes, batch, obsLen, sync, threads = 1) {
  const pp = await import(`./pkg/${bundleName}/policyport_web.js`);
  await pp.default();
  if (threads > 1) {
    workersStarted[bundleName] ??= pp.startThreads(threads - 1);
    await workersStarted[bundleName];
  }
  const t0 = performance.now();
  const policy = await pp.Policy.load(bytes, { backend, threads });
  const setupMs = performance.now() - t0;
  const x = inputs(batch, obsLen);
  const f0 = performance.now();
  await policy.act(x, { seed: 1, step: 0 });
  const firstMs = performance.now() - f0;
  const us = sync
    ? await time((i) => policy.actSync(x, { seed: 1, step: i }), batch)
    : await time((i) => policy.act(x, { seed: 1, step: i }), batch);
  const info = policy.info();
  policy.free();
  return { us, firstMs, setupMs, backend: info.backend };
}

async function peer(ep, modelBytes, batch, obsLen) {
  const t0 = performance.now();
  const session = await ort.InferenceSession.create(modelBytes, { executionProviders: [ep], graphOptimizationLevel: "all" });
  const setupMs = performance.now() - t0;
  const name = session.inputNames[0];
  const feed = { [name]: new ort.Tensor("float32", inputs(batch, obsLen), [batch, obsLen]) };
  const f0 = performance.now();
  await session.run(feed);
  const firstMs = performance.now() - f0;
  // Outputs are read back to the CPU (getData() on GPU tensors), as act() reads its actions back.
  const us = await time(async () => {
    const out = await session.run(feed);
    for (const k of session.outputNames) await out[k].getData?.();
  }, batch);
  await session.release();
  return { us, firstMs, setupMs };
}

async function main() {
  ort.env.wasm.wasmPaths = new URL("./node_modules/onnxruntime-web/dist/", location.href).href;
  ort.env.wasm.numThreads = ORT_THREADS; // 1 by default: policyport's CPU path is one thread unless asked
  const bytes = new Uint8Array(await (await fetch(`./policies/${MODEL}.policy`)).arrayBuffer());
  const modelBytes = new Uint8Array(await (await fetch(`./models/${MODEL}.onnx`)).arrayBuffer());
  const cpu = await import("./pkg/cpu/policyport_web.js");
  await cpu.default();
  const probe = await cpu.Policy.load(bytes, { backend: "cpu" });
  const obsLen = probe.info().obsLen;
  probe.free();
  const adapter = navigator.gpu ? await navigator.gpu.requestAdapter() : null;
  bench.env = {
    userAgent: navigator.userAgent,
    crossOriginIsolated: self.crossOriginIsolated,
    webgpuAdapter: adapter ? (adapter.info?.description || adapter.info?.vendor || "yes") + (adapter.info?.isFallbackAdapter || adapter.isFallbackAdapter ? " (fallback/software)" : "") : null,
  };
  $("status").textContent = `model ${MODEL}; WebGPU adapter: ${bench.env.webgpuAdapter ?? "none"}; cross-origin isolated: ${self.crossOriginIsolated}`;
  const runs = [
    ["policyport cpu-wasm (actSync)", (b) => ours("cpu", "cpu", bytes, b, obsLen, true)],
    ["policyport cpu-wasm (await act)", (b) => ours("cpu", "cpu", bytes, b, obsLen, false)],
    [ORT_WASM, (b) => peer("wasm", modelBytes, b, obsLen)],
  ];
  if (PEER_ONLY) runs.splice(0, 2);
  // The threads bundle (wasm32 +atomics, shared memory): one thread (what the atomics build costs by itself) and
  // two (the caller and one Web Worker; batches under 16 rows stay on the caller). Needs cross-origin isolation.
  if (self.crossOriginIsolated && !PEER_ONLY) {
    runs.push(["policyport cpu-wasm threads bundle, 1 thread (actSync)", (b) => ours("cpu-threads", "cpu", bytes, b, obsLen, true, 1)]);
    runs.push(["policyport cpu-wasm threads bundle, 2 threads (actSync)", (b) => ours("cpu-threads", "cpu", bytes, b, obsLen, true, 2)]);
  }
  // The full (WebGPU) bundle's cpu backend: its crates are built for size (profile web-gpu), the CPU bundle's for
  // speed; `auto` there often picks cpu.
  if (!PEER_ONLY) runs.push(["policyport cpu-wasm, full bundle (await act)", (b) => ours("webgpu", "cpu", bytes, b, obsLen, false)]);
  if (adapter && !PEER_ONLY) {
    runs.push(["policyport webgpu", (b) => ours("webgpu", "webgpu", bytes, b, obsLen, false)]);
    runs.push(["onnxruntime-web webgpu", (b) => peer("webgpu", modelBytes, b, obsLen)]);
  }
  for (const batch of BATCHES) {
    for (const [runtime, fn] of runs) {
      try {
        addRow({ runtime, batch, ...(await fn(batch)) });
      } catch (e) {
        addRow({ runtime, batch, error: String(e?.message || e) });
        console.error(runtime, batch, e);
      }
    }
    const get = (name) => bench.rows.find((r) => r.runtime === name && r.batch === batch)?.us;
    for (const [ours_, peer_] of [
      ["policyport cpu-wasm (actSync)", "onnxruntime-web wasm"],
      ["policyport cpu-wasm (await act)", "onnxruntime-web wasm"],
      ["policyport cpu-wasm threads bundle, 2 threads (actSync)", "onnxruntime-web wasm"],
      ["policyport cpu-wasm threads bundle, 2 threads (actSync)", "policyport cpu-wasm threads bundle, 1 thread (actSync)"],
      ["policyport cpu-wasm threads bundle, 1 thread (actSync)", "policyport cpu-wasm (actSync)"],
      ["policyport webgpu", "onnxruntime-web webgpu"],
      ["policyport webgpu", "onnxruntime-web wasm"],
    ]) {
      const a = get(ours_), b = get(peer_);
      if (a && b) {
        const line = `batch ${String(batch).padStart(5)}: ${peer_} / ${ours_} = ${(b / a).toFixed(2)}x`;
        bench.ratios.push({ batch, ours: ours_, peer: peer_, ratio: b / a });
        $("ratios").textContent += line + "\n";
      }
    }
  }
  bench.done = true;
  $("status").textContent += " — done";
}

main().catch((e) => {
  bench.error = String(e?.stack || e);
  bench.done = true;
  $("status").textContent = bench.error;
});
