//! The sandboxed plugin under wasmtime, what only it has: the ABI contract, limits (deadline, memory cap), hostile
//! modules, the module cache, an instance per session on many threads, and the host-lent kernel. Parity,
//! sampling, the state model and request checks run in the whole suite (`Backend::Wasmtime` is one of
//! `backends()`: `policyport_wasmtime::load` gives a `CompiledPolicy` like every backend's).

use std::sync::Arc;
use std::time::{Duration, Instant};

use policyport::{
    ActMode, Backend, CompiledPolicy, ErrorKind, Observations, PolicyError, Request, SandboxError,
};
use policyport_abi::{ErrorCode, host};
use policyport_conformance::{compile_fixture, fixture_names, load_fixture, plugin_wasm};
use policyport_wasmtime::{WasmError, WasmLimits, WasmRuntime};

fn runtime() -> Arc<WasmRuntime> {
    WasmRuntime::new(&plugin_wasm()).unwrap()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "outputs of different lengths");
    let scale = b
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs() as f64))
        .max(1e-12);
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs() as f64))
        / scale
}

/// The bundled CartPole policy: the artifact every hostile module below is "loaded" with (the host reads and
/// validates it before any plugin sees it; the hostile modules ignore it).
fn cartpole() -> Vec<u8> {
    compile_fixture(&load_fixture("cartpole"))
}

/// `load` on a hostile module: only its error (a `CompiledPolicy` is not `Debug`).
fn load_err(rt: &Arc<WasmRuntime>, limits: WasmLimits) -> PolicyError {
    match policyport_wasmtime::load(rt, &cartpole(), limits) {
        Ok(_) => panic!("the hostile module was accepted"),
        Err(e) => e,
    }
}

