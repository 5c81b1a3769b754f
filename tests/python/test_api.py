"""policyport's Python API: compile from every source, load on every backend the wheel has, act() semantics,
recurrent state owned by the caller, typed errors for bad input, the GIL released during act()."""

import io
import json
import pathlib
import threading
import time

import numpy as np
import pytest
import torch

import policyport as pp

ROOT = pathlib.Path(__file__).resolve().parents[2]
FX = ROOT / "tests" / "fixtures"
# The wheel under test is built with every backend (tests/scripts/python-test.sh packs the workspace build).
BACKENDS = ["cpu", "flex", "wgpu", "torch"]


def test_the_wheel_has_every_backend():
    assert set(pp.backends()) >= set(BACKENDS), pp.backends()
    assert pp.FORMAT_VERSION[0] == 1


def test_cpu_kernels_name_the_instruction_set_and_follow_the_caps(monkeypatch):
    """The cpu backend's kernel family, read when asked: the widest the CPU has, or what the env variables cap it to."""
    import platform

    names = {"avx512", "avx2+fma", "sse+fma", "sse2", "neon", "simd128", "portable"}
    assert pp.cpu_kernels() in names
    monkeypatch.setenv("POLICYPORT_CPU_BASELINE", "1")
    assert pp.cpu_kernels() == "portable"
    monkeypatch.delenv("POLICYPORT_CPU_BASELINE")
    if platform.machine() in ("x86_64", "AMD64"):
        import re

        flags = set(re.search(r"^flags\s*:(.*)$", open("/proc/cpuinfo").read(), re.M).group(1).split())
        if {"avx512f", "fma"} <= flags:
            assert pp.cpu_kernels() == "avx512"
        monkeypatch.setenv("POLICYPORT_CPU_SIMD128", "1")
        assert pp.cpu_kernels() == ("sse+fma" if "fma" in flags else "sse2")


@pytest.fixture(scope="module")
def cartpole():
    return pp.compile(FX / "sb3" / "ppo_cartpole" / "model.zip")


def _sources():
    spaces = json.loads((FX / "cleanrl" / "ppo_cartpole" / "spaces.json").read_text())
    return {
        "sb3 path": lambda: pp.compile(FX / "sb3" / "ppo_cartpole" / "model.zip"),
        "sb3 str path": lambda: pp.compile(str(FX / "sb3" / "ppo_cartpole" / "model.zip")),
        "sb3 bytes": lambda: pp.compile((FX / "sb3" / "ppo_cartpole" / "model.zip").read_bytes()),
        "sb3 + vecnormalize": lambda: pp.compile(
            FX / "sb3" / "ppo_pendulum_vecnormalize" / "model.zip",
            vecnormalize=FX / "sb3" / "ppo_pendulum_vecnormalize" / "vecnormalize.pkl",
        ),
        "cleanrl path": lambda: pp.compile(FX / "cleanrl" / "ppo_cartpole" / "agent.pt", layout="cleanrl-ppo", spaces=spaces),
        "cleanrl in-memory state dict": lambda: pp.compile_state_dict(
            torch.load(FX / "cleanrl" / "ppo_cartpole" / "agent.pt", weights_only=True), layout="cleanrl-ppo", spaces=spaces
        ),
        "rllib checkpoint": lambda: pp.compile(FX / "rllib" / "ppo_cartpole" / "checkpoint"),
        "rllib lstm checkpoint": lambda: pp.compile(FX / "rllib" / "ppo_lstm_cartpole" / "checkpoint"),
        "onnx + spec path": lambda: pp.compile(FX / "mlp64" / "policy.onnx", spec=FX / "mlp64" / "import.json"),
        "onnx + spec dict": lambda: pp.compile(
            (FX / "mlp64" / "policy.onnx").read_bytes(), spec=json.loads((FX / "mlp64" / "import.json").read_text())
        ),
        "onnx bf16": lambda: pp.compile(FX / "mlp64" / "policy.onnx", spec=FX / "mlp64" / "import.json", storage="bf16"),
    }


