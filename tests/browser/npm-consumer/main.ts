// A page that uses the policyport npm package as a user would: each entry point imported by its package name
// (the page's import map, written from node's resolution of the package's `exports`), typed by the .d.ts the
// package ships (tsc checks this file strictly before it becomes main.js). tests/browser/run.mjs reads
// `window.consumer` and compares the actions with the native CLI's on the same observations and seed.
import initCpu, { Policy as CpuPolicy, bundle as cpuBundle } from "policyport/cpu";
import initThreads, { Policy as ThreadsPolicy, bundle as threadsBundle, startThreads } from "policyport/cpu-threads";
import initGpu, { Policy as GpuPolicy, bundle as gpuBundle } from "policyport/webgpu";
import type { ActOptions, ActResult, LoadOptions, PolicyInfo } from "policyport/webgpu";

interface EntryResult {
  entry: string;
  bundle: string;
  backend: string;
  actions: number[];
  value: number[] | null;
  error: string | null;
}

/** What the three entry points' `Policy` classes have in common (each module declares its own class). */
interface AnyPolicy {
  act(obs: Float32Array, options?: ActOptions): Promise<ActResult>;
  info(): PolicyInfo;
  free(): void;
}

declare global {
  interface Window {
    consumer: { done: boolean; results: EntryResult[]; error: string | null };
  }
}

window.consumer = { done: false, results: [], error: null };

async function entry(
  name: string,
  bundle: () => string,
  load: (bytes: Uint8Array, options: LoadOptions) => Promise<AnyPolicy>,
  options: LoadOptions,
  bytes: Uint8Array,
  obs: Float32Array,
): Promise<EntryResult> {
  try {
    const policy = await load(bytes, options);
    const res = await policy.act(obs, { seed: 7, step: 0 });
    const out: EntryResult = {
      entry: name,
      bundle: bundle(),
      backend: policy.info().backend,
      actions: Array.from(res.actions),
      value: res.value ? Array.from(res.value) : null,
      error: null,
    };
    policy.free();
    return out;
  } catch (e) {
    return { entry: name, bundle: "", backend: "", actions: [], value: null, error: String(e) };
  }
}

async function main(): Promise<void> {
  const bytes = new Uint8Array(await (await fetch("./cartpole.policy")).arrayBuffer());
  const rows: number[][] = await (await fetch("./obs.json")).json();
  const obs = new Float32Array(rows.flat());
  await initCpu();
  window.consumer.results.push(await entry("policyport/cpu", cpuBundle, (b, o) => CpuPolicy.load(b, o), { backend: "cpu" }, bytes, obs));
  await initThreads();
  await startThreads(1);
  window.consumer.results.push(
    await entry("policyport/cpu-threads", threadsBundle, (b, o) => ThreadsPolicy.load(b, o), { backend: "cpu", threads: 2 }, bytes, obs),
  );
  await initGpu();
  window.consumer.results.push(await entry("policyport/webgpu", gpuBundle, (b, o) => GpuPolicy.load(b, o), { backend: "webgpu" }, bytes, obs));
}

main()
  .catch((e: unknown) => {
    window.consumer.error = String(e);
  })
  .finally(() => {
    window.consumer.done = true;
  });
