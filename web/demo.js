// The browser demo: many environments (the Rust envs of guest/envs, compiled into the bundle) stepped by one
// batched act() per tick, a backend switch, live latency / throughput / returns charts, drag-and-drop of a
// user's own .policy. State is mirrored on `window.demo` for the headless tests (tests/browser/run.mjs).
//
// Query parameters: env=cartpole|pendulum|catch|frames, backend=auto|cpu|webgpu, n=<envs>, seed=<policy seed>,
// idle=1 (load nothing: the tests drive the bundles themselves), fast=1 (replay without pauses: the tests).
//
// env=catch is the pixel policy playing: a small CNN trained by PPO (tests/fixtures/generate.py) on Catch's uint8
// RGB frames, acting on the frames the env renders (guest/envs, in the bundle) — the same frames drawn here.
//
// env=frames is the pixel + recurrent policy: sb3-contrib RecurrentPPO's CnnLstmPolicy (NatureCNN on uint8 RGB
// frames, then an LSTM with state per env) replaying its trainer's own rollout (two envs, episode boundaries
// included) with deterministic actions, each step's actions, values and logits compared with the trainer's.

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const ENVS = {
  cartpole: { n: 256, obsLen: 4, title: "CartPole-v1" },
  pendulum: { n: 64, obsLen: 3, title: "Pendulum-v1" },
  // tickMs: paced so a person can follow the balls (fast=1 steps as fast as act() allows).
  catch: { n: 64, obsLen: 16 * 16 * 3, title: "Catch (a CNN on the game's 16×16 RGB frames)", frame: [16, 16, 3], tickMs: 60 },
  frames: { replay: "sb3_cnn_lstm", title: "SB3 RecurrentPPO CnnLstm on frames (the trainer's rollout)" },
};

const demo = (window.demo = {
  ready: false,
  error: null,
  env: params.get("env") || "cartpole",
  backendChoice: params.get("backend") || "auto",
  n: 0,
  ticks: 0,
  envSteps: 0,
  episodes: 0,
  returns: [],
  meanReturn: null,
  latencies: [],
  firstActMs: null,
  info: null,
  bundle: null,
  paused: false,
  // env=frames: the replay's agreement with the trainer, counted over every step played.
  replay: null,
});

// ---- bundles: the small CPU-only one, or the full one with WebGPU (loaded once each, on demand) ----
const bundles = {};
async function loadBundle(name) {
  if (!bundles[name]) {
    bundles[name] = (async () => {
      const m = await import(`./pkg/${name}/policyport_web.js`);
      await m.default();
      return m;
    })();
  }
  return bundles[name];
}

async function bundleFor(choice) {
  if (choice === "cpu") return ["cpu", await loadBundle("cpu")];
  // No WebGPU adapter: auto can only pick cpu, so skip the 4.5 MB full bundle.
  if (choice === "auto" && !(navigator.gpu && (await navigator.gpu.requestAdapter()))) return ["cpu", await loadBundle("cpu")];
  try {
    return ["webgpu", await loadBundle("webgpu")];
  } catch (e) {
    if (choice === "webgpu") throw e;
    console.warn("full bundle unavailable, using the CPU bundle:", e);
    return ["cpu", await loadBundle("cpu")];
  }
}