@pytest.mark.parametrize("name", list(_sources()))
@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_load_verify_on_every_backend(name, backend):
    art = _sources()[name]()
    assert isinstance(art, bytes) and art[:8] == b"POLICYPT"
    p = pp.Policy.load(art, backend)
    assert p.info.backend == backend
    reports = p.verify()
    assert reports and all(r["passed"] for r in reports), reports


def test_load_from_path_and_auto(tmp_path, cartpole):
    f = tmp_path / "c.policy"
    f.write_bytes(cartpole)
    assert pp.Policy.load(f).info.name == pp.Policy.load(str(f)).info.name
    auto = pp.Policy.load(cartpole, "auto", batch=16)
    assert auto.info.selection and auto.info.selection.startswith("auto at batch 16")


def test_act_shapes_dtypes_and_seeded_sampling(cartpole):
    p = pp.Policy.load(cartpole)
    obs = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32)
    a = p.act(obs, seed=3, step=5)
    assert a.actions.shape == (7,) and a.actions.dtype == np.int64
    assert a.value.shape == (7,) and a.value.dtype == np.float32
    assert a.dist_inputs.shape == (7, 2) and a.log_prob.shape == (7,)
    # Same (seed, env, step): same draws, on every backend; another step: other draws somewhere.
    b = p.act(obs, seed=3, step=5)
    np.testing.assert_array_equal(a.actions, b.actions)
    for backend in BACKENDS[1:]:
        q = pp.Policy.load(cartpole, backend)
        np.testing.assert_array_equal(q.act(obs, seed=3, step=5).actions, a.actions)
    many = np.repeat(obs[:1], 256, axis=0)
    draws = [p.act(many, seed=3, step=s).actions for s in range(4)]
    assert len({d.tobytes() for d in draws}) == 4
    # log_prob is the categorical's at the returned action.
    logits = a.dist_inputs.astype(np.float64)
    lsm = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(1, keepdims=True)
    np.testing.assert_allclose(a.log_prob, lsm[np.arange(7), a.actions], rtol=1e-5, atol=1e-6)
    # value=False: no value estimate, everything else the same (bit for bit), on every backend.
    for backend in BACKENDS:
        q = pp.Policy.load(cartpole, backend)
        full, bare = q.act(obs, seed=3, step=5), q.act(obs, seed=3, step=5, value=False)
        assert bare.value is None and full.value is not None
        np.testing.assert_array_equal(bare.actions, full.actions)
        np.testing.assert_array_equal(bare.dist_inputs, full.dist_inputs)
        np.testing.assert_array_equal(bare.log_prob, full.log_prob)
    # float64 and lists are converted; deterministic is the argmax.
    d = p.act(obs.astype(np.float64).tolist(), deterministic=True)
    np.testing.assert_array_equal(d.actions, a.dist_inputs.argmax(1))


def test_gaussian_log_prob_matches_torch():
    art = pp.compile(FX / "rllib" / "ppo_pendulum_clip_actions" / "checkpoint")
    p = pp.Policy.load(art)
    obs = np.random.default_rng(1).normal(size=(5,) + tuple(p.info.obs_shape)).astype(np.float32)
    out = p.act(obs, seed=1)
    # clip_actions: the returned action was clipped, its density is not the Gaussian's: no log_prob.
    assert out.log_prob is None
    mod = pp.compile_rllib_module(
        (FX / "rllib" / "ppo_pendulum_clip_actions" / "checkpoint" / "learner_group" / "learner" / "rl_module" / "default_policy" / "module_state.pkl").read_bytes(),
        (FX / "rllib" / "ppo_pendulum_clip_actions" / "checkpoint" / "learner_group" / "learner" / "rl_module" / "default_policy" / "class_and_ctor_args.pkl").read_bytes(),
    )
    m = pp.Policy.load(mod)
    o = m.act(obs, seed=1)
    k = m.info.action_len
    mean, log_std = torch.from_numpy(o.dist_inputs[:, :k]), torch.from_numpy(o.dist_inputs[:, k:])
    want = torch.distributions.Normal(mean, log_std.exp()).log_prob(torch.from_numpy(o.actions)).sum(-1)
    np.testing.assert_allclose(o.log_prob, want.numpy(), rtol=1e-5, atol=1e-5)


