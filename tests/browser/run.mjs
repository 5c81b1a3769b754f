// The browser tests: real headless Chromium (Debian's, driven by playwright-core) against `policyport serve-web`.
//
//   node tests/browser/run.mjs <policyport CLI> <output dir>
//
// 0. Every WGSL variant of shaders/ compiles in Chrome's WebGPU (Tint), not only in naga.
// 1. Golden vectors: every fixture of the conformance suite (tests/fixtures/*/policy.onnx, the same list as the
//    Rust suite's `fixture_names()`, and every file a trainer wrote: tests/fixtures/{sb3,rllib,cleanrl}/*),
//    compiled by the CLI with its float64 cases (PyTorch's, or the trainer's module's), passes on cpu (CPU
//    bundle), cpu (full bundle) and webgpu.
// 1b. Action masks (MaskablePPO's masked cases, the trainer's) and full observation shapes through the JS API.
// 2. Native traces: `policyport trace` steps 256 CartPoles / 64 Pendulums natively; the page acts on the same
//    observations with the same seeds and must produce the same actions (discrete: all equal; continuous:
//    within 1e-4) on cpu and webgpu; on cpu the page's own envs (the same Rust code in wasm) must retrace the
//    native CartPole trajectory bit for bit.
// 2b. Wasm threads (the cpu-threads bundle: +atomics, shared memory, Web Workers lent by startThreads): every
//    fixture's actions, values and distribution parameters on 2 threads equal 1 thread's bit for bit (batches 64
//    and 203, three steps: recurrent state too); the native CartPole / Pendulum traces again on 2 threads; how
//    workers are borrowed and given back; the other bundles' typed errors for threads.
// 3. Typed errors through the JS API (bad artifact, bad observations, webgpu in the CPU bundle, a second act()
//    while one is in flight).
// 3b. Recurrent state through the JS API (tests/expected/elman.policy, committed and checked by the Rust suite with
//    its float64 answers): per-env state carried between acts, episode starts, the duplicate-env rule (a
//    PolicyportArgumentError that changes no state), on cpu-wasm and WebGPU.
// 3c. The refusal table (tests/expected/refusals.json, shared with the Rust suite and pytest): every refused call
//    rejects with its kind (e.kind) and changes nothing, on cpu-wasm and WebGPU.
// 4. The demo page runs on cpu and webgpu until episode returns show, replays the pixel + recurrent policy's
//    trainer rollout with the trainer's actions, values and logits, takes a dropped .policy, and is
//    screenshotted into the output dir.
// 5. Without a WebGPU adapter, `auto` falls back to CPU-wasm (and says why) and the demo still runs.
// Exits non-zero on the first failed check; writes browser-results.json (sizes, first-act latency, load times).

import { spawn, execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const require = createRequire(path.join(ROOT, "web/package.json"));
const { chromium } = require("playwright-core");

const [bin, outDir] = process.argv.slice(2);
if (!bin || !outDir) {
  console.error("usage: node tests/browser/run.mjs <policyport CLI> <output dir>");
  process.exit(2);
}
fs.mkdirSync(outDir, { recursive: true });
const results = { checks: [], sizes: JSON.parse(fs.readFileSync(path.join(ROOT, "web/pkg/sizes.json"), "utf8")) };
let failed = 0;
// Each check's time is the wall time since the one before it (what the stage spent getting there), so the
// summary at the end names where the suite's minutes go (the test command's cold-run budget, CONTRIBUTING).
let lastCheckAt = Date.now();
function check(name, ok, detail = "") {
  const now = Date.now();
  results.checks.push({ name, ok, detail, ms: now - lastCheckAt });
  lastCheckAt = now;
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? ` — ${detail}` : ""}`);
  if (!ok) failed++;
}

// ---- the server ----
const server = spawn(bin, ["serve-web", "--port", "0", "--root", path.join(ROOT, "web")], { stdio: ["ignore", "pipe", "inherit"] });
const base = await new Promise((resolve, reject) => {
  let buf = "";
  server.stdout.on("data", (d) => {
    buf += d;
    const m = buf.match(/on (http:\/\/[0-9.:]+)\//);
    if (m) resolve(m[1]);
  });
  server.on("exit", (code) => reject(new Error(`serve-web exited with ${code}`)));
  setTimeout(() => reject(new Error("serve-web did not start in 60 s")), 60000);
});
console.log(`server: ${base}`);

// ---- native traces of the bundled policies ----
const traces = {};
for (const [env, n, steps] of [["cartpole", 256, 60], ["pendulum", 64, 60]]) {
  const bytes = Buffer.from(await (await fetch(`${base}/policies/${env}.policy`)).arrayBuffer());
  const file = path.join(outDir, `${env}.policy`);
  fs.writeFileSync(file, bytes);
  const out = path.join(outDir, `${env}.trace.json`);
  execFileSync(bin, ["trace", file, "--env", env, "--envs", String(n), "--steps", String(steps), "--env-seed", "1", "--policy-seed", "7", "-o", out], { stdio: "inherit" });
  traces[env] = JSON.parse(fs.readFileSync(out, "utf8"));
}
// Catch (the pixel policy): a whole episode of 16 envs natively, returns only (its frames are big); the demo page
// plays the same envs from its own frames.
{
  const file = path.join(outDir, "catch.policy");
  fs.writeFileSync(file, Buffer.from(await (await fetch(`${base}/policies/catch.policy`)).arrayBuffer()));
  const out = path.join(outDir, "catch.trace.json");
  execFileSync(bin, ["trace", file, "--env", "catch", "--envs", "16", "--steps", "200", "--env-seed", "1", "--policy-seed", "7", "--no-obs", "-o", out], { stdio: "inherit" });
  traces.catch = JSON.parse(fs.readFileSync(out, "utf8"));
}

// ---- every fixture of the suite, compiled with its PyTorch float64 golden cases ----
const FIXTURES = path.join(ROOT, "tests/fixtures");
const fixtures = fs.readdirSync(FIXTURES)
  .filter((d) => fs.existsSync(path.join(FIXTURES, d, "policy.onnx")))
  .sort();
if (fixtures.length < 6) throw new Error(`expected the suite's fixtures in ${FIXTURES}, found ${fixtures}`);
// Bytes go to the page as base64 strings (a number array of an 8 MB policy costs seconds per transfer).
const fixtureBytes = {};
// Convolutional fixtures on WebGPU run their first golden case only: SwiftShader emulates the GPU on the CPU, and
// the three cases of IMPALA and NatureCNN took most of the browser stage (CI 496 -> 973 s with them). Every case
// of every fixture still runs on cpu-wasm here and on the same burn-wgpu kernels natively (lavapipe); WebGPU
// still runs every op of every fixture (case 1 is the whole graph, batch 1).
const firstCaseBytes = {};
// What `policyport compile` takes for each fixture: the ONNX fixtures with their spec, and the files the trainers
// wrote (SB3 archives, RLlib checkpoint directories, CleanRL state dicts with their layout), so every route's
// artifacts -- RLlib's SAC (format 1.3's clipped_mean), Dict observations, recurrent and pixel policies -- run
// their golden cases in the browser too.
const compileArgs = {};
for (const name of fixtures) {
  const d = path.join(FIXTURES, name);
  compileArgs[name] = { args: [path.join(d, "policy.onnx"), "--spec", path.join(d, "import.json")], io: path.join(d, "io.json") };
}
const CLEANRL_LAYOUTS = {
  ppo_cartpole: "cleanrl-ppo", ppo_continuous_hopper: "cleanrl-ppo-continuous", ppo_atari_breakout: "cleanrl-atari",
  ppo_atari_lstm: "cleanrl-atari-lstm", sac_actor: "cleanrl-sac",
};
const dirs = (sub) => fs.readdirSync(path.join(FIXTURES, sub)).filter((n) => fs.existsSync(path.join(FIXTURES, sub, n, "io.json"))).sort();
for (const n of dirs("sb3")) {
  const d = path.join(FIXTURES, "sb3", n);
  const vn = path.join(d, "vecnormalize.pkl");
  compileArgs[`sb3/${n}`] = { args: [path.join(d, "model.zip"), ...(fs.existsSync(vn) ? ["--vecnormalize", vn] : [])], io: path.join(d, "io.json") };
}
for (const n of dirs("rllib")) {
  compileArgs[`rllib/${n}`] = { args: [path.join(FIXTURES, "rllib", n, "checkpoint")], io: path.join(FIXTURES, "rllib", n, "io.json") };
}
for (const n of dirs("cleanrl")) {
  const d = path.join(FIXTURES, "cleanrl", n);
  if (!CLEANRL_LAYOUTS[n]) throw new Error(`cleanrl fixture ${n} has no layout in run.mjs's CLEANRL_LAYOUTS`);
  compileArgs[`cleanrl/${n}`] = { args: [path.join(d, "agent.pt"), "--layout", CLEANRL_LAYOUTS[n], "--spaces", path.join(d, "spaces.json")], io: path.join(d, "io.json") };
}
if (Object.keys(compileArgs).length < fixtures.length + 15) throw new Error(`trainer fixtures missing: ${Object.keys(compileArgs)}`);
fixtures.splice(0, fixtures.length, ...Object.keys(compileArgs));
for (const name of fixtures) {
  const { args, io: ioPath } = compileArgs[name];
  const flat = name.replaceAll("/", "-");
  const file = path.join(outDir, `fixture-${flat}.policy`);
  execFileSync(bin, ["compile", ...args, "--golden", ioPath, "-o", file], { stdio: "inherit" });
  fixtureBytes[name] = fs.readFileSync(file).toString("base64");
  const summary = execFileSync(bin, ["inspect", file]).toString();
  if (/^\s+conv2d /m.test(summary)) {
    const io = JSON.parse(fs.readFileSync(ioPath));
    io.cases = io.cases.slice(0, 1);
    const ioFirst = path.join(outDir, `fixture-${flat}.first-case.io.json`);
    fs.writeFileSync(ioFirst, JSON.stringify(io));
    const first = path.join(outDir, `fixture-${flat}.first-case.policy`);
    execFileSync(bin, ["compile", ...args, "--golden", ioFirst, "-o", first], { stdio: "inherit" });
    firstCaseBytes[name] = fs.readFileSync(first).toString("base64");
  }
}

// ---- the browser ----
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage",
  ],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