// ---- one run: a policy + a VecEnv, stepped until replaced ----
let run = null;
let userPolicyBytes = null;

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function start() {
  const myRun = (run = { id: Symbol(), stopped: false });
  demo.ready = false;
  demo.error = null;
  try {
    const envName = demo.env;
    const spec = ENVS[envName];
    if (spec.replay) return await replay(myRun, spec);
    const n = Number(params.get("n")) || spec.n;
    setStatus(`loading ${spec.title} × ${n} on ${demo.backendChoice}…`);
    const [bundleName, pp] = await bundleFor(demo.backendChoice);
    const bytes = userPolicyBytes ?? new Uint8Array(await (await fetch(`./policies/${envName}.policy`)).arrayBuffer());
    const policy = await pp.Policy.load(bytes, { backend: demo.backendChoice, batch: n });
    const info = policy.info();
    if (info.obsLen !== spec.obsLen) {
      throw new Error(`this policy takes ${info.obsLen} observations; ${spec.title} gives ${spec.obsLen}`);
    }
    if (myRun !== run) { policy.free(); return; }
    const env = new pp.VecEnv(envName, n, 1);
    Object.assign(demo, {
      n, ticks: 0, envSteps: 0, episodes: 0, returns: [], meanReturn: null, latencies: [],
      firstActMs: null, info, bundle: bundleName,
    });
    myRun.policy = policy;
    myRun.env = env;
    myRun.envName = envName;
    $("info").textContent = JSON.stringify(info, null, 1);
    setStatus(`${info.name} on ${info.backend} (${bundleName} bundle, loaded in ${info.loadMs.toFixed(0)} ms)` +
      (info.selection ? ` — ${info.selection}` : ""));
    demo.ready = true;
    const seed = BigInt(params.get("seed") || 7);
    const rate = { t0: performance.now(), steps: 0 };
    while (myRun === run) {
      if (demo.paused) { await sleep(50); continue; }
      const obs = env.observations();
      const t0 = performance.now();
      const res = await policy.act(obs, { seed, step: BigInt(demo.ticks) });
      const ms = performance.now() - t0;
      if (myRun !== run) break;
      if (demo.firstActMs === null) demo.firstActMs = ms;
      const finished = env.step(res.actions);
      myRun.lastActions = res.actions;
      demo.ticks++;
      demo.envSteps += n;
      demo.latencies.push(ms);
      if (demo.latencies.length > 100) demo.latencies.shift();
      for (const r of finished) demo.returns.push(r);
      demo.episodes = demo.returns.length;
      const last = demo.returns.slice(-100);
      demo.meanReturn = last.length ? last.reduce((a, b) => a + b, 0) / last.length : null;
      rate.steps += n;
      const now = performance.now();
      if (now - rate.t0 > 500) {
        history.push({ lat: median(demo.latencies), sps: (rate.steps * 1000) / (now - rate.t0) });
        if (history.length > 240) history.shift();
        rate.t0 = now;
        rate.steps = 0;
      }
      if (spec.tickMs && params.get("fast") !== "1") await sleep(Math.max(0, spec.tickMs - (performance.now() - t0)));
      else await yieldToBrowser();
    }
    policy.free();
    env.free();
  } catch (e) {
    console.error(e);
    demo.error = `${e.name || "Error"}: ${e.message || e}`;
    setStatus(demo.error, true);
  }
}

