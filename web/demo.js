// The browser demo: many environments (the Rust envs of guest/envs, compiled into the bundle) stepped by one
// batched act() per tick, a backend switch, live latency / throughput / returns charts, drag-and-drop of a
// user's own .policy. State is mirrored on `window.demo` for the headless tests (tests/browser/run.mjs).
//
// Query parameters: env=cartpole|pendulum, backend=auto|cpu|webgpu, n=<envs>, seed=<policy seed>, idle=1 (load
// nothing: the tests drive the bundles themselves).

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const ENVS = {
  cartpole: { n: 256, obsLen: 4, title: "CartPole-v1" },
  pendulum: { n: 64, obsLen: 3, title: "Pendulum-v1" },
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
      await yieldToBrowser();
    }
    policy.free();
    env.free();
  } catch (e) {
    console.error(e);
    demo.error = `${e.name || "Error"}: ${e.message || e}`;
    setStatus(demo.error, true);
  }
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
    if (!env) throw new Error(`${file.name} takes ${obsLen} observations: this demo drives CartPole (4) and Pendulum (3)`);
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
