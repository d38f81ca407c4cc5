"""The package stands on its own: built as a wheel and installed (not editable) into a fresh virtual
environment, it runs, from a directory outside any checkout, a config file that starts from the
package's defaults, and reruns that run from its recorded config.json to the same scores."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

CONFIG = f'''
from stackft_jax.config import config_cli, defaults


def get_config(arg=None):
    c = defaults.get_config()
    c.model.name_or_path = "embedded:minilm"
    c.model.init = "random"
    c.model.config_overrides.hidden_size = 32
    c.model.config_overrides.num_hidden_layers = 2
    c.model.config_overrides.num_attention_heads = 4
    c.model.config_overrides.intermediate_size = 64
    c.head.cls_mlp.hidden_dim = 16
    c.data.task = "qqp"
    c.data.train_file = "{FIXTURES / "qqp" / "train.tsv"}"
    c.data.dev_file = "{FIXTURES / "qqp" / "dev.tsv"}"
    c.max_seq_length = 32
    c.per_device_batch_size = 2
    c.phase1.num_steps = 3
    c.phase1.max_train_dev_gap = 1.0
    c.phase1.gap_eval_examples = 8
    c.phase2.num_steps = 3
    c.compilation_cache_dir = "none"
    config_cli.apply_arg(c, arg, {{}})
    return c
'''


def _run(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_a_wheel_install_runs_a_config_outside_the_checkout_and_reruns_its_record(tmp_path):
    source = tmp_path / "source"  # a copy, so building leaves the checkout as it was
    no_cache = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "stackft_jax", source / "stackft_jax", ignore=no_cache)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    offline = ["--no-deps", "--no-index"]
    build = ["wheel", *offline, "--no-build-isolation", "-w", "../dist", "."]
    _run([sys.executable, "-m", "pip", "-q", *build], source)
    # The environment's own site-packages come before the system's, where the dependencies (and an
    # editable install of the checkout, if any) live: the wheel's copy is the one imported.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp_path)
    python = str(venv / "bin" / "python")
    wheel = next((tmp_path / "dist").glob("stackft_jax-*.whl"))
    _run([python, "-m", "pip", "-q", "install", *offline, str(wheel)], tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([python, "-c", "import stackft_jax; print(stackft_jax.__file__)"], elsewhere).stdout
    assert where.strip().startswith(str(venv)), where
    (elsewhere / "my_config.py").write_text(CONFIG)
    _run([python, "-m", "stackft_jax.main", "--config=my_config.py", "--workdir=first"], elsewhere)
    _run([python, "-m", "stackft_jax.main", "--config=first/config.json", "--workdir=again"], elsewhere)
    first, again = (json.loads((elsewhere / d / "results.json").read_text()) for d in ("first", "again"))
    assert first["final"]["dev"] == again["final"]["dev"]
    assert [p["steps"] for p in again["phases"]] == [3, 3]