// ---- env=frames: a pixel + recurrent policy replaying its trainer's rollout ----
async function replay(myRun, spec) {
  setStatus(`loading ${spec.title} on ${demo.backendChoice}…`);
  const [bundleName, pp] = await bundleFor(demo.backendChoice);
  const [bytes, rollout] = await Promise.all([
    fetch(`./policies/${spec.replay}.policy`).then((r) => r.arrayBuffer()).then((b) => new Uint8Array(b)),
    fetch(`./replays/${spec.replay}.json`).then((r) => r.json()),
  ]);
  const envs = rollout.envs;
  const policy = await pp.Policy.load(bytes, { backend: demo.backendChoice, batch: envs, numEnvs: envs });
  const info = policy.info();
  const steps = rollout.steps.map((s) => ({
    obs: Uint8Array.from(s.obs),
    starts: Uint8Array.from(s.episode_starts, Number),
    actions: s.trainer_actions,
    value: s.expected.value,
    logits: s.expected.logits,
  }));
  if (steps[0].obs.length !== envs * info.obsLen) {
    throw new Error(`the rollout has ${steps[0].obs.length / envs} numbers per frame; ${info.name} takes ${info.obsLen}`);
  }
  if (myRun !== run) { policy.free(); return; }
  const r = (demo.replay = {
    envs, steps: steps.length, loops: 0, played: 0, actionMatches: 0, actionMismatches: 0,
    maxValueErr: 0, maxLogitErr: 0, tolerance: rollout.tolerance,
  });
  Object.assign(demo, { n: envs, ticks: 0, envSteps: 0, episodes: 0, returns: [], meanReturn: null, latencies: [],
    firstActMs: null, info, bundle: bundleName });
  myRun.replay = { shape: info.observation.shape, envs, frame: null };
  $("info").textContent = JSON.stringify(info, null, 1);
  setStatus(`${info.name} on ${info.backend} (${bundleName} bundle, loaded in ${info.loadMs.toFixed(0)} ms): ` +
    `replaying the trainer's ${steps.length} steps × ${envs} envs, deterministic actions`);
  demo.ready = true;
  // Error relative to the step's largest trainer number, as the Rust and C tests measure it.
  const relErr = (got, want) => {
    const scale = want.reduce((m, v) => Math.max(m, Math.abs(v)), 1e-12);
    return want.reduce((m, w, i) => Math.max(m, Math.abs(got[i] - w) / scale), 0);
  };
  const fast = params.get("fast") === "1";
  while (myRun === run) {
    for (const s of steps) {
      while (demo.paused && myRun === run) await sleep(50);
      if (myRun !== run) break;
      const t0 = performance.now();
      const res = await policy.act(s.obs, { mode: "deterministic", episodeStarts: s.starts });
      const ms = performance.now() - t0;
      if (myRun !== run) break;
      if (demo.firstActMs === null) demo.firstActMs = ms;
      demo.latencies.push(ms);
      if (demo.latencies.length > 100) demo.latencies.shift();
      for (let i = 0; i < envs; i++) res.actions[i] === s.actions[i] ? r.actionMatches++ : r.actionMismatches++;
      r.maxValueErr = Math.max(r.maxValueErr, relErr(res.value, s.value));
      r.maxLogitErr = Math.max(r.maxLogitErr, relErr(res.distParams, s.logits));
      r.played++;
      demo.ticks++;
      demo.envSteps += envs;
      myRun.replay.frame = { step: s, ours: Array.from(res.actions), value: Array.from(res.value) };
      await (fast ? yieldToBrowser() : sleep(400));
    }
    r.loops++;
  }
  policy.free();
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// A macrotask yield without setTimeout's 4 ms clamp, so rendering and input keep up between ticks.
const channel = new MessageChannel();
const waiting = [];
channel.port1.onmessage = () => waiting.shift()?.();
function yieldToBrowser() {
  return new Promise((r) => { waiting.push(r); channel.port2.postMessage(0); });
}
function median(xs) {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1];
}

// ---- rendering (once per animation frame, independent of the tick rate) ----
const history = [];
function render() {
  requestAnimationFrame(render);
  const r = run;
  if (r?.env && demo.ready) drawWorld(r);
  if (r?.replay?.frame && demo.ready) drawFrames(r.replay);
  $("s-lat").textContent = demo.latencies.length ? median(demo.latencies).toFixed(3) : "–";
  $("s-sps").textContent = history.length ? Math.round(history[history.length - 1].sps).toLocaleString() : "–";
  $("s-ret").textContent = demo.meanReturn === null ? "–" : demo.meanReturn.toFixed(1);
  $("s-eps").textContent = demo.episodes.toLocaleString();
  $("s-steps").textContent = demo.envSteps.toLocaleString();
  $("s-first").textContent = demo.firstActMs === null ? "–" : demo.firstActMs.toFixed(2);
  drawLatencyChart();
  drawReturnsChart();
}