const page = await context.newPage();
const consoleErrors = [];
page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
page.on("pageerror", (e) => consoleErrors.push(String(e)));

try {
  await page.goto(`${base}/?idle=1`);
  const env = await page.evaluate(async () => {
    const a = navigator.gpu ? await navigator.gpu.requestAdapter() : null;
    return { webgpu: !!a, adapter: a?.info ? `${a.info.vendor} ${a.info.architecture} ${a.info.description}` : null, coi: self.crossOriginIsolated, ua: navigator.userAgent };
  });
  results.browser = env;
  check("WebGPU adapter present (--enable-unsafe-webgpu)", env.webgpu, env.adapter ?? "");
  check("page is cross-origin isolated (precise timers)", env.coi);

  // 0. every WGSL variant through Chrome's own compiler (Tint enforces rules naga does not, e.g. uniformity)
  const wgsl = await page.evaluate(async () => {
    const shaders = await (await fetch("./shaders.json")).json();
    const adapter = await navigator.gpu?.requestAdapter();
    if (!adapter) return { count: shaders.length, errors: ["no adapter"] };
    const device = await adapter.requestDevice();
    const errors = [];
    for (const { name, source } of shaders) {
      const info = await device.createShaderModule({ code: source }).getCompilationInfo();
      for (const m of info.messages) if (m.type === "error") errors.push(`${name} ${m.lineNum}:${m.linePos} ${m.message}`);
    }
    device.destroy();
    return { count: shaders.length, errors };
  });
  check(`every WGSL variant compiles in Chrome (${wgsl.count} variants)`, wgsl.count > 20 && wgsl.errors.length === 0, wgsl.errors.slice(0, 3).join(" | "));

  // 1. golden vectors
  const setups = [["cpu", "cpu"], ["cpu-threads", "cpu"], ["webgpu", "cpu"], ["webgpu", "webgpu"]];
  results.load = [];
  for (const [bundle, backend] of setups) {
    for (const name of fixtures) {
      const firstOnly = backend === "webgpu" && name in firstCaseBytes;
      const started = Date.now();
      const r = await page.evaluate(async ({ bundle, backend, name, b64, firstOnly }) => {
        const pp = await window.demo.loadBundle(bundle);
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        let t0 = performance.now();
        const p = await pp.Policy.load(bytes, { backend });
        let loadMs = performance.now() - t0;
        const reports = await p.verify();
        const info = p.info();
        const x = new Float32Array(info.obsLen);
        let first = info.firstActUs;
        if (!firstOnly) {
          // A second load, timed warm (the first paid for shader compilation).
          t0 = performance.now();
          const p2 = await pp.Policy.load(bytes, { backend });
          loadMs = performance.now() - t0;
          await p2.act(x, { seed: 1, step: 0 });
          first = p2.info().firstActUs;
          p2.free();
        }
        p.free();
        return { reports, backend: info.backend, dispatches: info.dispatchesPerAct, loadMs, firstActUs: first, simd: info.simd128 };
      }, { bundle, backend, name, b64: firstOnly ? firstCaseBytes[name] : fixtureBytes[name], firstOnly });
      const bad = r.reports.filter((c) => !c.passed);
      const worst = Math.max(...r.reports.map((c) => c.maxRelErr));
      check(`golden ${name} on ${backend} (${bundle} bundle)`, r.backend === backend && r.reports.length > 0 && bad.length === 0,
        `${r.reports.length} case${firstOnly ? " (the first)" : "s"}, max rel err ${worst.toExponential(2)}, first act ${(r.firstActUs / 1000).toFixed(2)} ms, load ${r.loadMs.toFixed(0)} ms, check took ${((Date.now() - started) / 1000).toFixed(1)} s` +
        (bad.length ? `; failed: ${JSON.stringify(bad)}` : ""));
      results.load.push({ bundle, backend, name, loadMs: r.loadMs, firstActUs: r.firstActUs, dispatchesPerAct: r.dispatches, simd128: r.simd });
    }
  }

  // 1b. action masks and observation shapes through the JS API (format 1.4): sb3-contrib MaskablePPO's masked
  //     cases (tests/fixtures/sb3/maskable_ppo_*/masks.json, and RLlib's example action-masking module's
  //     tests/fixtures/rllib/ppo_action_masking/masks.json, written by the trainers' scripts) give the masked
  //     Philox draws and argmax on cpu and webgpu; a component allowing nothing and a mismatched `shape` are
  //     typed errors.
  for (const name of ["sb3/maskable_ppo_discrete", "sb3/maskable_ppo_multidiscrete", "rllib/ppo_action_masking"]) {
    const masks = JSON.parse(fs.readFileSync(path.join(FIXTURES, name, "masks.json")));
    for (const [bundle, backend] of [["cpu", "cpu"], ["webgpu", "webgpu"]]) {
      const r = await page.evaluate(async ({ bundle, backend, b64, masks }) => {
        const pp = await window.demo.loadBundle(bundle);
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const p = await pp.Policy.load(bytes, { backend });
        const bad = [];
        for (const c of masks.cases) {
          const mask = new Uint8Array(c.mask);
          const obs = Float32Array.from(c.obs);
          const det = await p.act(obs, { mode: "deterministic", actionMask: mask });
          const smp = await p.act(obs, { seed: c.seed, step: c.step, actionMask: mask });
          if (Array.from(det.actions).join() !== c.deterministic_actions.join()) bad.push(`${c.name} deterministic`);
          if (Array.from(smp.actions).join() !== c.sampled_actions.join()) bad.push(`${c.name} sampled`);
        }
        const errors = [];
        const none = new Uint8Array(masks.cases[0].mask.length);
        try { await p.act(Float32Array.from(masks.cases[0].obs), { actionMask: none }); } catch (e) { errors.push(e.name); }
        try { await p.act(new Float32Array(4), { shape: [2, 2] }); } catch (e) { errors.push(e.name); }
        p.free();
        return { bad, errors };
      }, { bundle, backend, b64: fixtureBytes[name], masks });
      check(`action masks ${name} on ${backend} (${bundle} bundle)`,
        r.bad.length === 0 && r.errors.join() === "PolicyportArgumentError,PolicyportObservationError",
        `${masks.cases.length} masked cases; mismatches: ${r.bad.join(", ") || "none"}; errors: ${r.errors.join(", ")}`);
    }
  }

  // 2. native traces, step by step, same seeds
  for (const [bundle, backend] of [["cpu", "cpu"], ["webgpu", "webgpu"]]) {
    for (const envName of ["cartpole", "pendulum"]) {
      const trace = traces[envName];
      const r = await page.evaluate(async ({ bundle, backend, trace }) => {
        const pp = await window.demo.loadBundle(bundle);
        const bytes = new Uint8Array(await (await fetch(`./policies/${trace.env}.policy`)).arrayBuffer());
        const p = await pp.Policy.load(bytes, { backend, batch: trace.envs });
        let mismatches = 0, maxErr = 0, maxValueErr = 0;
        for (let t = 0; t < trace.steps; t++) {
          const res = await p.act(Float32Array.from(trace.obs[t]), { seed: trace.policy_seed, step: t });
          const want = trace.actions[t];
          for (let i = 0; i < want.length; i++) {
            if (trace.discrete) mismatches += res.actions[i] !== want[i];
            else maxErr = Math.max(maxErr, Math.abs(res.actions[i] - want[i]));
            maxValueErr = Math.max(maxValueErr, Math.abs(res.value[i] - trace.value[t][i]) / Math.max(1, Math.abs(trace.value[t][i])));
          }
        }
        // The page's own envs (guest/envs in wasm) driven by the page's policy: the native trajectory again.
        let obsDiffs = -1;
        if (trace.discrete && backend === "cpu") {
          obsDiffs = 0;
          const env = new pp.VecEnv(trace.env, trace.envs, trace.env_seed);
          for (let t = 0; t < trace.steps; t++) {
            const o = env.observations();
            const want = trace.obs[t];
            for (let i = 0; i < want.length; i++) obsDiffs += o[i] !== Math.fround(want[i]);
            const res = p.actSync(o, { seed: trace.policy_seed, step: t });
            env.step(res.actions);
          }
          env.free();
        }
        p.free();
        return { mismatches, maxErr, maxValueErr, obsDiffs };
      }, { bundle, backend, trace });
      const ok = r.mismatches === 0 && r.maxErr <= 1e-4 && r.maxValueErr <= 1e-4 && r.obsDiffs <= 0;
      check(`native trace ${envName} x ${trace.envs} x ${trace.steps} steps on ${backend}`, ok,
        `action mismatches ${r.mismatches}, max action err ${r.maxErr.toExponential(2)}, max value err ${r.maxValueErr.toExponential(2)}` +
        (r.obsDiffs >= 0 ? `, page-env obs differing from native ${r.obsDiffs}` : ""));
    }
  }

  // 2b. wasm threads
  const threadsCheck = await page.evaluate(async ({ fixtureBytes }) => {
    const tb = await window.demo.loadBundle("cpu-threads");
    const out = { bundle: tb.bundle(), wasmThreads: tb.wasmThreads(), idle: await tb.startThreads(1), fixtures: [] };
    for (const [name, b64] of Object.entries(fixtureBytes)) {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const run = async (threads) => {
        const p = await tb.Policy.load(bytes, { backend: "cpu", threads });
        // Every batch split, whatever the clock measures (the default splits only where that is faster).
        if (threads > 1) p.setThreadSplit("always");
        const info = p.info();
        const got = [];
        for (const batch of [64, 203]) {
          for (let step = 0; step < 3; step++) {
            // 0/1 patterns: valid for every observation space of the suite (Box, Discrete / one-hot indices,
            // MultiBinary, uint8 pixels) and different from row to row.
            const x = new Float32Array(batch * info.obsLen);
            let h = 2166136261 ^ (batch * 31 + step);
            for (let i = 0; i < x.length; i++) { h = Math.imul(h ^ i, 16777619) >>> 0; x[i] = (h >>> 7) & 1; }
            const r = p.actSync(x, { seed: 5, step });
            got.push(Array.from(r.actions), r.value ? Array.from(r.value) : null, Array.from(r.distParams));
          }
        }
        const usedThreads = p.info().threads;
        p.free();
        return { got, usedThreads };
      };
      let one, two, error = null;
      try { one = await run(1); two = await run(2); } catch (e) { error = `${e.name}: ${e.message}`; }
      const same = !error && JSON.stringify(one.got) === JSON.stringify(two.got);
      out.fixtures.push({ name, same, error, threads: two?.usedThreads });
    }
    // Borrowing: one worker started, so one two-thread policy at a time; freeing it gives the worker back.
    const bytes = new Uint8Array(await (await fetch("./policies/cartpole.policy")).arrayBuffer());
    const name = async (f) => { try { await f(); return "no error"; } catch (e) { return `${e.name}: ${e.message}`; } };
    const a = await tb.Policy.load(bytes, { backend: "cpu", threads: 2 });
    const b = await tb.Policy.load(bytes, { backend: "cpu" });
    out.secondBorrow = await name(() => b.setThreads(2));
    out.moreThanIdle = await name(() => tb.Policy.load(bytes, { backend: "cpu", threads: 3 }));
    out.overMax = await name(() => tb.Policy.load(bytes, { backend: "cpu", threads: 257 }));
    out.startOverMax = await name(() => tb.startThreads(257));
    // The internal worker entry points, called on the page's own thread (a hostile or confused caller): typed
    // errors, and no session can borrow the page's thread (it would never run its rows).
    let calledBack = false;
    out.serveOnPage = await name(() => tb.workerServe(() => { calledBack = true; }));
    out.serveOnPageCalledBack = calledBack;
    out.registerExported = typeof tb.workerRegister;
    a.free();
    out.afterFree = await name(() => b.setThreads(2));
    out.bThreads = b.info().threads;
    // The default split, measured with the page's clock (lent by startThreads): whichever way each step takes
    // (the split for the first 16 steps of a batch size, then a probe of the page's thread alone, then the faster
    // of the two), the answers are 1 thread's.
    out.badSplit = await name(() => b.setThreadSplit("sometimes"));
    const c = await tb.Policy.load(bytes, { backend: "cpu" });
    const x = new Float32Array(64 * c.info().obsLen).map((_, i) => ((i * 7919) % 13) / 6.5 - 1);
    const trace = (p) => Array.from({ length: 40 }, (_, step) => Array.from(p.actSync(x, { seed: 9, step }).actions));
    out.measuredSame = JSON.stringify(trace(b)) === JSON.stringify(trace(c));
    c.free();
    b.setThreads(1);
    out.idleAfter = tb.idleWorkers();
    b.free();
    const cpu = await window.demo.loadBundle("cpu");
    out.cpuBundleStart = await name(() => cpu.startThreads(1));
    out.cpuBundleThreads = await name(() => cpu.Policy.load(bytes, { backend: "cpu", threads: 2 }));
    out.cpuWasmThreads = cpu.wasmThreads();
    return out;
  }, { fixtureBytes });
  results.threads = threadsCheck;
  check("threads: the measured split (the default, timed with the page's clock) gives 1 thread's answers over 40 steps", threadsCheck.measuredSame === true, String(threadsCheck.measuredSame));
  check("threads: an unknown thread split is a typed error (PolicyportArgumentError)", threadsCheck.badSplit.startsWith("PolicyportArgumentError"), threadsCheck.badSplit);
  check("cpu-threads bundle: built with wasm threads, 1 Web Worker started", threadsCheck.bundle === "cpu-threads" && threadsCheck.wasmThreads && threadsCheck.idle === 1, JSON.stringify([threadsCheck.bundle, threadsCheck.wasmThreads, threadsCheck.idle]));
  for (const f of threadsCheck.fixtures) {
    check(`threads: ${f.name} on 2 threads = 1 thread, bit for bit (batches 64, 203; 3 steps)`, f.same && f.threads === 2, f.error ?? `threads ${f.threads}`);
  }
  check("threads: a second session cannot borrow the borrowed worker (PolicyportBackendError)", threadsCheck.secondBorrow.startsWith("PolicyportBackendError"), threadsCheck.secondBorrow);
  check("threads: more threads than idle workers -> PolicyportBackendError", threadsCheck.moreThanIdle.startsWith("PolicyportBackendError"), threadsCheck.moreThanIdle);
  check("threads: workerServe on the page's thread -> PolicyportBackendError, nothing lent", threadsCheck.serveOnPage.startsWith("PolicyportBackendError") && !threadsCheck.serveOnPageCalledBack && threadsCheck.registerExported === "undefined", `${threadsCheck.serveOnPage}; called back: ${threadsCheck.serveOnPageCalledBack}; workerRegister: ${threadsCheck.registerExported}`);
  check("threads: over 256 (MAX_THREADS) -> PolicyportArgumentError (load and startThreads)", threadsCheck.overMax.startsWith("PolicyportArgumentError") && threadsCheck.startOverMax.startsWith("PolicyportArgumentError"), `${threadsCheck.overMax} | ${threadsCheck.startOverMax}`);
  check("threads: freeing a policy gives its worker back", threadsCheck.afterFree === "no error" && threadsCheck.bThreads === 2 && threadsCheck.idleAfter === 1, `${threadsCheck.afterFree}; threads ${threadsCheck.bThreads}; idle after setThreads(1): ${threadsCheck.idleAfter}`);
  check("threads in the CPU bundle: startThreads -> PolicyportNotCompiledError, { threads: 2 } -> PolicyportBackendError", !threadsCheck.cpuWasmThreads && threadsCheck.cpuBundleStart.startsWith("PolicyportNotCompiledError") && threadsCheck.cpuBundleThreads.startsWith("PolicyportBackendError"), `${threadsCheck.cpuBundleStart} | ${threadsCheck.cpuBundleThreads}`);
  for (const envName of ["cartpole", "pendulum"]) {
    const trace = traces[envName];
    const r = await page.evaluate(async ({ trace }) => {
      const tb = await window.demo.loadBundle("cpu-threads");
      const bytes = new Uint8Array(await (await fetch(`./policies/${trace.env}.policy`)).arrayBuffer());
      const p = await tb.Policy.load(bytes, { backend: "cpu", threads: 2 });
      let mismatches = 0, maxErr = 0;
      for (let t = 0; t < trace.steps; t++) {
        const res = p.actSync(Float32Array.from(trace.obs[t]), { seed: trace.policy_seed, step: t });
        const want = trace.actions[t];
        for (let i = 0; i < want.length; i++) {
          if (trace.discrete) mismatches += res.actions[i] !== want[i];
          else maxErr = Math.max(maxErr, Math.abs(res.actions[i] - want[i]));
        }
      }
      const threads = p.info().threads;
      p.free();
      return { mismatches, maxErr, threads };
    }, { trace });
    check(`native trace ${envName} x ${trace.envs} x ${trace.steps} steps on 2 wasm threads`, r.threads === 2 && r.mismatches === 0 && r.maxErr <= 1e-4,
      `action mismatches ${r.mismatches}, max action err ${r.maxErr.toExponential(2)}`);
  }

  // 3. typed errors, never a panic
  const errs = await page.evaluate(async () => {
    const out = {};
    const cpu = await window.demo.loadBundle("cpu");
    const full = await window.demo.loadBundle("webgpu");
    const bytes = new Uint8Array(await (await fetch("./policies/cartpole.policy")).arrayBuffer());
    const name = async (f) => { try { await f(); return "no error"; } catch (e) { return `${e.name}: ${e.message}`; } };
    out.garbage = await name(() => cpu.Policy.load(new Uint8Array([1, 2, 3, 4]), { backend: "cpu" }));
    out.truncated = await name(() => cpu.Policy.load(bytes.slice(0, 1000), { backend: "cpu" }));
    out.notCompiled = await name(() => cpu.Policy.load(bytes, { backend: "webgpu" }));
    out.badBackend = await name(() => cpu.Policy.load(bytes, { backend: "tpu" }));
    const p = await cpu.Policy.load(bytes, { backend: "cpu" });
    out.obsLen = await name(() => p.act(new Float32Array(5)));
    out.nan = await name(() => p.act(new Float32Array([0, NaN, 0, 0])));
    out.badMode = await name(() => p.act(new Float32Array(4), { mode: "greedy" }));
    out.badSeed = await name(() => p.act(new Float32Array(4), { seed: -1 }));
    out.stillWorks = (await p.act(new Float32Array(4), { mode: "deterministic" })).actions.length;
    out.badValue = await name(() => p.act(new Float32Array(4), { value: "no" }));
    // { value: false }: no value estimate, the same actions and distribution parameters (bit for bit).
    const sameWithoutValue = async (pol) => {
      const obs = new Float32Array(32).map((_, i) => Math.sin(i) * 0.3);
      const a = await pol.act(obs, { seed: 3, step: 1 });
      const b = await pol.act(obs, { seed: 3, step: 1, value: false });
      const eq = (x, y) => x.length === y.length && x.every((v, i) => Object.is(v, y[i]));
      return a.value instanceof Float32Array && a.value.length === 8 && b.value === null &&
        eq(a.actions, b.actions) && eq(a.distParams, b.distParams);
    };
    out.noValueCpu = await sameWithoutValue(p);
    p.free();
    const g = await full.Policy.load(bytes, { backend: "webgpu" });
    const both = await Promise.allSettled([g.act(new Float32Array(4)), g.act(new Float32Array(4))]);
    out.busy = both.map((s) => (s.status === "fulfilled" ? "ok" : s.reason.name)).join(",");
    out.syncOnGpu = await name(() => g.actSync(new Float32Array(4)));
    out.gpuStillWorks = (await g.act(new Float32Array(8))).actions.length;
    out.noValueGpu = await sameWithoutValue(g);
    const auto = await full.Policy.load(bytes, { backend: "auto", batch: 256 });
    out.autoSelection = auto.info().selection;
    g.free(); auto.free();
    return out;
  });
  results.errors = errs;
  check("bad artifact -> PolicyportArtifactError", errs.garbage.startsWith("PolicyportArtifactError") && errs.truncated.startsWith("PolicyportArtifactError"), `${errs.garbage} | ${errs.truncated}`);
  check("webgpu in the CPU bundle -> PolicyportNotCompiledError", errs.notCompiled.startsWith("PolicyportNotCompiledError"), errs.notCompiled);
  check("bad options -> PolicyportArgumentError", [errs.badBackend, errs.badMode, errs.badSeed].every((e) => e.startsWith("PolicyportArgumentError")), `${errs.badBackend} | ${errs.badMode} | ${errs.badSeed}`);
  check("bad observations -> PolicyportObservationError", errs.obsLen.startsWith("PolicyportObservationError") && errs.nan.startsWith("PolicyportObservationError"), `${errs.obsLen} | ${errs.nan}`);
  check("policy usable after errors", errs.stillWorks === 1 && errs.gpuStillWorks === 2);
  check("{ value: false } -> value null, the same actions and distParams (cpu, webgpu); a non-boolean -> PolicyportArgumentError",
    errs.noValueCpu === true && errs.noValueGpu === true && errs.badValue.startsWith("PolicyportArgumentError"),
    `${errs.noValueCpu} ${errs.noValueGpu} ${errs.badValue}`);
  check("concurrent act() on webgpu -> one PolicyportBusyError", errs.busy === "ok,PolicyportBusyError" || errs.busy === "PolicyportBusyError,ok", errs.busy);
  check("actSync on webgpu -> PolicyportBackendError", errs.syncOnGpu.startsWith("PolicyportBackendError"), errs.syncOnGpu);
  // 3c. The Rust suite's hostile artifacts (bad_input.rs writes them to <target>/hostile/): each load is a rejected
  // promise with a PolicyportArtifactError on both bundles, and a policy loaded before keeps acting. The wasm32
  // memory bomb checks the 32-bit default budget (1 GiB).
  const hostileDir = path.join(path.dirname(path.dirname(path.resolve(bin))), "hostile");
  const hostile = fs.existsSync(hostileDir)
    ? fs.readdirSync(hostileDir).filter((f) => f.endsWith(".policy")).sort()
      .map((f) => [f, fs.readFileSync(path.join(hostileDir, f)).toString("base64")])
    : [];
  check("hostile artifacts from the Rust suite are present", hostile.length >= 8, `${hostile.length} in ${hostileDir}`);
  const hostileResults = await page.evaluate(async (files) => {
    const out = [];
    const good = new Uint8Array(await (await fetch("./policies/cartpole.policy")).arrayBuffer());
    for (const bundleName of ["cpu", "cpu-threads", "webgpu"]) {
      const b = await window.demo.loadBundle(bundleName);
      const keep = await b.Policy.load(good, { backend: "cpu" });
      for (const [file, b64] of files) {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        let got;
        try { const p = await b.Policy.load(bytes, { backend: "cpu" }); p.free(); got = "loaded"; } catch (e) { got = `${e.name}: ${e.message}`; }
        out.push({ bundle: bundleName, file, got });
      }
      out.push({ bundle: bundleName, file: "(the policy loaded before)", got: `acts ${(await keep.act(new Float32Array(8))).actions.length}` });
      keep.free();
    }
    return out;
  }, hostile);
  results.hostile = hostileResults;
  for (const r of hostileResults) {
    const ok = r.file.startsWith("(") ? r.got === "acts 2" : r.got.startsWith("PolicyportArtifactError");
    check(`hostile ${r.file} on the ${r.bundle} bundle -> ${r.file.startsWith("(") ? "still acts" : "PolicyportArtifactError"}`, ok, r.got.slice(0, 160));
  }
  check("auto times cpu and webgpu and says so", /cpu [0-9.]+ us/.test(errs.autoSelection ?? "") && /wgpu [0-9.]+ us/.test(errs.autoSelection ?? ""), errs.autoSelection ?? "null");

  // 3b. recurrent state, episode starts and the duplicate-env rule through the JS API
  const elman = {
    bytes: Array.from(fs.readFileSync(path.join(ROOT, "tests/expected/elman.policy"))),
    steps: JSON.parse(fs.readFileSync(path.join(ROOT, "tests/expected/elman.steps.json"), "utf8")).steps,
  };
  for (const [bundle, backend] of [["cpu", "cpu"], ["webgpu", "webgpu"]]) {
    const r = await page.evaluate(async ({ bundle, backend, elman }) => {
      const pp = await window.demo.loadBundle(bundle);
      const p = await pp.Policy.load(new Uint8Array(elman.bytes), { backend });
      const out = { recurrent: p.info().recurrentStates, worst: 0, compared: 0, duplicate: "no error" };
      for (const [i, s] of elman.steps.entries()) {
        if (i === elman.steps.length - 1) {
          // Before the last step: a batch naming env 2 twice. Refused, and the last step still matches.
          try {
            await p.act(new Float32Array([...s.obs, ...s.obs.slice(0, 3)]), { mode: "deterministic", envIds: new Uint32Array([2, 0, 2]) });
          } catch (e) { out.duplicate = `${e.name}: ${e.message}`; }
        }
        const res = await p.act(new Float32Array(s.obs), { mode: "deterministic", envIds: new Uint32Array(s.envIds), episodeStarts: new Uint8Array(s.episodeStarts) });
        const scale = Math.max(1e-12, ...s.logits.map(Math.abs));
        if (res.distParams.length !== s.logits.length) return { ...out, error: `step ${i}: ${res.distParams.length} params, want ${s.logits.length}` };
        s.logits.forEach((v, k) => { out.worst = Math.max(out.worst, Math.abs(res.distParams[k] - v) / scale); out.compared++; });
      }
      p.free();
      return out;
    }, { bundle, backend, elman });
    check(`recurrent state + episode starts on ${backend} match float64 (${elman.steps.length} steps)`,
      !r.error && r.recurrent === 1 && r.compared === elman.steps.length * 4 && r.worst <= 1e-5,
      r.error ?? `max rel err ${r.worst.toExponential(2)}, ${r.compared} logits`);
    check(`a recurrent batch naming one env twice on ${backend} -> PolicyportArgumentError, state unchanged`,
      r.duplicate.startsWith("PolicyportArgumentError") && r.duplicate.includes("env 2 appears twice"), r.duplicate);
  }

  // 3c. The refusal table (tests/expected/refusals.json), driven through Session, the C ABI and the plugin by the
  // Rust suite and through Python by pytest: each refused call rejects with its kind (e.kind, the core's ErrorKind
  // name) and changes nothing, so the next good call equals, bit for bit, a policy that saw none.
  const refusals = JSON.parse(fs.readFileSync(path.join(ROOT, "tests/expected/refusals.json"), "utf8"));
  for (const [bundle, backend] of [["cpu", "cpu"], ["webgpu", "webgpu"]]) {
    const r = await page.evaluate(async ({ bundle, backend, elman, refusals }) => {
      const pp = await window.demo.loadBundle(bundle);
      const bad = [];
      for (const l of refusals.load) {
        try { await pp.Policy.load(new TextEncoder().encode(l.bytes), { backend }); bad.push(`${l.name}: loaded`); }
        catch (e) { if (e.kind !== l.kind) bad.push(`${l.name}: ${e.name} kind ${e.kind}, want ${l.kind}`); }
      }
      const good = (p, g) => p.act(new Float32Array(g.obs), { mode: "deterministic", envIds: new Uint32Array(g.env_ids) })
        .then((res) => Array.from(new Uint32Array(Float32Array.from(res.distParams).buffer)));
      const control = await pp.Policy.load(new Uint8Array(elman.bytes), { backend });
      await good(control, refusals.good[0]);
      const want = await good(control, refusals.good[1]);
      control.free();
      const p = await pp.Policy.load(new Uint8Array(elman.bytes), { backend });
      await good(p, refusals.good[0]);
      let ran = 0;
      for (const c of refusals.cases) {
        if ((c.not_in ?? []).includes("js")) continue;
        const opts = { mode: "deterministic" };
        if (c.env_ids) opts.envIds = new Uint32Array(c.env_ids);
        if (c.episode_starts) opts.episodeStarts = new Uint8Array(c.episode_starts);
        if (c.action_mask) opts.actionMask = new Uint8Array(c.action_mask);
        if (c.epsilon !== undefined) opts.epsilon = c.epsilon;
        try {
          await p.act(new Float32Array(c.obs.map((v) => (v === null ? NaN : v))), opts);
          bad.push(`${c.name}: accepted`);
        } catch (e) { if (e.kind !== c.kind) bad.push(`${c.name}: ${e.name} kind ${e.kind}, want ${c.kind} (${e.message})`); }
        ran++;
      }
      const got = await good(p, refusals.good[1]);
      if (got.join() !== want.join()) bad.push(`the next good call differs: ${got} vs ${want}`);
      p.free();
      return { bad, ran };
    }, { bundle, backend, elman, refusals });
    check(`the refusal table on ${backend}: ${r.ran} refused calls report their kinds and change nothing`,
      r.bad.length === 0 && r.ran === refusals.cases.length, r.bad.join("; ") || `${r.ran} cases`);
  }

  // 4. the demo page
  results.demo = [];
  for (const [backend, envName, minEpisodes] of [["cpu", "cartpole", 1], ["webgpu", "pendulum", 1], ["auto", "cartpole", 1]]) {
    await page.goto(`${base}/?backend=${backend}&env=${envName}`);
    await page.waitForFunction((k) => window.demo.error || window.demo.episodes >= k, minEpisodes, { timeout: 240000 });
    await page.waitForTimeout(1500); // let the charts fill
    const d = await page.evaluate(() => ({
      error: window.demo.error, episodes: window.demo.episodes, meanReturn: window.demo.meanReturn, ticks: window.demo.ticks,
      backend: window.demo.info?.backend, bundle: window.demo.bundle, selection: window.demo.info?.selection,
      latencyMs: [...window.demo.latencies].sort((a, b) => a - b)[window.demo.latencies.length >> 1], firstActMs: window.demo.firstActMs,
      shown: document.getElementById("s-ret").textContent,
    }));
    results.demo.push({ backend, envName, ...d });
    const shot = path.join(outDir, `demo-${envName}-${backend}.png`);
    await page.screenshot({ path: shot });
    const goodReturn = envName === "cartpole" ? d.meanReturn >= 195 : d.meanReturn >= -400;
    check(`demo ${envName} on ${backend}`, !d.error && d.episodes >= minEpisodes && d.shown !== "–" && goodReturn && (backend === "auto" || d.backend === backend),
      d.error ?? `${d.episodes} episodes, mean return ${d.meanReturn?.toFixed(1)} (shown "${d.shown}"), ${d.ticks} ticks, act ${d.latencyMs?.toFixed(3)} ms median on ${d.backend} (${d.bundle} bundle), screenshot ${path.basename(shot)}`);
  }

  // the pixel policy playing Catch (a CNN trained by PPO on the game's uint8 RGB frames) from the frames the page's
  // own env renders and draws: on cpu its first 16 episodes are the native run's, return for return (the same Rust
  // env and kernels in wasm); on webgpu the game is played as well (its float sums differ, so a sampled action may)
  {
    const want = traces.catch.finished_returns;
    for (const backend of ["cpu", "webgpu"]) {
      await page.goto(`${base}/?backend=${backend}&env=catch&n=16&fast=1`);
      await page.waitForFunction(() => window.demo.error || window.demo.episodes >= 16, null, { timeout: 240000 });
      const d = await page.evaluate(() => ({
        error: window.demo.error, returns: window.demo.returns.slice(0, 16), backend: window.demo.info?.backend,
        bundle: window.demo.bundle, ticks: window.demo.ticks,
        latencyMs: [...window.demo.latencies].sort((a, b) => a - b)[window.demo.latencies.length >> 1],
      }));
      const shot = path.join(outDir, `demo-catch-${backend}.png`);
      await page.screenshot({ path: shot });
      const same = d.returns.filter((v, i) => v === want[i]).length;
      const mean = d.returns.reduce((a, b) => a + b, 0) / Math.max(1, d.returns.length);
      results.demo.push({ backend, envName: "catch", same, mean, ...d });
      check(`demo catch (a CNN on the env's own frames) on ${backend}`,
        !d.error && d.backend === backend && want.length === 16 && d.returns.length === 16 && mean >= 30 &&
          (backend !== "cpu" || same === 16),
        d.error ?? `16 episodes, mean return ${mean.toFixed(2)} (perfect 38), ${same}/16 returns as the native ` +
          `run's, act ${d.latencyMs?.toFixed(3)} ms median on ${d.backend} (${d.bundle} bundle), screenshot ${path.basename(shot)}`);
    }
  }

  // the pixel + recurrent policy (SB3 RecurrentPPO CnnLstm on uint8 RGB frames): its trainer's rollout replayed
  // twice (the second pass starts episodes again, so per-env state must restart), every deterministic action the
  // trainer's, values and logits within the rollout's tolerance (relative to each step's largest number)
  for (const backend of ["cpu", "webgpu"]) {
    await page.goto(`${base}/?backend=${backend}&env=frames&fast=1`);
    await page.waitForFunction(() => window.demo.error || window.demo.replay?.loops >= 2, null, { timeout: 240000 });
    const d = await page.evaluate(() => ({ error: window.demo.error, backend: window.demo.info?.backend, ...window.demo.replay }));
    results.demo.push({ backend, envName: "frames", ...d });
    const shot = path.join(outDir, `demo-frames-${backend}.png`);
    await page.screenshot({ path: shot });
    const played = d.envs * d.played;
    check(`demo frames (SB3 CnnLstm, the trainer's rollout) on ${backend}: actions, values and logits as the trainer's`,
      !d.error && d.backend === backend && d.loops >= 2 && d.actionMatches === played && d.actionMismatches === 0 &&
        d.maxValueErr <= d.tolerance && d.maxLogitErr <= d.tolerance,
      d.error ?? `${d.played} steps x ${d.envs} envs over ${d.loops} passes: ${d.actionMatches} actions as the trainer's, ` +
        `${d.actionMismatches} not; max rel. error value ${d.maxValueErr?.toExponential(2)}, logits ` +
        `${d.maxLogitErr?.toExponential(2)} (tolerance ${d.tolerance}); screenshot ${path.basename(shot)}`);
  }

  // drag-and-drop of a user's .policy onto a running CartPole demo: the page switches to Pendulum
  await page.goto(`${base}/?backend=cpu&env=cartpole`);
  await page.waitForFunction(() => window.demo.ready, null, { timeout: 60000 });
  const dropped = fs.readFileSync(path.join(outDir, "pendulum.policy")).toString("base64");
  const dt = await page.evaluateHandle((b64) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const d = new DataTransfer();
    d.items.add(new File([bytes], "my-pendulum.policy"));
    return d;
  }, dropped);
  await page.dispatchEvent("#drop", "drop", { dataTransfer: dt });
  await page.waitForFunction(() => window.demo.error || (window.demo.env === "pendulum" && window.demo.ready && window.demo.ticks > 10), null, { timeout: 60000 });
  const afterDrop = await page.evaluate(() => ({ env: window.demo.env, error: window.demo.error, ticks: window.demo.ticks }));
  check("drag-and-drop of a .policy switches the demo", afterDrop.env === "pendulum" && !afterDrop.error, JSON.stringify(afterDrop));
  const junk = await page.evaluateHandle(() => { const d = new DataTransfer(); d.items.add(new File([new Uint8Array([9, 9, 9])], "junk.policy")); return d; });
  await page.dispatchEvent("#drop", "drop", { dataTransfer: junk });
  await page.waitForFunction(() => window.demo.error, null, { timeout: 30000 });
  const junkErr = await page.evaluate(() => window.demo.error);
  check("a dropped bad file shows a typed error", junkErr.startsWith("PolicyportArtifactError"), junkErr);

  // 5. A browser without a WebGPU adapter (no --enable-unsafe-webgpu): auto falls back to CPU-wasm and says
  // why, webgpu is a typed error, the demo runs on cpu.
  const plain = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync",
      "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"],
  });
  try {
    const p2 = await plain.newPage();
    await p2.goto(`${base}/?idle=1`);
    const nogpu = await p2.evaluate(async () => {
      const out = { adapter: navigator.gpu ? !!(await navigator.gpu.requestAdapter()) : false };
      const full = await window.demo.loadBundle("webgpu");
      const bytes = new Uint8Array(await (await fetch("./policies/cartpole.policy")).arrayBuffer());
      const p = await full.Policy.load(bytes, { backend: "auto", batch: 64 });
      out.selection = p.info().selection;
      out.backend = p.info().backend;
      out.actions = (await p.act(new Float32Array(4))).actions.length;
      p.free();
      try { await full.Policy.load(bytes, { backend: "webgpu" }); out.webgpu = "loaded"; } catch (e) { out.webgpu = e.name; }
      return out;
    });
    check("no WebGPU adapter: auto falls back to cpu and says why; webgpu is a typed error",
      !nogpu.adapter && nogpu.backend === "cpu" && /wgpu: unavailable/.test(nogpu.selection) && nogpu.actions === 1 && nogpu.webgpu === "PolicyportBackendError",
      `${nogpu.selection} | webgpu: ${nogpu.webgpu}`);
    await p2.goto(`${base}/?backend=auto&env=cartpole`);
    await p2.waitForFunction(() => window.demo.error || window.demo.ticks > 20, null, { timeout: 60000 });
    const d = await p2.evaluate(() => ({ error: window.demo.error, backend: window.demo.info?.backend, bundle: window.demo.bundle }));
    check("no WebGPU adapter: the demo runs on auto -> cpu (small bundle)", !d.error && d.backend === "cpu" && d.bundle === "cpu", JSON.stringify(d));
  } finally {
    await plain.close();
  }

  // 6. The npm package as a user installs it (tests/scripts/npm-pack.sh: packed, installed from the tarball into a
  //    consumer project, its main.ts type-checked by TypeScript against the shipped .d.ts): the consumer page,
  //    served from its own root, imports each entry point by the package's name and must act as the native CLI
  //    does on the same observations and seed (discrete actions equal, values within 1e-5).
  const consumerDir = process.env.POLICYPORT_NPM_CONSUMER;
  if (!consumerDir) {
    console.log("skip the npm package's consumer page: POLICYPORT_NPM_CONSUMER is not set (test.sh sets it after tests/scripts/npm-pack.sh)");
  } else if (!fs.existsSync(path.join(consumerDir, "index.html")) || !fs.existsSync(path.join(consumerDir, "main.js"))) {
    check("npm package: the consumer project is there", false, `${consumerDir} has no index.html / main.js (tests/scripts/npm-pack.sh failed or did not run)`);
  } else {
    fs.copyFileSync(path.join(outDir, "cartpole.policy"), path.join(consumerDir, "cartpole.policy"));
    const rows = Array.from({ length: 37 }, (_, i) => [0.05 * Math.sin(i), 0.3 * Math.cos(3 * i), 0.04 * Math.sin(7 * i), 0.5 * Math.cos(i)]);
    fs.writeFileSync(path.join(consumerDir, "obs.json"), JSON.stringify(rows));
    const native = JSON.parse(execFileSync(bin, ["run", path.join(consumerDir, "cartpole.policy"), "--obs", path.join(consumerDir, "obs.json"), "--seed", "7"], { encoding: "utf8" }));
    const consumerServer = spawn(bin, ["serve-web", "--port", "0", "--root", consumerDir], { stdio: ["ignore", "pipe", "inherit"] });
    try {
      const consumerBase = await new Promise((resolve, reject) => {
        let buf = "";
        consumerServer.stdout.on("data", (d) => {
          buf += d;
          const m = buf.match(/on (http:\/\/[0-9.:]+)\//);
          if (m) resolve(m[1]);
        });
        consumerServer.on("exit", (code) => reject(new Error(`serve-web (consumer) exited with ${code}`)));
        setTimeout(() => reject(new Error("serve-web (consumer) did not start in 60 s")), 60000);
      });
      const cp = await context.newPage();
      const cpErrors = [];
      cp.on("pageerror", (e) => cpErrors.push(String(e)));
      cp.on("console", (m) => { if (m.type() === "error") cpErrors.push(m.text()); });
      await cp.goto(`${consumerBase}/index.html`);
      await cp.waitForFunction(() => window.consumer?.done, null, { timeout: 120000 });
      const c = await cp.evaluate(() => window.consumer);
      check("npm package: the consumer page ran (import map from the package's exports, main.ts compiled by tsc), no console errors", !c.error && c.results.length === 3 && cpErrors.length === 0, c.error ?? (cpErrors.length ? `console errors: ${cpErrors.slice(0, 2).join(" | ")}` : ""));
      const want = { "policyport/cpu": ["cpu", "cpu"], "policyport/cpu-threads": ["cpu-threads", "cpu"], "policyport/webgpu": ["webgpu", "webgpu"] };
      for (const r of c.results) {
        const [bundle, backend] = want[r.entry] ?? [];
        const same = !r.error && r.bundle === bundle && r.backend === backend && r.actions.length === native.actions.length &&
          r.actions.every((a, i) => a === native.actions[i]) &&
          (native.value.length === 0 ? r.value === null :
            r.value?.length === native.value.length && r.value.every((v, i) => Math.abs(v - native.value[i]) <= 1e-5 * Math.max(1, Math.abs(native.value[i]))));
        check(`npm package: ${r.entry} (installed from the tarball) acts as the native CLI does (37 rows, seed 7)`, same,
          r.error ?? `${r.bundle}/${r.backend}: ${r.actions.slice(0, 8)} vs native ${native.actions.slice(0, 8)}`);
      }
      await cp.close();
    } finally {
      consumerServer.kill();
    }
  }

  check("no uncaught errors in the page", consoleErrors.filter((e) => !/favicon/.test(e)).length === 0, consoleErrors.slice(0, 3).join(" | "));
} catch (e) {
  check("browser tests ran to the end", false, String(e?.stack || e));
} finally {
  fs.writeFileSync(path.join(outDir, "browser-results.json"), JSON.stringify(results, null, 1));
  await browser.close();
  server.kill();
}
const slowest = [...results.checks].sort((a, b) => b.ms - a.ms).slice(0, 10);
const totalMs = results.checks.reduce((t, c) => t + c.ms, 0);
console.log(`the ten slowest checks (wall time since the check before; ${(totalMs / 1000).toFixed(0)} s in all):`);
for (const c of slowest) console.log(`  ${(c.ms / 1000).toFixed(1).padStart(6)} s  ${c.name.slice(0, 110)}`);
console.log(`browser tests: ${results.checks.length - failed} passed, ${failed} failed (results and screenshots in ${outDir})`);
process.exit(failed ? 1 : 0);