#[test]
fn sandbox_errors_are_typed_and_the_session_survives_them() {
    let rt = runtime();
    let bytes = cartpole();
    let mut s = policyport_wasmtime::load(&rt, &bytes, WasmLimits::default())
        .unwrap()
        .session();
    let nan = [f32::NAN, 0.0, 0.0, 0.0];
    let e = s
        .act(&Request::new(
            Observations::F32(&nan),
            1,
            ActMode::Deterministic,
        ))
        .unwrap_err();
    assert!(
        matches!(e, PolicyError::Observation(_)) && e.to_string().contains("non-finite"),
        "{e}"
    );
    // A short observation buffer is the runtime's own observation error, as on the native session.
    assert!(matches!(
        s.act(&Request::new(
            Observations::F32(&[0.0; 3]),
            1,
            ActMode::Deterministic
        )),
        Err(PolicyError::Observation(_))
    ));
    let out = s
        .act(
            &Request::new(Observations::F32(&[0.01; 8]), 2, ActMode::Deterministic)
                .envs(policyport::EnvIds::List(&[4, 1])),
        )
        .unwrap();
    assert_eq!(out.discrete.len(), 2);
    // A malformed artifact: refused by the host's reader (the fuzzed one) before the plugin sees it.
    let mut bad = bytes.clone();
    bad[200] ^= 1;
    match policyport_wasmtime::load(&rt, &bad, WasmLimits::default()) {
        Err(PolicyError::Artifact(e)) => assert!(e.to_string().contains("checksum"), "{e}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    }
}

/// `pp_info` of a hostile module: the bundled CartPole policy's words (obs 4, 1 action, 2 logits, a value,
/// discrete, no state, f32 observations, the ABI version), so that the host takes it for a plugin that loaded it.
fn cartpole_info(abi_version: u32) -> String {
    let words = [4, 1, 2, 1, 1, 0, 0, abi_version];
    let stores: String = words
        .iter()
        .enumerate()
        .map(|(i, w)| format!("(i32.store offset={} (local.get 1) (i32.const {w}))", 4 * i))
        .collect();
    format!(r#"(func (export "pp_info") (param i32 i32) (result i32) {stores} i32.const 0)"#)
}

/// A minimal ABI-shaped module whose `pp_load` body is `body` (WAT).
fn hostile(abi_version: u32, load_body: &str) -> String {
    let info = cartpole_info(abi_version);
    format!(
        r#"(module
          (memory (export "memory") 2)
          (func (export "pp_abi_version") (result i32) i32.const {abi_version})
          (func (export "pp_alloc") (param i32) (result i32) i32.const 1024)
          (func (export "pp_free") (param i32 i32))
          (func (export "pp_load") (param i32 i32) (result i32) {load_body})
          {info}
          (func (export "pp_act") (param i32 i32 i32 i32 i32 i32 i32 i64 i64 i32 i32 i32 i32) (result i32) i32.const 0)
          (func (export "pp_act_masked") (param i32 i32 i32 i32 i32 i32 i32 i64 i64 i32 i32 i32 i32 i32 f32) (result i32) i32.const 0)
          (func (export "pp_reset") (param i32 i32 i32) (result i32) i32.const 0)
          (func (export "pp_state") (param i32 i32 i32 i32) (result i32) i32.const 0)
          (func (export "pp_last_error") (param i32 i32) (result i32) i32.const 0))"#
    )
}

#[test]
fn a_guest_that_loops_forever_is_stopped_at_its_deadline() {
    let rt = WasmRuntime::new(
        hostile(policyport_wasmtime::ABI_VERSION, "(loop br 0) i32.const 0").as_bytes(),
    )
    .unwrap();
    let deadline = Duration::from_millis(50);
    // Best of three: the bound is on the mechanism (1 ms epochs), not on this machine's scheduling noise.
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        let r = load_err(
            &rt,
            WasmLimits {
                deadline,
                ..Default::default()
            },
        );
        let took = t0.elapsed();
        assert!(
            matches!(
                r,
                PolicyError::Sandbox(SandboxError::Deadline {
                    call: "pp_load",
                    deadline_ms: 50
                })
            ),
            "{r}"
        );
        assert_eq!(r.kind(), ErrorKind::Sandbox);
        best = best.min(took);
    }
    assert!(
        best >= deadline && best < deadline + Duration::from_millis(10),
        "stopped after {best:?}"
    );
}

#[test]
fn the_deadline_outlives_the_runtime_handle() {
    // The epoch ticker that enforces deadlines belonged to the WasmRuntime: with the caller's handle dropped
    // while a policy lived (the CLI's `bench --plugin` did this), a looping pp_act hung the host forever. (The
    // host steps through pp_act_masked since ABI 6: that is the export that loops here.)
    let looping = hostile(policyport_wasmtime::ABI_VERSION, "i32.const 0").replace(
        r#"(func (export "pp_act_masked") (param i32 i32 i32 i32 i32 i32 i32 i64 i64 i32 i32 i32 i32 i32 f32) (result i32) i32.const 0)"#,
        r#"(func (export "pp_act_masked") (param i32 i32 i32 i32 i32 i32 i32 i64 i64 i32 i32 i32 i32 i32 f32) (result i32) (loop br 0) i32.const 0)"#,
    );
    assert!(
        looping.contains("(loop br 0) i32.const 0)"),
        "the looping act export was swapped in"
    );
    let rt = WasmRuntime::new(looping.as_bytes()).unwrap();
    let limits = WasmLimits {
        deadline: Duration::from_millis(50),
        ..Default::default()
    };
    let mut p = policyport_wasmtime::load(&rt, &cartpole(), limits)
        .unwrap()
        .session();
    drop(rt);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let obs = vec![0.0f32; p.policy().info().obs_len];
        let r = p
            .act(&Request::new(
                Observations::F32(&obs),
                1,
                ActMode::Deterministic,
            ))
            .map(|_| ());
        let _ = tx.send(format!("{r:?}"));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("pp_act still running 20 s after a 50 ms deadline");
    assert!(r.contains("Deadline"), "{r}");
}

#[test]
fn a_guest_that_grows_memory_past_the_cap_fails_cleanly() {
    let grow = "(block (loop (br_if 1 (i32.eq (memory.grow (i32.const 16)) (i32.const -1))) (br 0))) unreachable";
    let rt = WasmRuntime::new(hostile(policyport_wasmtime::ABI_VERSION, grow).as_bytes()).unwrap();
    let limits = WasmLimits {
        memory_bytes: 4 << 20,
        ..Default::default()
    };
    assert!(matches!(
        load_err(&rt, limits),
        PolicyError::Sandbox(SandboxError::MemoryCap { cap_bytes }) if cap_bytes == 4 << 20
    ));
    // The real plugin, a cap too small for the benchmark model's weights.
    let bytes = compile_fixture(&load_fixture("mlp64"));
    let limits = WasmLimits {
        memory_bytes: 2 << 20,
        ..Default::default()
    };
    assert!(matches!(
        policyport_wasmtime::load(&runtime(), &bytes, limits).err(),
        Some(PolicyError::Sandbox(SandboxError::MemoryCap { .. }))
    ));
}

/// Regression (ABI defined once, `policyport_abi`): a result code outside the ABI and a `pp_info` flag that is
/// neither 0 nor 1 are typed errors naming the broken plugin, not misread as some other error or as `true`.
#[test]
fn a_plugin_breaking_the_abi_is_a_typed_error() {
    let rt =
        WasmRuntime::new(hostile(policyport_wasmtime::ABI_VERSION, "i32.const -99").as_bytes())
            .unwrap();
    let e = load_err(&rt, WasmLimits::default());
    assert!(
        matches!(&e, PolicyError::Sandbox(SandboxError::Broken(m)) if m.contains("-99") && m.contains("pp_load")),
        "{e}"
    );
    let info = cartpole_info(policyport_wasmtime::ABI_VERSION);
    let stored_discrete = "(i32.store offset=16 (local.get 1) (i32.const 1))";
    assert!(info.contains(stored_discrete));
    let bad_info = hostile(policyport_wasmtime::ABI_VERSION, "i32.const 0").replace(
        stored_discrete,
        "(i32.store offset=16 (local.get 1) (i32.const 5))",
    );
    let rt = WasmRuntime::new(bad_info.as_bytes()).unwrap();
    let e = load_err(&rt, WasmLimits::default());
    assert!(
        matches!(&e, PolicyError::Sandbox(SandboxError::Broken(m)) if m.contains("word 4 is 5")),
        "{e}"
    );
    // A plugin describing another policy than the host read (2 actions where the artifact has 1): refused at
    // load, before its outputs could be read with its sizes.
    let other = hostile(policyport_wasmtime::ABI_VERSION, "i32.const 0").replace(
        "(i32.store offset=4 (local.get 1) (i32.const 1))",
        "(i32.store offset=4 (local.get 1) (i32.const 2))",
    );
    let rt = WasmRuntime::new(other.as_bytes()).unwrap();
    let e = load_err(&rt, WasmLimits::default());
    assert!(
        matches!(&e, PolicyError::Sandbox(SandboxError::Broken(m)) if m.contains("mismatched")),
        "{e}"
    );
    // pp_alloc hands small buffers (the info words) and large ones (the artifact) out properly, then the batch
    // buffer 16 bytes before the end of its 2 pages: the host used to slice its memory there and panic.
    let bad_alloc = hostile(policyport_wasmtime::ABI_VERSION, "i32.const 0").replace(
        r#"(func (export "pp_alloc") (param i32) (result i32) i32.const 1024)"#,
        r#"(func (export "pp_alloc") (param i32) (result i32)
             (select (i32.const 0x1FFF0) (i32.const 1024)
               (i32.and (i32.gt_u (local.get 0) (i32.const 32)) (i32.le_u (local.get 0) (i32.const 1024)))))"#,
    );
    let rt = WasmRuntime::new(bad_alloc.as_bytes()).unwrap();
    let mut p = policyport_wasmtime::load(&rt, &cartpole(), WasmLimits::default())
        .unwrap()
        .session();
    let r = p
        .act(&Request::new(
            Observations::F32(&[0.0; 4]),
            1,
            ActMode::Deterministic,
        ))
        .map(|_| ());
    assert!(
        matches!(&r, Err(PolicyError::Sandbox(SandboxError::Broken(m))) if m.contains("at 131056")),
        "{r:?}"
    );
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Sandbox);
}