function drawWorld(r) {
  const c = $("world");
  const g = c.getContext("2d");
  g.fillStyle = "#0b1015";
  g.fillRect(0, 0, c.width, c.height);
  if (ENVS[r.envName].frame) return drawPixelEnvs(r, c, g);
  const obs = r.env.observations();
  const steps = r.env.episodeSteps();
  const n = r.env.length;
  const cols = Math.ceil(Math.sqrt(n));
  const cell = c.width / cols;
  for (let i = 0; i < n; i++) {
    const x0 = (i % cols) * cell, y0 = Math.floor(i / cols) * cell;
    g.save();
    g.translate(x0 + cell / 2, y0 + cell / 2);
    if (r.envName === "cartpole") {
      const [x, , theta] = [obs[i * 4], obs[i * 4 + 1], obs[i * 4 + 2]];
      const s = cell / 5.6; // the track is ±2.4 m
      g.strokeStyle = "#2a3644";
      g.beginPath(); g.moveTo(-2.4 * s, cell * 0.25); g.lineTo(2.4 * s, cell * 0.25); g.stroke();
      const cx = x * s, cy = cell * 0.2;
      g.fillStyle = "#8a96a3";
      g.fillRect(cx - cell * 0.09, cy - cell * 0.04, cell * 0.18, cell * 0.08);
      const len = cell * 0.55;
      const age = Math.min(1, steps[i] / 500);
      g.strokeStyle = `hsl(${30 + 110 * age}, 80%, 60%)`;
      g.lineWidth = Math.max(1.5, cell * 0.05);
      g.beginPath(); g.moveTo(cx, cy); g.lineTo(cx + len * Math.sin(theta), cy - len * Math.cos(theta)); g.stroke();
    } else {
      const [cos, sin] = [obs[i * 3], obs[i * 3 + 1]];
      const th = Math.atan2(sin, cos); // 0 = upright
      const len = cell * 0.36;
      const u = r.lastActions ? r.lastActions[i] : 0;
      g.strokeStyle = "#2a3644";
      g.beginPath(); g.arc(0, 0, len, 0, 2 * Math.PI); g.stroke();
      g.strokeStyle = u >= 0 ? "#5cc8ff" : "#ff9f5c";
      g.lineWidth = 2;
      g.beginPath(); g.arc(0, 0, len * 0.35, -Math.PI / 2, -Math.PI / 2 + (Math.max(-2, Math.min(2, u)) / 2) * Math.PI, u < 0); g.stroke();
      const up = Math.abs(th) < 0.3;
      g.strokeStyle = up ? "#7bd88f" : "#d8dee6";
      g.lineWidth = Math.max(2, cell * 0.07);
      g.beginPath(); g.moveTo(0, 0); g.lineTo(len * Math.sin(th), -len * Math.cos(th)); g.stroke();
    }
    g.restore();
  }
}

// A pixel env: each env's own frame (the uint8 RGB observation the policy acted on) in a grid, scaled up without
// smoothing, with the env's running return.
function drawPixelEnvs(r, c, g) {
  const [h, w] = ENVS[r.envName].frame;
  const obs = r.env.observations();
  const running = r.env.runningReturns();
  const n = r.env.length;
  const cols = Math.ceil(Math.sqrt(n));
  const rows = Math.ceil(n / cols);
  const img = new ImageData(cols * w, rows * h);
  for (let i = 0; i < n; i++) {
    const x0 = (i % cols) * w, y0 = Math.floor(i / cols) * h;
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < w; x++) {
        const src = ((i * h + y) * w + x) * 3, dst = ((y0 + y) * cols * w + x0 + x) * 4;
        img.data[dst] = obs[src];
        img.data[dst + 1] = obs[src + 1];
        img.data[dst + 2] = obs[src + 2];
        img.data[dst + 3] = 255;
      }
    }
  }
  const board = new OffscreenCanvas(cols * w, rows * h);
  board.getContext("2d").putImageData(img, 0, 0);
  const pad = c.width / 64;
  const cell = Math.min((c.width - 2 * pad) / cols, (c.height - 2 * pad) / rows);
  g.save();
  g.translate(pad, pad);
  g.imageSmoothingEnabled = false;
  g.drawImage(board, 0, 0, cell * cols, cell * rows);
  g.strokeStyle = "#0b1015";
  g.lineWidth = Math.max(1, cell / 32);
  for (let i = 1; i < cols; i++) { g.beginPath(); g.moveTo(i * cell, 0); g.lineTo(i * cell, rows * cell); g.stroke(); }
  for (let i = 1; i < rows; i++) { g.beginPath(); g.moveTo(0, i * cell); g.lineTo(cols * cell, i * cell); g.stroke(); }
  if (cell >= 48) {
    g.font = `${Math.round(cell / 9)}px system-ui`;
    g.fillStyle = "#8a96a3";
    for (let i = 0; i < n; i++) {
      g.fillText(`${running[i] >= 0 ? "+" : ""}${running[i]}`, (i % cols) * cell + cell * 0.06, Math.floor(i / cols) * cell + cell * 0.14);
    }
  }
  g.restore();
}