def test_caller_owned_recurrent_state_matches_session_state():
    art = pp.compile(FX / "sb3" / "recurrent_ppo_cartpole" / "model.zip")
    held = pp.Policy.load(art)
    names = [n for n, _ in held.info.states]
    assert names[0] == "lstm_actor.l0.h", names
    rng = np.random.default_rng(2)
    ids = np.array([5, 1, 9])
    state = [np.zeros((3, k), np.float32) for _, k in held.info.states]
    for backend in BACKENDS:
        owned = pp.Policy.load(art, backend)
        session = pp.Policy.load(art, backend)
        st = [s.copy() for s in state]
        for t in range(4):
            obs = rng.normal(size=(3, 4)).astype(np.float32)
            starts = np.array([t == 2, False, False])
            a = session.act(obs, seed=4, step=t, env_ids=ids, episode_starts=starts, return_state=True)
            b = owned.act(obs, seed=4, step=t, env_ids=ids, episode_starts=starts, state=st)
            np.testing.assert_array_equal(a.actions, b.actions)
            for x, y in zip(a.state, b.state):
                np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
            st = b.state
        got = session.get_state(ids)
        for x, y in zip(got, st):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
        session.set_state([9], [s[2:3] * 0 for s in st])
        assert all(np.all(s[2] == 0) for s in session.get_state([5, 1, 9])) and session.num_envs >= 10
        session.reset(ids)
        assert all(np.all(s == 0) for s in session.get_state(ids))


def test_typed_errors_and_nothing_lost(cartpole):
    p = pp.Policy.load(cartpole)
    good = np.zeros((2, 4), np.float32)
    before = p.act(good, seed=1).actions
    cases = [
        (lambda: pp.Policy.load(b"garbage"), pp.ArtifactError),
        (lambda: pp.Policy.load(cartpole[:1000]), pp.ArtifactError),
        (lambda: pp.Policy.load(cartpole, "vulkan"), ValueError),
        (lambda: pp.Policy.load(cartpole, "wasmtime"), ValueError),
        (lambda: pp.Policy.load(cartpole, "torch", device="cuda:99"), pp.BackendError),
        (lambda: pp.Policy.load(cartpole, "torch", precision="f8"), ValueError),
        (lambda: p.act(np.zeros((2, 5), np.float32)), pp.ObservationError),
        (lambda: p.act(np.zeros(4, np.float32)), pp.ObservationError),
        (lambda: p.act(np.zeros((0, 4), np.float32)), pp.BatchError),
        (lambda: p.act(np.full((2, 4), np.nan, np.float32)), pp.ObservationError),
        (lambda: p.act(good, env_ids=[0]), pp.EnvIdError),
        (lambda: p.act(good, env_ids=[-1, 0]), pp.EnvIdError),
        (lambda: p.act(good, env_ids=[2**32, 0]), pp.EnvIdError),
        # A wrong number of flags is a malformed call (kind "call"), as in C, the plugin and the browser.
        (lambda: p.act(good, episode_starts=[True]), pp.EpisodeStartsError),
        (lambda: p.set_state([0], []), pp.StateError),
        (lambda: p.act("not an array"), (pp.ObservationError, ValueError)),
        (lambda: pp.compile(b"\x00" * 64, spec={}), pp.CompileError),
        (lambda: pp.compile(FX / "cleanrl" / "ppo_cartpole" / "agent.pt"), pp.SpecError),
        (lambda: pp.compile(FX / "mlp64" / "policy.onnx"), pp.SpecError),
        (lambda: pp.compile(FX / "mlp64"), pp.MalformedModelError),
        (lambda: pp.compile(FX / "does-not-exist.zip"), OSError),
        (lambda: pp.compile_rllib_module(b"x", b"y"), pp.CompileError),
    ]
    for fn, exc in cases:
        with pytest.raises(exc):
            fn()
    assert issubclass(pp.NotCompiledError, pp.BackendError) and issubclass(pp.UnsupportedModelError, pp.CompileError)
    # Each class carries the core's kind name, inherited by its finer subclasses.
    kinds = {
        pp.ArtifactError: "artifact", pp.ObservationError: "observation", pp.CallError: "call",
        pp.BatchError: "call", pp.EnvIdError: "call", pp.ActionMaskError: "call", pp.EpisodeStartsError: "call",
        pp.StateError: "state", pp.BackendError: "backend", pp.NotCompiledError: "backend",
        pp.MemoryLimitError: "too_large", pp.NonFiniteOutputError: "non_finite", pp.CompileError: None,
        pp.PolicyportError: None,
    }
    for cls, kind in kinds.items():
        assert cls.kind == kind, (cls, cls.kind)
    np.testing.assert_array_equal(p.act(good, seed=1).actions, before)


