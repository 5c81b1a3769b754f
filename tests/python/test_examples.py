"""The README's two Python examples are these files, run here; the README must quote them verbatim."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "host" / "python" / "examples"


@pytest.mark.parametrize("name", ["rllib_ppo.py", "sb3_eval.py"])
def test_readme_quotes_the_example(name):
    code = (EXAMPLES / name).read_text().strip()
    assert len(code.splitlines()) <= 12, "the README promises short examples"
    assert code in (ROOT / "README.md").read_text(), f"README.md does not quote host/python/examples/{name} verbatim"


def _run(args, timeout):
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    p = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def test_sb3_example_runs():
    out = _run([str(EXAMPLES / "sb3_eval.py"), "tests/fixtures/sb3/ppo_cartpole/model.zip"], 120)
    assert "mean return" in out


def test_rllib_example_runs():
    out = _run([str(EXAMPLES / "rllib_ppo.py")], 240)
    lines = [line for line in out.splitlines() if line[:1].isdigit()]
    assert len(lines) == 3, out
