//! The plugin ABI (guest/plugin/ABI.md) from the host's side, with hostile arguments: the real plugin module
//! (`$POLICYPORT_PLUGIN`, the `policyport_plugin.wasm` test.sh builds) is instantiated per input with the host's
//! limits (one memory capped at 64 MiB, fuel instead of a wall-clock deadline so runs are deterministic), a valid
//! artifact (the frozen CartPole and the LayerNorm SAC) is loaded, and then the input is a program of export calls
//! with hostile arguments: pointers that are null, misaligned, straddle the memory's end or lie past it; handles
//! that never existed or were dropped; batches past the limit; absurd allocations; unknown modes and dtypes.
//! Every call must return (a code, or a value); a trap is a finding unless the memory cap or the fuel stopped it.
//! (First finding: `pp_info` with a pointer straddling the memory's end trapped instead of answering a code;
//! the plugin now checks every range against its memory before touching it.)
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use policyport_abi::{export, host};
use wasmtime::{Config, Engine, Linker, Module, Store, StoreLimits, StoreLimitsBuilder, Trap, TypedFunc};

const ARTIFACTS: &[&[u8]] = &[
    include_bytes!("../../../../tests/frozen/v1.0/cartpole.f32.policy"),
    include_bytes!("../../../../tests/frozen/v1.1/layernorm_sac.f32.policy"),
];

fn module() -> &'static (Engine, Module) {
    static M: OnceLock<(Engine, Module)> = OnceLock::new();
    M.get_or_init(|| {
        let path = std::env::var_os("POLICYPORT_PLUGIN").expect("set POLICYPORT_PLUGIN to policyport_plugin.wasm");
        let wasm = std::fs::read(path).expect("read the plugin");
        let mut config = Config::new();
        config.consume_fuel(true);
        config.wasm_multi_memory(false);
        let engine = Engine::new(&config).expect("engine");
        let module = Module::new(&engine, wasm).expect("the plugin compiles");
        (engine, module)
    })
}

struct Input<'a>(&'a [u8]);
impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
}

const MEMORY_CAP: usize = 64 << 20;