// The frames the policy sees (uint8, channels first as SB3 hands them to the network, or channels last: RGB with
// 3 channels, else the first channel as grey), one per env, with its episode start, our action and value, and
// the trainer's.
function drawFrames(rp) {
  const c = $("world");
  const g = c.getContext("2d");
  g.fillStyle = "#0b1015";
  g.fillRect(0, 0, c.width, c.height);
  const sh = rp.shape.length === 3 ? rp.shape : [1, rp.shape[0], rp.shape[1] ?? 1];
  const chw = sh[0] <= 4 && sh[2] > 4;
  const [ch, h, w] = chw ? sh : [sh[2], sh[0], sh[1]];
  // Index of channel k of pixel p within one env's frame.
  const at = chw ? (p, k) => k * h * w + p : (p, k) => p * ch + k;
  const { step, ours, value } = rp.frame;
  const cell = c.width / rp.envs;
  for (let e = 0; e < rp.envs; e++) {
    const img = g.createImageData(w, h);
    const frame = step.obs.subarray(e * h * w * ch, (e + 1) * h * w * ch);
    for (let p = 0; p < h * w; p++) {
      const [r, gr, b] = ch >= 3 ? [frame[at(p, 0)], frame[at(p, 1)], frame[at(p, 2)]] : Array(3).fill(frame[at(p, 0)]);
      img.data.set([r, gr, b, 255], p * 4);
    }
    const tile = new OffscreenCanvas(w, h);
    tile.getContext("2d").putImageData(img, 0, 0);
    const size = cell * 0.9;
    g.imageSmoothingEnabled = false;
    g.drawImage(tile, e * cell + cell * 0.05, cell * 0.05, size, (size * h) / w);
    g.fillStyle = ours[e] === step.actions[e] ? "#7bd88f" : "#ff6b6b";
    g.font = `${Math.round(cell / 24)}px system-ui`;
    const y = cell * 0.1 + (size * h) / w + cell / 14;
    g.fillText(`env ${e}${step.starts[e] ? " (episode start)" : ""}`, e * cell + cell * 0.05, y);
    g.fillText(`action ${ours[e]} (trainer ${step.actions[e]})`, e * cell + cell * 0.05, y + cell / 18);
    g.fillText(`value ${value[e].toFixed(5)} (trainer ${step.value[e].toFixed(5)})`, e * cell + cell * 0.05, y + cell / 9);
  }
  const r = demo.replay;
  g.fillStyle = "#8a96a3";
  g.font = `${Math.round(c.width / 56)}px system-ui`;
  g.fillText(`${r.played} steps played: ${r.actionMatches} actions as the trainer's, ${r.actionMismatches} not; ` +
    `max rel. error value ${r.maxValueErr.toExponential(1)}, logits ${r.maxLogitErr.toExponential(1)}`,
    cell * 0.05, c.height - cell / 10);
}

function drawSeries(g, w, h, values, color, max) {
  g.strokeStyle = color;
  g.lineWidth = 2;
  g.beginPath();
  values.forEach((v, i) => {
    const x = (i / Math.max(1, values.length - 1)) * w;
    const y = h - 4 - (v / max) * (h - 18);
    i ? g.lineTo(x, y) : g.moveTo(x, y);
  });
  g.stroke();
}