/// A plugin that answers the host with outputs no policy could give — an action index past the action space, a
/// NaN logit — never reaches the caller: the session checks what the sandbox wrote before it becomes the act's
/// outputs (a NaN is the same typed non-finite error as on every backend), and the last good outputs stay.
#[test]
fn outputs_a_plugin_could_not_have_computed_are_refused() {
    // pp_act_masked writes action `action` and logits (logit, 0) into the buffers the host passed (actions: arg
    // 9, distribution: arg 11) for its one row.
    let answering = |action: &str, logit: &str| {
        hostile(policyport_wasmtime::ABI_VERSION, "i32.const 0").replace(
            r#"(func (export "pp_act_masked") (param i32 i32 i32 i32 i32 i32 i32 i64 i64 i32 i32 i32 i32 i32 f32) (result i32) i32.const 0)"#,
            &format!(
                r#"(func (export "pp_act_masked") (param i32 i32 i32 i32 i32 i32 i32 i64 i64 i32 i32 i32 i32 i32 f32) (result i32)
                   (i32.store (local.get 9) (i32.const {action}))
                   (f32.store (local.get 11) (f32.const {logit}))
                   (f32.store offset=4 (local.get 11) (f32.const 0))
                   i32.const 0)"#
            ),
        )
    };
    let obs = [0.0f32; 4];
    let req = Request::new(Observations::F32(&obs), 1, ActMode::Deterministic).skip_value();
    let session = |wat: String| {
        let rt = WasmRuntime::new(wat.as_bytes()).unwrap();
        policyport_wasmtime::load(&rt, &cartpole(), WasmLimits::default())
            .unwrap()
            .session()
    };
    let mut honest = session(answering("1", "0.5"));
    let out = honest.act(&req).unwrap();
    assert_eq!(
        (&out.discrete[..], &out.dist_params[..]),
        (&[1i64][..], &[0.5f32, 0.0][..])
    );
    for (action, logit, want) in [
        ("2", "0.5", "action 2"),
        ("-1", "0.5", "action -1"),
        ("0", "nan", "non-finite"),
    ] {
        let mut s = session(answering(action, logit));
        let e = s.act(&req).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains(want), "{action}/{logit}: {e}");
        assert!(
            s.outputs().discrete.is_empty(),
            "{action}/{logit}: refused outputs became the act's"
        );
    }
}