fuzz_target!(|data: &[u8]| {
    let (engine, module) = module();
    let mut store: Store<StoreLimits> =
        Store::new(engine, StoreLimitsBuilder::new().memory_size(MEMORY_CAP).instances(1).memories(1).build());
    store.limiter(|l| l);
    store.set_fuel(2_000_000_000).unwrap();
    // The plugin imports the host-lent dense kernel (ABI.md); this host lends nothing, so the plugin's own
    // kernels run (the lending host's side is tested in tests/conformance/wasm.rs).
    let mut linker: Linker<StoreLimits> = Linker::new(engine);
    linker
        .func_wrap(host::MODULE, host::LEND_DENSE, |_: u32, _: u32, _: u32, _: u32| -> i32 { host::DECLINED })
        .unwrap();
    linker
        .func_wrap(host::MODULE, host::DENSE, |_: i32, _: u32, _: u32, _: u32, _: u32, _: f32, _: f32| -> i32 {
            host::DenseRefusal::Id as i32
        })
        .unwrap();
    let instance = linker.instantiate(&mut store, module).expect("instantiate the plugin");
    let memory = instance.get_memory(&mut store, export::MEMORY).expect("memory");
    macro_rules! f {
        ($name:expr) => {
            instance.get_typed_func(&mut store, $name).expect($name)
        };
    }
    let alloc: TypedFunc<u32, u32> = f!(export::ALLOC);
    let free: TypedFunc<(u32, u32), ()> = f!(export::FREE);
    let load: TypedFunc<(u32, u32), i32> = f!(export::LOAD);
    let info: TypedFunc<(i32, u32), i32> = f!(export::INFO);
    let act: TypedFunc<policyport_abi::ActParams, i32> = f!(export::ACT);
    let reset: TypedFunc<(i32, u32, u32), i32> = f!(export::RESET);
    let state: TypedFunc<(i32, u32, u32, u32), i32> = f!(export::STATE);
    let last_error: TypedFunc<(u32, u32), u32> = f!(export::LAST_ERROR);
    let drop_: TypedFunc<i32, i32> = f!(export::DROP);

    let mut inp = Input(data);
    // A trap is a finding unless the memory cap or the fuel stopped the guest.
    let judge = |store: &mut Store<StoreLimits>, e: wasmtime::Error, call: &str| -> bool {
        let benign = matches!(e.downcast_ref::<Trap>(), Some(Trap::OutOfFuel))
            || memory.data_size(&*store) + (64 << 10) > MEMORY_CAP;
        if !benign {
            panic!("{call} trapped: {e:#}");
        }
        false
    };
    // Load a valid artifact first (so act/reset/state reach a real policy).
    let art = ARTIFACTS[inp.byte() as usize % ARTIFACTS.len()];
    let Ok(buf) = alloc.call(&mut store, art.len() as u32) else { return };
    if buf == 0 {
        return;
    }
    memory.write(&mut store, buf as usize, art).unwrap();
    let handle = match load.call(&mut store, (buf, art.len() as u32)) {
        Ok(h) => h,
        Err(e) => {
            judge(&mut store, e, "pp_load");
            return;
        }
    };
    // The host's own buffers, big enough for any honest call here (batch <= 8; state and error reads capped to
    // the buffer). A pointer is either one of these (at its start, or misaligned by 1-3 bytes, which the plugin
    // must refuse for 4-byte elements) or wholly invalid: null, straddling the memory's end, past it. Never a
    // pointer into the plugin's own heap or stack: the plugin cannot tell those from the host's buffers, and a
    // write there only corrupts that sandboxed instance (the host turns whatever follows into a typed error).
    const BUF: u32 = 1 << 20;
    let mut bufs = vec![];
    for _ in 0..2 {
        match alloc.call(&mut store, BUF) {
            Ok(p) if p != 0 => bufs.push(p),
            Ok(_) => return,
            Err(e) => {
                judge(&mut store, e, "pp_alloc");
                return;
            }
        }
    }
    for _ in 0..inp.byte() % 16 {
        let mem_len = memory.data_size(&store) as u32;
        let ptr = |inp: &mut Input| -> u32 {
            match inp.byte() % 8 {
                0 => 0,
                1 => mem_len.wrapping_sub(1 + inp.byte() as u32 % 3),
                2 => mem_len.saturating_add(inp.u32() % (1 << 20)),
                3 => u32::MAX - inp.byte() as u32,
                4 => bufs[inp.byte() as usize % 2] + 1 + inp.byte() as u32 % 3,
                _ => bufs[inp.byte() as usize % bufs.len()],
            }
        };
        let h = if inp.byte() % 8 == 0 { inp.u32() as i32 } else { handle };
        let call: String;
        let r = match inp.byte() % 9 {
            0 => {
                let n = match inp.byte() % 4 {
                    0 => inp.u32(),
                    _ => inp.byte() as u32 * 64,
                };
                call = format!("pp_alloc({n}) + pp_free");
                alloc.call(&mut store, n).and_then(|p| if p != 0 { free.call(&mut store, (p, n)) } else { Ok(()) })
            }
            1 => {
                let p = match inp.byte() % 3 {
                    0 => 0,
                    1 => mem_len.saturating_add(inp.u32() % (1 << 20)),
                    _ => u32::MAX - inp.byte() as u32,
                };
                let n = inp.u32();
                call = format!("pp_free({p:#x}, {n})");
                free.call(&mut store, (p, n))
            }
            2 => {
                let (p, n) = (ptr(&mut inp), inp.u32() % (BUF - 4));
                call = format!("pp_load({p:#x}, {n})");
                load.call(&mut store, (p, n)).map(|_| ())
            }
            3 => {
                let p = ptr(&mut inp);
                call = format!("pp_info({h}, {p:#x})");
                info.call(&mut store, (h, p)).map(|_| ())
            }
            4 | 5 => {
                // Honest sizes (0..=8), or past MAX_BATCH (refused before anything is written).
                let batch = match inp.byte() % 4 {
                    0 => (1 << 20) + 1 + inp.u32() % (u32::MAX - (1 << 20)),
                    _ => inp.byte() as u32 % 9,
                };
                let args = (
                    h,
                    ptr(&mut inp),
                    inp.byte() as u32 % 3,
                    batch,
                    if inp.byte() % 2 == 0 { 0 } else { ptr(&mut inp) },
                    inp.u32(),
                    inp.byte() as u32 % 3,
                    inp.u32() as u64,
                    inp.u32() as u64,
                    if inp.byte() % 4 == 0 { 0 } else { ptr(&mut inp) },
                    if inp.byte() % 4 == 0 { 0 } else { ptr(&mut inp) },
                    if inp.byte() % 4 == 0 { 0 } else { ptr(&mut inp) },
                    if inp.byte() % 2 == 0 { 0 } else { ptr(&mut inp) },
                );
                let (a, b, c, d, e, f, g, h2, i, j, k, l, m) = args;
                call = format!("pp_act(h {a}, obs {b:#x}, kind {c}, batch {d}, envs {e:#x}, start {f}, mode {g}, seed {h2}, step {i}, out {j:#x} {k:#x} {l:#x} {m:#x})");
                act.call(&mut store, args).map(|_| ())
            }
            6 => {
                let (p, n) = (ptr(&mut inp), inp.u32() % (BUF / 4));
                call = format!("pp_reset({h}, {p:#x}, {n})");
                reset.call(&mut store, (h, p, n)).map(|_| ())
            }
            7 => {
                let (k, p, cap) = (inp.byte() as u32 % 4, ptr(&mut inp), inp.u32() % (BUF / 4));
                call = format!("pp_state({h}, {k}, {p:#x}, {cap})");
                state.call(&mut store, (h, k, p, cap)).map(|_| ())
            }
            _ => {
                if inp.byte() % 4 == 0 {
                    call = format!("pp_drop({h})");
                    drop_.call(&mut store, h).map(|_| ())
                } else {
                    let (p, n) = (ptr(&mut inp), inp.u32() % 8192);
                    call = format!("pp_last_error({p:#x}, {n})");
                    last_error.call(&mut store, (p, n)).map(|_| ())
                }
            }
        };
        if let Err(e) = r {
            let what = format!("{call} (memory {:#x} bytes)", memory.data_size(&store));
            judge(&mut store, e, &what);
            return;
        }
    }
});