def test_damaged_trainer_files_are_named_not_sent_to_the_onnx_route():
    # Issue 36: these fell through to the ONNX route and asked for a spec. Each is named by what it is now.
    real = (FX / "sb3" / "ppo_cartpole" / "model.zip").read_bytes()
    buf = io.BytesIO()
    import zipfile

    with zipfile.ZipFile(io.BytesIO(real)) as z, zipfile.ZipFile(buf, "w") as out:
        out.writestr("data", z.read("data"))
    cases = [
        (b"", "empty"),
        (real[: len(real) // 2], "cannot be read"),
        (buf.getvalue(), "without its 'policy.pth'"),
        (b"\xff\xfe not a model", "not a model file"),
    ]
    for bytes_, want in cases:
        with pytest.raises(pp.MalformedModelError, match=want):
            pp.compile(bytes_)


def test_recurrent_state_errors_change_nothing():
    p = pp.Policy.load(pp.compile(FX / "sb3" / "recurrent_ppo_cartpole" / "model.zip"))
    obs = np.zeros((2, 4), np.float32)
    ok = p.act(obs, seed=1, env_ids=[0, 1], return_state=True).state
    sizes = [k for _, k in p.info.states]
    bad = [
        ([np.zeros((2, k), np.float32) for k in sizes[:-1]], pp.StateError),  # one tensor short
        ([np.zeros((2, k + 1), np.float32) for k in sizes], pp.StateError),  # wrong width
        ([np.full((2, k), np.inf, np.float32) for k in sizes], pp.StateError),  # not finite
    ]
    for st, exc in bad:
        with pytest.raises(exc):
            p.act(obs, seed=1, env_ids=[0, 1], state=st)
    with pytest.raises(pp.EnvIdError):
        p.act(obs, seed=1, env_ids=[3, 3])
    for x, y in zip(p.get_state([0, 1]), ok):
        np.testing.assert_array_equal(x, y)


def test_a_refused_call_with_state_changes_nothing_and_checks_every_argument_first():
    # Issue 36: state= was written before the episode starts were checked (a refused call changed the session);
    # a [numel, batch] state was read as [batch, numel]; float env ids were truncated; a broadcast view of 10^9
    # rows was copied (15 GB) before its batch was checked.
    p = pp.Policy.load(pp.compile(FX / "sb3" / "recurrent_ppo_cartpole" / "model.zip"))
    obs = np.zeros((2, 4), np.float32)
    p.act(obs, seed=1, env_ids=[0, 1])
    before = [x.copy() for x in p.get_state([0, 1])]
    ones = [np.ones((2, k), np.float32) for _, k in p.info.states]
    with pytest.raises(pp.EpisodeStartsError):
        p.act(obs, seed=1, env_ids=[0, 1], state=ones, episode_starts=[True])  # one start for two rows
    with pytest.raises(pp.ObservationError):
        p.act(np.zeros((2, 5), np.float32), seed=1, env_ids=[0, 1], state=ones)
    for x, y in zip(p.get_state([0, 1]), before):
        np.testing.assert_array_equal(x, y)
    assert p.num_envs == 2
    # A transposed state (same count of numbers) is refused by its shape.
    k0 = p.info.states[0][1]
    transposed = [np.ones((k, 2), np.float32) for _, k in p.info.states]
    with pytest.raises(pp.StateError, match=rf"\[2, {k0}\]"):
        p.act(obs, seed=1, env_ids=[0, 1], state=transposed)
    with pytest.raises(pp.StateError):
        p.set_state([0, 1], transposed)
    # Env ids must be integers.
    with pytest.raises(pp.EnvIdError, match="integers"):
        p.act(obs, seed=1, env_ids=np.array([0.0, 1.7]))
    # A billion broadcast rows: the batch limit answers before any copy.
    huge = np.broadcast_to(np.zeros(4, np.float32), (10**9, 4))
    with pytest.raises(pp.BatchError):
        p.act(huge)
    for x, y in zip(p.get_state([0, 1]), before):
        np.testing.assert_array_equal(x, y)


def test_gil_is_released_during_act():
    # One long act() in a thread while this thread keeps running Python: with the GIL held through the native
    # call, this thread would stall for the whole call (native code never yields the GIL by itself).
    p = pp.Policy.load(pp.compile(FX / "nature_cnn" / "policy.onnx", spec=FX / "nature_cnn" / "import.json"))
    obs = np.random.default_rng(0).integers(0, 255, size=(512,) + tuple(p.info.obs_shape)).astype(np.float32)
    t0 = time.perf_counter()
    p.act(obs)
    call = time.perf_counter() - t0
    assert call > 0.05, f"the act() must be long enough to see a stall ({call:.3f} s)"
    done = threading.Event()
    t = threading.Thread(target=lambda: (p.act(obs), done.set()))
    stamps = []
    t.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
    t.join()
    gaps = np.diff(stamps) if len(stamps) > 1 else np.array([call])
    assert gaps.max() < call / 2, (gaps.max(), call)


def test_sessions_share_weights_and_threads_act_concurrently(cartpole):
    p = pp.Policy.load(cartpole)
    obs = np.random.default_rng(3).normal(size=(32, 4)).astype(np.float32)
    want = p.act(obs, seed=9, step=1).actions
    results = []

    def worker():
        s = p.new_session()
        for _ in range(50):
            results.append(np.array_equal(s.act(obs, seed=9, step=1).actions, want))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(results) == 200 and all(results)


def test_info_is_dataclass_like(cartpole):
    info = pp.Policy.load(cartpole).info
    d = info.as_dict()
    assert d["obs_shape"] == [4] and d["discrete"] is True and d["action"] == {"kind": "discrete", "n": 2}
    assert d["action_masks"] is False and info.action_masks is False
    assert "PolicyInfo(" in repr(info)
    with pytest.raises(AttributeError):
        info.name = "x"


def test_intra_op_threads_give_the_same_answers_and_refuse_typed():
    art = pp.compile(FX / "mlp64" / "policy.onnx", spec=FX / "mlp64" / "import.json")
    one = pp.Policy.load(art)
    many = pp.Policy.load(art, threads=3)
    assert one.threads == 1 and many.threads == 3
    obs = np.random.default_rng(4).normal(size=(200, 64)).astype(np.float32)
    for step in range(3):
        a, b = one.act(obs, seed=2, step=step), many.act(obs, seed=2, step=step)
        assert np.array_equal(a.actions, b.actions) and np.array_equal(a.value, b.value)
        assert np.array_equal(a.dist_inputs, b.dist_inputs)
    # The forced split and the measured one (the default) over enough steps for the measured one to probe the
    # calling thread alone (its 17th-20th of a batch size): one thread's answers throughout.
    assert many.thread_split == "measured"
    forced = pp.Policy.load(art, threads=3)
    forced.set_thread_split("always")
    assert forced.thread_split == "always"
    for step in range(24):
        a = one.act(obs, seed=3, step=step)
        for other in (many, forced):
            b = other.act(obs, seed=3, step=step)
            assert np.array_equal(a.actions, b.actions) and np.array_equal(a.dist_inputs, b.dist_inputs)
    with pytest.raises(ValueError, match="thread split"):
        many.set_thread_split("sometimes")
    assert many.thread_split == "measured"
    many.set_threads(1)
    assert many.threads == 1
    with pytest.raises(pp.BackendError):
        pp.Policy.load(art, backend="flex", threads=2)
    with pytest.raises(pp.BackendError):
        many.set_threads(100_000)
    assert many.threads == 1


def _cpu_has_avx512_bf16():
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags and " avx512f" in flags


@pytest.mark.skipif(not _cpu_has_avx512_bf16(), reason="needs a CPU with AVX512-BF16")
def test_cpu_bf16_is_close_to_f32_and_deterministic():
    art = pp.compile(FX / "mlp64" / "policy.onnx", spec=FX / "mlp64" / "import.json")
    f32, bf16 = pp.Policy.load(art), pp.Policy.load(art, precision="bf16")
    obs = np.random.default_rng(5).normal(size=(100, 64)).astype(np.float32)
    a, b = f32.act(obs, seed=2, step=0), bf16.act(obs, seed=2, step=0)
    # bf16 rounding is visible (the bf16 kernels ran) and small (~3 significant digits per layer).
    err = np.abs(a.dist_inputs - b.dist_inputs).max() / np.abs(a.dist_inputs).max()
    assert 1e-5 < err < 2e-2, err
    assert np.array_equal(b.dist_inputs, bf16.act(obs, seed=2, step=0).dist_inputs)


def test_cpu_precision_names_are_checked():
    art = pp.compile(FX / "mlp64" / "policy.onnx", spec=FX / "mlp64" / "import.json")
    with pytest.raises(ValueError):
        pp.Policy.load(art, precision="fp8")
    with pytest.raises(ValueError):
        pp.Policy.load(art, backend="flex", precision="bf16")
    if not _cpu_has_avx512_bf16():
        with pytest.raises(pp.BackendError):
            pp.Policy.load(art, precision="bf16")


def test_the_refusal_table_reports_the_same_kinds_and_changes_nothing():
    """tests/expected/refusals.json, the table the Rust suite drives through Session, the C ABI and the plugin and
    the browser suite through the JS API: each refused call raises the class of its kind (`exc.kind`, the core's
    ErrorKind name) and changes nothing, so the next good call equals, bit for bit, a session that saw none."""
    table = json.loads((ROOT / "tests" / "expected" / "refusals.json").read_text())
    policy = (ROOT / "tests" / "expected" / table["policy"]).read_bytes()
    good = [
        dict(obs=np.asarray(g["obs"], np.float32).reshape(-1, table["obs_len"]), env_ids=g["env_ids"])
        for g in table["good"]
    ]
    for backend in BACKENDS:
        for case in table["load"]:
            with pytest.raises(pp.PolicyportError) as e:
                pp.Policy.load(case["bytes"].encode(), backend)
            assert e.value.kind == case["kind"], (backend, case["name"], e.value)
        control = pp.Policy.load(policy, backend)
        control.act(good[0]["obs"], deterministic=True, env_ids=good[0]["env_ids"])
        want = control.act(good[1]["obs"], deterministic=True, env_ids=good[1]["env_ids"]).dist_inputs
        p = pp.Policy.load(policy, backend)
        p.act(good[0]["obs"], deterministic=True, env_ids=good[0]["env_ids"])
        for case in table["cases"]:
            if "python" in case.get("not_in", []):
                continue
            obs = np.asarray([np.nan if v is None else v for v in case["obs"]], np.float32)
            if case["name"] != "observation_length":
                obs = obs.reshape(-1, table["obs_len"])
            kwargs = dict(deterministic=True)
            if "env_ids" in case:
                kwargs["env_ids"] = case["env_ids"]
            if "episode_starts" in case:
                kwargs["episode_starts"] = np.asarray(case["episode_starts"], bool)
            if "action_mask" in case:
                mask = np.asarray(case["action_mask"], bool)
                kwargs["action_mask"] = mask.reshape(-1, table["actions"]) if mask.size % table["actions"] == 0 else mask
            if "epsilon" in case:
                kwargs["epsilon"] = case["epsilon"]
            with pytest.raises(pp.PolicyportError) as e:
                p.act(obs, **kwargs)
            assert e.value.kind == case["kind"], (backend, case["name"], type(e.value).__name__, e.value)
        got = p.act(good[1]["obs"], deterministic=True, env_ids=good[1]["env_ids"]).dist_inputs
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (backend, got, want)


def test_hostile_inputs_are_typed_errors_in_python(cartpole):
    """The Python column of the hostile-input table (tests/scripts/hostile_table.py): every hostile artifact the
    conformance suite wrote (<target>/hostile-native, each at its native size) loaded through the wheel, and the
    table's bad calls made through act(), and the hostile trainer files (<target>/hostile-trainer) through
    compile(); each must be a typed PolicyportError of the right kind. Results go to <target>/python-hostile.json
    for the table."""
    import os

    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    corpus = target / "hostile-native"
    if not corpus.is_dir():
        pytest.skip(f"no hostile corpus at {corpus}: the conformance suite writes it (run it first)")
    results, broken = {}, []

    def record(key, fn, want):
        try:
            fn()
        except pp.PolicyportError as e:
            results[key] = f"{type(e).__name__}{f' ({e.kind})' if e.kind else ''}: {e}"
            if not isinstance(e, want):
                broken.append(f"{key}: {type(e).__name__}, want {want.__name__}")
            return
        except Exception as e:  # noqa: BLE001 - any other exception breaks the contract
            results[key] = f"untyped {type(e).__name__}: {e}"
        else:
            results[key] = "accepted"
        broken.append(f"{key}: {results[key]}")

    files = sorted(corpus.glob("*.policy"))
    assert len(files) >= 10, files
    for f in files:
        record(f.name, lambda f=f: pp.Policy.load(f.read_bytes(), "cpu"), pp.ArtifactError)
    p = pp.Policy.load(cartpole, "cpu")
    before = p.act(np.zeros((2, 4), np.float32), seed=3).actions
    record("NaN observation", lambda: p.act(np.array([[0.0, np.nan, 0.0, 0.0]], np.float32)), pp.ObservationError)
    record("3 numbers for a 4-number observation", lambda: p.act(np.zeros((1, 3), np.float32)), pp.ObservationError)
    record("batch 0", lambda: p.act(np.zeros((0, 4), np.float32)), pp.BatchError)
    record("env ids past u32::MAX",
           lambda: p.act(np.zeros((2, 4), np.float32), env_ids=[2**32 - 1, 2**32]), pp.EnvIdError)
    np.testing.assert_array_equal(p.act(np.zeros((2, 4), np.float32), seed=3).actions, before)
    # The trainer-file rows (tests/conformance/trainer_files.rs wrote the files): compile refuses each, typed.
    trainer = sorted((target / "hostile-trainer").glob("*.model"))
    assert len(trainer) >= 8, trainer
    for f in trainer:
        record(f.name, lambda f=f: pp.compile(f), pp.CompileError)
    (target / "python-hostile.json").write_text(json.dumps(results, indent=1))
    assert not broken, broken