#[test]
fn hostile_and_foreign_modules_are_refused() {
    assert!(matches!(
        WasmRuntime::new(b"\0asm\x01\0\0\0garbage"),
        Err(WasmError::Module(_))
    ));
    assert!(matches!(
        WasmRuntime::new(b"not wasm at all"),
        Err(WasmError::Module(_))
    ));
    // Plugins of earlier ABI versions (1: before episode starts, 2: before pp_state) are refused by this host.
    for old in 1..policyport_wasmtime::ABI_VERSION {
        let rt = WasmRuntime::new(hostile(old, "i32.const 0").as_bytes()).unwrap();
        let e = load_err(&rt, WasmLimits::default());
        assert!(
            matches!(&e, PolicyError::Sandbox(SandboxError::Plugin(m)) if m.contains(&format!("ABI version {old},"))),
            "{e}"
        );
    }
    let rt = WasmRuntime::new(
        format!(
            r#"(module (memory (export "memory") 1) (func (export "pp_abi_version") (result i32) i32.const {}))"#,
            policyport_wasmtime::ABI_VERSION
        )
        .as_bytes(),
    )
    .unwrap();
    let e = load_err(&rt, WasmLimits::default());
    assert!(
        matches!(&e, PolicyError::Sandbox(SandboxError::Plugin(m)) if m.contains("missing export")),
        "{e}"
    );
    let importing = r#"(module (import "env" "f" (func)) (memory (export "memory") 1))"#;
    assert!(
        matches!(WasmRuntime::new(importing.as_bytes()), Err(WasmError::Imports(i)) if i == ["env::f"])
    );
    let trapping =
        WasmRuntime::new(hostile(policyport_wasmtime::ABI_VERSION, "unreachable").as_bytes())
            .unwrap();
    assert!(matches!(
        load_err(&trapping, WasmLimits::default()),
        PolicyError::Sandbox(SandboxError::Trap {
            call: "pp_load",
            ..
        })
    ));
}

