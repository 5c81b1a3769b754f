// Run web/bench.html in headless Chromium and print its table: policyport's CPU-wasm and WebGPU act() vs
// onnxruntime-web (wasm and WebGPU execution providers) on the same model, with ratios.
//
//   node tests/browser/bench.mjs <policyport CLI> <output dir> [batches] [seconds]
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const { chromium } = createRequire(path.join(ROOT, "web/package.json"))("playwright-core");
const [bin, outDir, batches = "1,64,1024", seconds = "1"] = process.argv.slice(2);
fs.mkdirSync(outDir, { recursive: true });

const server = spawn(bin, ["serve-web", "--port", "0", "--root", path.join(ROOT, "web")], { stdio: ["ignore", "pipe", "inherit"] });
const base = await new Promise((resolve, reject) => {
  let buf = "";
  server.stdout.on("data", (d) => { buf += d; const m = buf.match(/on (http:\/\/[0-9.:]+)\//); if (m) resolve(m[1]); });
  server.on("exit", (code) => reject(new Error(`serve-web exited with ${code}`)));
});
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"],
});
let code = 0;
try {
  const page = await browser.newPage();
  page.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
  await page.goto(`${base}/bench.html?batches=${batches}&seconds=${seconds}`);
  await page.waitForFunction(() => window.bench.done, null, { timeout: 1800000, polling: 1000 });
  const r = await page.evaluate(() => window.bench);
  if (r.error) throw new Error(r.error);
  await page.screenshot({ path: path.join(outDir, "bench.png"), fullPage: true });
  // onnxruntime-web on 2 wasm threads next to policyport's threads bundle: ort's thread count is fixed per page,
  // so a second page load times it alone (same browser, right after).
  const ours2 = "policyport cpu-wasm threads bundle, 2 threads (actSync)";
  if (r.rows.some((row) => row.runtime === ours2 && row.us)) {
    const p2 = await browser.newPage();
    p2.on("console", (m) => { if (m.type() === "error") console.error("page:", m.text()); });
    await p2.goto(`${base}/bench.html?batches=${batches}&seconds=${seconds}&ortThreads=2&peerOnly=1`);
    await p2.waitForFunction(() => window.bench.done, null, { timeout: 1800000, polling: 1000 });
    const r2 = await p2.evaluate(() => window.bench);
    if (r2.error) throw new Error(r2.error);
    r.rows.push(...r2.rows);
    for (const batch of batches.split(",").map(Number)) {
      const a = r.rows.find((row) => row.runtime === ours2 && row.batch === batch)?.us;
      const b = r2.rows.find((row) => row.batch === batch)?.us;
      if (a && b) r.ratios.push({ batch, ours: ours2, peer: r2.rows[0].runtime, ratio: b / a });
    }
  }
  console.log(`browser: ${r.env.userAgent}\nWebGPU adapter: ${r.env.webgpuAdapter}; cross-origin isolated: ${r.env.crossOriginIsolated}`);
  console.log(`${"runtime".padEnd(56)} ${"batch".padStart(6)} ${"us/call".padStart(11)} ${"first ms".padStart(9)} ${"setup ms".padStart(9)}`);
  for (const row of r.rows) {
    console.log(`${row.runtime.padEnd(56)} ${String(row.batch).padStart(6)} ${(row.us?.toFixed(1) ?? "error").padStart(11)} ${(row.firstMs?.toFixed(2) ?? "").padStart(9)} ${(row.setupMs?.toFixed(0) ?? "").padStart(9)}${row.error ? "  " + row.error : ""}`);
  }
  console.log("ratios (peer / policyport; > 1: policyport faster):");
  for (const q of r.ratios) console.log(`  batch ${String(q.batch).padStart(5)}: ${q.peer} / ${q.ours} = ${q.ratio.toFixed(2)}x`);
  fs.writeFileSync(path.join(outDir, "browser-bench.json"), JSON.stringify(r, null, 1));
} catch (e) {
  console.error(e);
  code = 1;
} finally {
  await browser.close();
  server.kill();
}
process.exit(code);