function drawLatencyChart() {
  const c = $("chart-lat"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  if (!history.length) return;
  const lat = history.map((h) => h.lat), sps = history.map((h) => h.sps);
  const lmax = Math.max(...lat) * 1.15 || 1, smax = Math.max(...sps) * 1.15 || 1;
  drawSeries(g, c.width, c.height, lat, "#5cc8ff", lmax);
  drawSeries(g, c.width, c.height, sps, "#7bd88f", smax);
  g.fillStyle = "#8a96a3";
  g.font = "12px system-ui";
  g.fillText(`max ${lmax.toFixed(2)} ms`, 6, 12);
  g.fillText(`max ${Math.round(smax).toLocaleString()} steps/s`, c.width - 170, 12);
}

function drawReturnsChart() {
  const c = $("chart-ret"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const rs = demo.returns.slice(-400);
  if (!rs.length) return;
  const lo = Math.min(0, ...rs), hi = Math.max(1, ...rs);
  const y = (v) => c.height - 4 - ((v - lo) / (hi - lo || 1)) * (c.height - 18);
  g.fillStyle = "#5cc8ff88";
  rs.forEach((v, i) => g.fillRect((i / Math.max(1, rs.length - 1)) * (c.width - 3), y(v) - 1.5, 3, 3));
  g.strokeStyle = "#7bd88f";
  g.lineWidth = 2;
  g.beginPath();
  let sum = 0;
  rs.forEach((v, i) => {
    sum += v;
    if (i >= 100) sum -= rs[i - 100];
    const m = sum / Math.min(i + 1, 100);
    const x = (i / Math.max(1, rs.length - 1)) * (c.width - 3);
    i ? g.lineTo(x, y(m)) : g.moveTo(x, y(m));
  });
  g.stroke();
  g.fillStyle = "#8a96a3";
  g.font = "12px system-ui";
  g.fillText(`${hi.toFixed(0)}`, 4, 12);
  g.fillText(`${lo.toFixed(0)}`, 4, c.height - 6);
}

// ---- controls ----
function markBackend() {
  for (const b of document.querySelectorAll("#backend button")) b.classList.toggle("on", b.dataset.b === demo.backendChoice);
}
for (const b of document.querySelectorAll("#backend button")) {
  b.onclick = () => { demo.backendChoice = b.dataset.b; markBackend(); history.length = 0; start(); };
}
$("env").value = demo.env;
$("env").onchange = () => { demo.env = $("env").value; userPolicyBytes = null; history.length = 0; start(); };
$("pause").onclick = () => { demo.paused = !demo.paused; $("pause").textContent = demo.paused ? "resume" : "pause"; };

async function useFile(file) {
  const bytes = new Uint8Array(await file.arrayBuffer());
  // Pick the env by the policy's observation size; the load itself reports a bad artifact.
  try {
    const [, pp] = await bundleFor("cpu");
    const probe = await pp.Policy.load(bytes, { backend: "cpu" });
    const obsLen = probe.info().obsLen;
    probe.free();
    const env = Object.keys(ENVS).find((k) => ENVS[k].obsLen === obsLen);
    if (!env) throw new Error(`${file.name} takes ${obsLen} observations: this demo drives CartPole (4), Pendulum (3) and Catch (768: 16×16 RGB)`);
    userPolicyBytes = bytes;
    demo.env = env;
    $("env").value = env;
    history.length = 0;
    start();
  } catch (e) {
    demo.error = `${e.name || "Error"}: ${e.message || e}`;
    setStatus(`${file.name}: ${demo.error}`, true);
  }
}
const drop = $("drop");
drop.ondragover = (e) => { e.preventDefault(); drop.classList.add("over"); };
drop.ondragleave = () => drop.classList.remove("over");
drop.ondrop = (e) => { e.preventDefault(); drop.classList.remove("over"); if (e.dataTransfer.files[0]) useFile(e.dataTransfer.files[0]); };
document.body.ondragover = (e) => e.preventDefault();
document.body.ondrop = (e) => { e.preventDefault(); if (e.dataTransfer.files[0]) useFile(e.dataTransfer.files[0]); };
$("file").onchange = () => { if ($("file").files[0]) useFile($("file").files[0]); };
demo.useBytes = (bytes, name = "dropped.policy") => useFile(new File([bytes], name));
demo.loadBundle = loadBundle;

markBackend();
requestAnimationFrame(render);
if (params.get("idle") === "1") setStatus("idle"); else start();