#[test]
fn the_plugin_imports_only_the_host_kernel_and_the_module_cache_round_trips() {
    let wasm = plugin_wasm();
    // WasmRuntime refuses any import but the host-lent kernel's two; the plugin loads.
    let rt = WasmRuntime::new(&wasm).unwrap();
    assert!(!rt.from_cache);
    let root = std::env::temp_dir().join(format!("policyport-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join("private");
    let t0 = Instant::now();
    let cold = WasmRuntime::with_cache_dir(&wasm, &dir).unwrap();
    let cold_t = t0.elapsed();
    assert!(!cold.from_cache);
    let t1 = Instant::now();
    let warm = WasmRuntime::with_cache_dir(&wasm, &dir).unwrap();
    let warm_t = t1.elapsed();
    assert!(warm.from_cache, "second load must come from the cache");
    println!("plugin module: compile {cold_t:?}, from .cwasm cache {warm_t:?}");
    let bytes = compile_fixture(&load_fixture("cartpole"));
    policyport_wasmtime::load(&warm, &bytes, WasmLimits::default()).unwrap();
    // One entry, named by a SHA-256, no temporary file left behind; the directory was made private.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(
        names[0].len() == 64 + 6 && names[0].ends_with(".cwasm"),
        "{names:?}"
    );
    let entry = dir.join(&names[0]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // An entry others could have written is not trusted: recompiled (and replaced).
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!WasmRuntime::with_cache_dir(&wasm, &dir).unwrap().from_cache);
        assert!(WasmRuntime::with_cache_dir(&wasm, &dir).unwrap().from_cache);
        // A directory others can write is refused with a typed error: nothing is read from it or written to it.
        let open = root.join("open");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            WasmRuntime::with_cache_dir(&wasm, &open),
            Err(WasmError::Cache(_))
        ));
        assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);
        // So is a symlink to the private directory.
        let link = root.join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(matches!(
            WasmRuntime::with_cache_dir(&wasm, &link),
            Err(WasmError::Cache(_))
        ));
    }
    // A damaged entry is recompiled, not trusted.
    std::fs::write(&entry, b"garbage").unwrap();
    let again = WasmRuntime::with_cache_dir(&wasm, &dir).unwrap();
    assert!(!again.from_cache);
    policyport_wasmtime::load(&again, &bytes, WasmLimits::default()).unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn eight_threads_each_with_an_instance_get_the_right_answers() {
    let rt = runtime();
    let f = load_fixture("mlp64");
    let bytes = Arc::new(compile_fixture(&f));
    let case = Arc::new(f.io.cases[2].clone());
    let mut native = CompiledPolicy::load(&bytes, Backend::Cpu)
        .unwrap()
        .session();
    let expected: Vec<Vec<i64>> = (0..50u64)
        .map(|step| {
            native
                .act(&Request::new(
                    Observations::F32(&case.obs),
                    case.batch,
                    ActMode::Sample { seed: 77, step },
                ))
                .unwrap()
                .discrete
                .clone()
        })
        .collect();
    let expected = Arc::new(expected);
    // One policy, a session (and so an instance of the plugin) per thread.
    let policy = policyport_wasmtime::load(&rt, &bytes, WasmLimits::default()).unwrap();
    let instances = rt.instances();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (policy, case, expected) = (policy.clone(), case.clone(), expected.clone());
            std::thread::spawn(move || {
                let mut p = policy.session();
                for round in 0..4 {
                    for step in 0..50u64 {
                        let s = (step + t as u64 * 7 + round) % 50;
                        let o = p
                            .act(&Request::new(
                                Observations::F32(&case.obs),
                                case.batch,
                                ActMode::Sample { seed: 77, step: s },
                            ))
                            .unwrap();
                        assert_eq!(o.discrete, expected[s as usize], "thread {t} step {s}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // The load's instance went to the first session; the seven others made their own.
    assert_eq!((instances, rt.instances()), (1, 8));
}

/// A host calling the plugin's exports directly (not through policyport-wasmtime).
struct RawPlugin {
    store: wasmtime::Store<()>,
    memory: wasmtime::Memory,
    instance: wasmtime::Instance,
}

impl RawPlugin {
    fn new(module: &wasmtime::Module) -> Self {
        let mut store = wasmtime::Store::new(module.engine(), ());
        // The plugin imports the host-lent dense kernel (ABI.md); this raw host lends nothing (its offers are
        // declined), so the plugin computes every layer itself.
        let mut linker = wasmtime::Linker::new(module.engine());
        linker
            .func_wrap(
                host::MODULE,
                host::LEND_DENSE,
                |_: u32, _: u32, _: u32, _: u32| -> i32 { host::DECLINED },
            )
            .unwrap();
        linker
            .func_wrap(
                host::MODULE,
                host::DENSE,
                |_: i32, _: u32, _: u32, _: u32, _: u32, _: f32, _: f32| -> i32 {
                    host::DenseRefusal::Id as i32
                },
            )
            .unwrap();
        let instance = linker.instantiate(&mut store, module).unwrap();
        let memory = instance
            .get_memory(&mut store, policyport_abi::export::MEMORY)
            .unwrap();
        RawPlugin {
            store,
            memory,
            instance,
        }
    }
    fn func<P: wasmtime::WasmParams, R: wasmtime::WasmResults>(
        &mut self,
        name: &str,
    ) -> wasmtime::TypedFunc<P, R> {
        self.instance.get_typed_func(&mut self.store, name).unwrap()
    }
    fn alloc(&mut self, bytes: &[u8]) -> u32 {
        let alloc = self.func::<u32, u32>(policyport_abi::export::ALLOC);
        let p = alloc.call(&mut self.store, bytes.len() as u32).unwrap();
        self.memory
            .write(&mut self.store, p as usize, bytes)
            .unwrap();
        p
    }
    fn end(&self) -> u32 {
        self.memory.data_size(&self.store) as u32
    }
    /// pp_act at batch 1 for env 0, deterministic; the action and value read back when the call succeeds.
    fn act(&mut self, h: i32, obs: u32, actions: u32, value: u32) -> (i32, Vec<u8>) {
        let act = self.func::<policyport_abi::ActParams, i32>(policyport_abi::export::ACT);
        let code = act
            .call(
                &mut self.store,
                (h, obs, 0, 1, 0, 0, 0, 0, 0, actions, value, 0, 0),
            )
            .unwrap();
        let mut out = vec![0u8; 8];
        if code == 0 {
            self.memory
                .read(&self.store, actions as usize, &mut out[..4])
                .unwrap();
            self.memory
                .read(&self.store, value as usize, &mut out[4..])
                .unwrap();
        }
        (code, out)
    }
}

/// Found by the `plugin_abi` fuzz target (host/wasmtime/fuzz): `pp_info` with an output pointer straddling the
/// memory's end trapped the instance instead of answering a code. Every export now checks each range against the
/// plugin's memory first: ranges straddling or past the end are a bad call (code -3), a refused act() leaves the
/// recurrent state where it was, and nothing traps.
#[test]
fn plugin_exports_refuse_ranges_past_the_memory_end() {
    let engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&engine, plugin_wasm()).unwrap();
    let bytes = compile_fixture(&load_fixture("lstm_policy"));
    let call = ErrorCode::Call.code();
    let mut answers = vec![];
    for refuse_first in [true, false] {
        let mut p = RawPlugin::new(&module);
        let art = p.alloc(&bytes);
        let load = p.func::<(u32, u32), i32>(policyport_abi::export::LOAD);
        let h = load.call(&mut p.store, (art, bytes.len() as u32)).unwrap();
        assert!(h >= 0, "load: {h}");
        let words = p.alloc(&[0u8; 4 * policyport_abi::INFO_WORDS]);
        let info = p.func::<(i32, u32), i32>(policyport_abi::export::INFO);
        assert_eq!(info.call(&mut p.store, (h, words)).unwrap(), 0);
        let mut w = [0u8; 4];
        p.memory.read(&p.store, words as usize, &mut w).unwrap();
        let obs_len = u32::from_le_bytes(w) as usize;
        let obs: Vec<u8> = (0..obs_len)
            .flat_map(|i| (0.3 * i as f32 - 0.4).to_le_bytes())
            .collect();
        let (obs, actions, value) = (p.alloc(&obs), p.alloc(&[0; 4]), p.alloc(&[0; 4]));
        let end = p.end();
        for out in [end - 4, end - 1, end + 64, u32::MAX - 3] {
            assert_eq!(
                info.call(&mut p.store, (h, out)).unwrap(),
                call,
                "pp_info at {out:#x} of {end:#x}"
            );
        }
        let first = p.act(h, obs, actions, value);
        assert_eq!(first.0, 0);
        if refuse_first {
            // Outputs past the end: refused before act() runs, so the LSTM's state does not advance.
            for (a, v) in [(end - 2, value), (actions, end - 2), (end + 4096, value)] {
                assert_eq!(
                    p.act(h, obs, a, v).0,
                    call,
                    "pp_act with outputs at {a:#x} / {v:#x} of {end:#x}"
                );
            }
            let state = p.func::<(i32, u32, u32, u32), i32>(policyport_abi::export::STATE);
            assert_eq!(
                state.call(&mut p.store, (h, 0, end - 8, 1 << 20)).unwrap(),
                call
            );
            let reset = p.func::<(i32, u32, u32), i32>(policyport_abi::export::RESET);
            assert_eq!(reset.call(&mut p.store, (h, end - 2, 4)).unwrap(), call);
            let last_error = p.func::<(u32, u32), u32>(policyport_abi::export::LAST_ERROR);
            assert!(last_error.call(&mut p.store, (end - 1, 100)).unwrap() > 0);
            let free = p.func::<(u32, u32), ()>(policyport_abi::export::FREE);
            free.call(&mut p.store, (end + 16, 32)).unwrap();
        }
        answers.push((first.1, p.act(h, obs, actions, value)));
    }
    assert_eq!(
        answers[0], answers[1],
        "the refused calls changed the answers (state advanced?)"
    );
    assert_ne!(
        answers[0].0, answers[0].1.1,
        "the LSTM's second step should differ from its first"
    );
}

/// With `lend_dense` the plugin's dense layers and convolution GEMMs run in the host's native kernel: every
/// fixture with one lends it (checked: `lent_layers`), and the answers stay the native runtime's (the same kernel,
/// so within the float tolerance of the sandbox's other ops). Without it nothing is lent.
#[test]
fn the_host_lent_kernel_computes_the_plugins_dense_layers() {
    let rt = runtime();
    let lend = WasmLimits {
        lend_dense: true,
        deadline: Duration::from_secs(60),
        ..Default::default()
    };
    let mut lent_somewhere = 0;
    for name in fixture_names() {
        let f = load_fixture(&name);
        let bytes = compile_fixture(&f);
        let native_policy = CompiledPolicy::load(&bytes, Backend::Cpu).unwrap();
        let mut native = native_policy.session();
        let before = rt.lent_layers();
        let mut wasm = policyport_wasmtime::load(&rt, &bytes, lend)
            .unwrap()
            .session();
        let lent = rt.lent_layers() - before;
        policyport_wasmtime::load(&rt, &bytes, WasmLimits::default()).unwrap();
        assert_eq!(
            rt.lent_layers() - before,
            lent,
            "{name}: lent without lend_dense"
        );
        lent_somewhere += lent;
        for case in &f.io.cases {
            let mode = ActMode::Sample { seed: 3, step: 1 };
            let req = Request::new(Observations::F32(&case.obs), case.batch, mode);
            let b = wasm.act(&req).unwrap().clone();
            let a = native.act(&req).unwrap();
            assert_eq!(a.discrete, b.discrete, "{name}/{}", case.name);
            assert!(
                rel(&b.continuous, &a.continuous) < 1e-5
                    && rel(&b.value, &a.value) < 1e-5
                    && rel(&b.dist_params, &a.dist_params) < 1e-5,
                "{name}/{}",
                case.name
            );
        }
    }
    assert!(
        lent_somewhere >= fixture_names().len(),
        "only {lent_somewhere} layers lent"
    );
}

/// A module importing the host-lent kernel, with the plain exports of [`hostile`] and `pp_load` = `load_body`.
fn lending_guest(load_body: &str) -> String {
    hostile(policyport_wasmtime::ABI_VERSION, load_body).replacen(
        "(module",
        r#"(module
          (import "policyport_host" "pp_host_lend_dense" (func $lend (param i32 i32 i32 i32) (result i32)))
          (import "policyport_host" "pp_host_dense" (func $dense (param i32 i32 i32 i32 i32 f32 f32) (result i32)))"#,
        1,
    )
}

/// `pp_load` of a guest that checks each host answer in turn: `(call ...) expected code-on-mismatch`.
fn checks(calls: &[(&str, i32)]) -> String {
    let mut body = String::new();
    for (i, (call, want)) in calls.iter().enumerate() {
        body += &format!(
            "(if (i32.ne {call} (i32.const {want})) (then (return (i32.const {}))))\n",
            -1000 - i as i32
        );
    }
    body + "i32.const 0"
}

/// A hostile guest's pointers, sizes, ids and activation codes get the ABI's refusal codes from the lending host,
/// never a host panic or a write outside the ranges; a well-formed call computes `act(x Wᵀ + b)`. (Memory: 2
/// pages = 131 072 bytes; a 2 × 3 layer at 64 with its bias at 128.)
#[test]
fn a_hostile_guest_gets_refusals_from_the_host_lent_kernel() {
    let lend = |n: u32, k: u32, w: u32, b: u32| {
        format!("(call $lend (i32.const {w}) (i32.const {n}) (i32.const {k}) (i32.const {b}))")
    };
    let dense = |id: i32, x: u32, m: u32, y: u32, act: u32, a: &str| {
        format!(
            "(call $dense (i32.const {id}) (i32.const {x}) (i32.const {m}) (i32.const {y}) (i32.const {act}) (f32.const {a}) (f32.const 0))"
        )
    };
    let tanh = policyport_abi::host::act::TANH;
    let clip = policyport_abi::host::act::CLIP;
    let mut setup = String::new();
    for (i, v) in [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().enumerate() {
        setup += &format!("(f32.store (i32.const {}) (f32.const {v}))\n", 64 + 4 * i);
    }
    setup +=
        "(f32.store (i32.const 128) (f32.const 0.5)) (f32.store (i32.const 132) (f32.const -1))\n";
    for (i, v) in [0.5f32, 0.25, 1.0].iter().enumerate() {
        setup += &format!("(f32.store (i32.const {}) (f32.const {v}))\n", 256 + 4 * i);
    }
    let identity = policyport_abi::host::act::IDENTITY;
    let body = setup
        + &checks(&[
            (&lend(0, 3, 64, 128), -1),              // no outputs
            (&lend(2, 3, 131_064, 0), -1),           // weights past the memory's end
            (&lend(2, 3, 66, 0), -1),                // misaligned
            (&lend(2, 3, 0, 0), -1),                 // null
            (&lend(65_536, 65_536, 64, 0), -1),      // 2^32 weights
            (&lend(2, 3, 64, 131_068), -1),          // bias past the end
            (&lend(2, 3, 64, 128), 0),               // taken: id 0
            (&dense(7, 256, 1, 512, tanh, "0"), -1), // unknown id
            (&dense(-5, 256, 1, 512, tanh, "0"), -1),
            (&dense(0, 256, 1, 512, 99, "0"), -3), // unknown activation
            (&dense(0, 256, 1, 512, clip, "nan"), -3), // NaN parameter
            (&dense(0, 131_064, 1, 512, tanh, "0"), -2), // x past the end
            (&dense(0, 256, 1, 131_068, tanh, "0"), -2), // y past the end
            (&dense(0, 256, 1, 260, tanh, "0"), -2), // x and y overlap
            (&dense(0, 0, 1, 512, tanh, "0"), -2), // null x
            (&dense(0, 258, 1, 512, tanh, "0"), -2), // misaligned x
            (&dense(0, 256, u32::MAX, 512, tanh, "0"), -2), // 2^32 rows
            (&dense(0, 256, 0, 512, tanh, "0"), 0), // no rows: nothing to do
            (&dense(0, 256, 1, 512, identity, "0"), 0), // y = x Wᵀ + b
            // 0.5·1 + 0.25·2 + 1·3 + 0.5 = 4.5 and 0.5·4 + 0.25·5 + 1·6 − 1 = 8.25: exact in f32 in any order.
            (
                "(i32.reinterpret_f32 (f32.load (i32.const 512)))",
                4.5f32.to_bits() as i32,
            ),
            (
                "(i32.reinterpret_f32 (f32.load (i32.const 516)))",
                8.25f32.to_bits() as i32,
            ),
            ("(i32.load (i32.const 520))", 0), // nothing written past y
        ]);
    let rt = WasmRuntime::new(lending_guest(&body).as_bytes()).unwrap();
    let lend_on = WasmLimits {
        lend_dense: true,
        ..Default::default()
    };
    if let Err(e) = policyport_wasmtime::load(&rt, &cartpole(), lend_on) {
        panic!("a host answer differed from the ABI's (UnknownCode -1000 - i is check i): {e}");
    }
    // Without lend_dense the host declines every layer, however well-formed.
    let declined =
        WasmRuntime::new(lending_guest(&checks(&[(&lend(2, 3, 64, 128), -1)])).as_bytes()).unwrap();
    policyport_wasmtime::load(&declined, &cartpole(), WasmLimits::default()).unwrap();
    // The host holds lent weights against the instance's memory cap: 1 MiB takes exactly 8 layers of 128 KiB
    // (128 × 255 weights + 128 biases), then declines.
    let count = r#"(local $n i32)
        (block $full (loop $more
          (br_if $full (i32.lt_s (call $lend (i32.const 4) (i32.const 128) (i32.const 255) (i32.const 0)) (i32.const 0)))
          (local.set $n (i32.add (local.get $n) (i32.const 1)))
          (br_if $more (i32.lt_u (local.get $n) (i32.const 100)))))
        (if (i32.ne (local.get $n) (i32.const 8)) (then (return (i32.sub (i32.const -2000) (local.get $n)))))
        i32.const 0"#;
    let rt = WasmRuntime::new(lending_guest(count).as_bytes()).unwrap();
    let capped = WasmLimits {
        lend_dense: true,
        memory_bytes: 1 << 20,
        ..Default::default()
    };
    if let Err(e) = policyport_wasmtime::load(&rt, &cartpole(), capped) {
        panic!("lent bytes past the memory cap (UnknownCode -2000 - n: n layers taken): {e}");
    }
}

/// The epoch deadline interrupts guest code only: a host-lent layer checks the call's deadline itself (between
/// row blocks) and ends the call with the same typed `Deadline` error.
#[test]
fn a_host_lent_layer_stops_at_the_calls_deadline() {
    let body = "(drop (call $lend (i32.const 64) (i32.const 2) (i32.const 3) (i32.const 0)))
        (drop (call $dense (i32.const 0) (i32.const 256) (i32.const 1) (i32.const 512) (i32.const 0) (f32.const 0) (f32.const 0)))
        i32.const 0";
    let rt = WasmRuntime::new(lending_guest(body).as_bytes()).unwrap();
    let limits = WasmLimits {
        lend_dense: true,
        deadline: Duration::ZERO,
        ..Default::default()
    };
    assert!(matches!(
        load_err(&rt, limits),
        PolicyError::Sandbox(SandboxError::Deadline {
            call: "pp_load",
            ..
        })
    ));
    // The same call with time to spare computes.
    let limits = WasmLimits {
        deadline: Duration::from_secs(5),
        ..limits
    };
    policyport_wasmtime::load(&rt, &cartpole(), limits).unwrap();
}

/// Plugin ABI 6's `pp_act_masked` called as any wasm host would: a mask pointer past the memory's end, a mask
/// whose row allows nothing and an epsilon on a policy without Q values are bad calls (-3, nothing trapped), and a
/// mask allowing only action 1 makes every draw action 1.
#[test]
fn pp_act_masked_checks_its_mask_like_every_other_range() {
    let engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&engine, plugin_wasm()).unwrap();
    let f = load_fixture("cartpole");
    let bytes = compile_fixture(&f);
    let call = ErrorCode::Call.code();
    let mut p = RawPlugin::new(&module);
    let art = p.alloc(&bytes);
    let load = p.func::<(u32, u32), i32>(policyport_abi::export::LOAD);
    let h = load.call(&mut p.store, (art, bytes.len() as u32)).unwrap();
    assert!(h >= 0, "load: {h}");
    let obs: Vec<u8> = f.io.cases[0].obs[..4]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let (obs, actions, dist) = (p.alloc(&obs), p.alloc(&[0; 4]), p.alloc(&[0; 8]));
    let only_second = p.alloc(&[0, 1]);
    let nothing = p.alloc(&[0, 0]);
    let end = p.end();
    let act = p.func::<policyport_abi::ActMaskedParams, i32>(policyport_abi::export::ACT_MASKED);
    let run = |p: &mut RawPlugin, mask: u32, eps: f32, step: u64| {
        act.call(
            &mut p.store,
            (
                h, obs, 0, 1, 0, 0, 1, 3, step, actions, 0, dist, 0, mask, eps,
            ),
        )
        .unwrap()
    };
    for bad in [end - 1, end + 64, u32::MAX - 1] {
        assert_eq!(
            run(&mut p, bad, f32::NAN, 0),
            call,
            "mask at {bad:#x} of {end:#x}"
        );
    }
    assert_eq!(run(&mut p, nothing, f32::NAN, 0), call);
    assert_eq!(run(&mut p, 0, 0.5, 0), call, "epsilon without Q values");
    for step in 0..50 {
        assert_eq!(run(&mut p, only_second, f32::NAN, step), 0);
        let mut a = [0u8; 4];
        p.memory.read(&p.store, actions as usize, &mut a).unwrap();
        assert_eq!(i32::from_le_bytes(a), 1, "step {step}");
        let mut d = [0u8; 4];
        p.memory.read(&p.store, dist as usize, &mut d).unwrap();
        assert_eq!(f32::from_le_bytes(d), f32::MIN, "the masked logit");
    }
}
