"""A config file that does not load, or sets a key that does not exist, is one `error:` line naming the
file and line, through the real command lines; keys that cannot mean anything are refused before any
work; every committed run and grid still loads."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stackft_jax.config import config_cli, defaults
from stackft_jax.runtime import cli_errors

REPO = Path(__file__).resolve().parent.parent

# Every key of the defaults but `phases` (a list of blocks); a config holding only `seed` lacks the rest.
_DEFAULT_KEYS = set(config_cli.flat_keys(defaults.get_config()))
_ON_DEFAULTS = "from stackft_jax.config import config_cli, defaults\n\n\ndef get_config(arg=None):\n"


def _command(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def _refused(proc: subprocess.CompletedProcess, status: int, message: str, workdir: Path) -> None:
    """One line, `error: <message>`, the status, no traceback, nothing written."""
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1:]) == (status, [f"error: {message}"]), (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not workdir.exists()


# (file text, status, message after `error: FILE`): each config file as a newcomer or a hostile tester
# writes it.
BROKEN_FILES = {
    "syntax_error": (_ON_DEFAULTS.replace("arg=None):", "arg=None)"), 1, ":4: SyntaxError: expected ':'"),
    "exception_in_get_config": (
        _ON_DEFAULTS + "    c = defaults.get_config()\n    c.seed = int('three')\n    return c\n",
        1,
        ":6: ValueError: invalid literal for int() with base 10: 'three'",
    ),
    "exception_at_import": ("raise RuntimeError('not\\nready')\n", 1, ":1: RuntimeError: not ready"),
    "missing_import": (
        "import no_such_module_h47\n\n" + _ON_DEFAULTS + "    return defaults.get_config()\n",
        1,
        ":1: ModuleNotFoundError: No module named 'no_such_module_h47'",
    ),
    "plain_dict": (
        "def get_config(arg=None):\n    return {'seed': 1}\n",
        1,
        ": get_config(arg) returned a dict, not an ml_collections.ConfigDict (start from "
        "stackft_jax.config.defaults.get_config())",
    ),
    "no_get_config": ("SEED = 1\n", 1, ": no get_config(arg) function; is it a config file?"),
    # On defaults.get_config() (locked): the command line's "did you mean" line, at the file's line.
    "typo_on_defaults": (
        _ON_DEFAULTS + "    c = defaults.get_config()\n    c.phase1.num_step = 3\n"
        "    config_cli.apply_arg(c, arg, {})\n    return c\n",
        2,
        ":6: config key 'phase1.num_step' does not exist; did you mean 'phase1.num_steps'?",
    ),
    "typo_read": (
        _ON_DEFAULTS + "    c = defaults.get_config()\n    c.phase2.num_steps = c.phase1.num_step\n"
        "    return c\n",
        2,
        ":6: config key 'phase1.num_step' does not exist; did you mean 'phase1.num_steps'?",
    ),
    "typo_in_a_head_block": (
        _ON_DEFAULTS + "    c = defaults.get_config()\n    head = c.head\n    head['cls_mlp'].hiden_dim = 3\n"
        "    return c\n",
        2,
        ":7: config key 'head.cls_mlp.hiden_dim' does not exist; did you mean 'head.cls_mlp.hidden_dim'?",
    ),
    # Unlocked on purpose: the key is still one nothing reads.
    "typo_on_an_unlocked_config": (
        _ON_DEFAULTS + "    c = defaults.get_config()\n    c.unlock()\n    c.model.dropout_rat = 0.2\n"
        "    return c\n",
        2,
        ": config key 'model.dropout_rat' does not exist; did you mean 'model.dropout_rate'?",
    ),
    "missing_keys": (
        "import ml_collections\n\n\ndef get_config(arg=None):\n"
        "    return ml_collections.ConfigDict({'seed': 1})\n",
        1,
        ": get_config(arg) returned a config without the key 'adaptation.adapters.activation' "
        f"({len(_DEFAULT_KEYS) - 2} missing): start from stackft_jax.config.defaults.get_config()",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_FILES))
def test_a_config_file_that_does_not_load_is_a_users_mistake_with_one_line(tmp_path, case):
    """What the command line's boundary prints and exits with (cli_errors.guarded), in process."""
    text, status, message = BROKEN_FILES[case]
    config_file = tmp_path / f"{case}.py"
    config_file.write_text(text)
    with pytest.raises(BaseException) as raised:  # whatever the file raises: classified below
        config_cli.load(str(config_file), [], kind="run")
    assert cli_errors.exit_code_of(raised.value) == status, raised.value
    assert cli_errors.message_of(raised.value) == f"{config_file}{message}"


# Through the command line itself (status, no traceback, nothing written): two cases, one per status,
# in the fast tier; the rest in the full suite (each starts an interpreter, about 4 s).
_CLI_FAST = {"syntax_error", "typo_on_defaults"}


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=() if c in _CLI_FAST else pytest.mark.slow) for c in sorted(BROKEN_FILES)]
)
def test_a_config_file_that_does_not_load_is_one_line(tmp_path, case):
    text, status, message = BROKEN_FILES[case]
    config_file = tmp_path / f"{case}.py"
    config_file.write_text(text)
    proc = _command("stackft_jax.main", f"--config={config_file}", f"--workdir={tmp_path / 'run'}")
    _refused(proc, status, f"{config_file}{message}", tmp_path / "run")


def test_a_config_file_built_on_another_names_the_typo_and_its_line(tmp_path):
    config_file = tmp_path / "on_tiny.py"
    config_file.write_text(
        "from configs import tiny\n\n\ndef get_config(arg=None):\n    c = tiny.get_config(arg)\n"
        "    c.phase1.learnig_rate = 0.1\n    return c\n"
    )
    proc = _command("stackft_jax.main", f"--config={config_file}", f"--workdir={tmp_path / 'run'}")
    message = "config key 'phase1.learnig_rate' does not exist; did you mean 'phase1.learning_rate'?"
    _refused(proc, 2, f"{config_file}:6: {message}", tmp_path / "run")


def test_an_error_in_an_imported_config_file_names_that_file(tmp_path):
    (tmp_path / "base_h47.py").write_text(_ON_DEFAULTS + "    return defaults.get_config(arg)\n")
    config_file = tmp_path / "derived.py"
    config_file.write_text(
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport base_h47\n\n\n"
        "def get_config(arg=None):\n    return base_h47.get_config(arg)\n"
    )
    proc = _command("stackft_jax.main", f"--config={config_file}", f"--workdir={tmp_path / 'run'}")
    message = "TypeError: get_config() takes 0 positional arguments but 1 was given"
    _refused(proc, 1, f"{tmp_path / 'base_h47.py'}:5: {message}", tmp_path / "run")


@pytest.mark.slow
def test_a_data_file_given_as_config_is_one_line():
    data = REPO / "tests" / "fixtures" / "qqp" / "train.tsv"
    for module in ("stackft_jax.main", "stackft_jax.experiment"):
        proc = _command(module, f"--config={data}", "--workdir=/nonexistent/h47/run")
        message = (
            f"--config={data}: {data} is no config file: give a Python file with get_config(arg) "
            "(FILE.py), or a run's config.json or results.json"
        )
        _refused(proc, 1, message, Path("/nonexistent/h47/run"))


def test_a_grid_config_file_that_does_not_load_is_one_line(tmp_path):
    config_file = tmp_path / "grid.py"
    config_file.write_text(
        "import ml_collections\n\n\ndef get_config(arg=None):\n    c = ml_collections.ConfigDict()\n"
        "    c.base = 'configs/tiny.py'\n    c.num_seeds = 1 / 0\n    return c\n"
    )
    proc = _command("stackft_jax.experiment", f"--config={config_file}", f"--workdir={tmp_path / 'grid'}")
    _refused(proc, 1, f"{config_file}:7: ZeroDivisionError: division by zero", tmp_path / "grid")


# Keys that cannot mean anything, refused whether the strategy reads them or not (tiny.py runs
# stack_and_finetune: no adaptation kind, a phase-2 without a gap rule).
MEANINGLESS = {
    "adaptation.lora.alpha=0": "adaptation.lora.alpha=0.0: a positive number (the update's scale)",
    "adaptation.lora.alpha=-16": "adaptation.lora.alpha=-16.0: a positive number (the update's scale)",
    "adaptation.lora.rank=0": "adaptation.lora.rank=0: a positive integer",
    "adaptation.lora.targets=query|vlaue": (
        "adaptation.lora.targets='query|vlaue': its alternative 'vlaue' fullmatches none of the "
        "projections query, key, value, attention_output, intermediate, output"
    ),
    "adaptation.adapters.bottleneck=-4": "adaptation.adapters.bottleneck=-4: a positive integer",
    "strategy=finetune_only,phase1.gap_metric=bogus": (
        "config.phase1.gap_metric='bogus': data.task='qqp' scores ['accuracy', 'f1']; choose one of "
        "those, or '' for its primary one"
    ),
    "seed=4294967296": "config.seed=4294967296: choose a seed of at most 2**31 - 1 (2147483647)",
    "head.cls_mlp.hidden_dim=-3": "config.head.cls_mlp.hidden_dim=-3: a size or count, at least 1",
    "head.esim.lstm_units=0": "config.head.esim.lstm_units=0: a size or count, at least 1",
    "head.token_mlp.lstm_layers=-1": (
        "config.head.token_mlp.lstm_layers=-1: a size or count, 0 or more (0: none)"
    ),
    "unfreezing.layers_per_phase=0": "config.unfreezing.layers_per_phase must be at least 1",
    "model.config_overrides.num_attention_heads=-4": (
        "config.model.config_overrides.num_attention_heads=-4: a size or count, 0 or more (0: config.json's)"
    ),
}


@pytest.mark.parametrize("item", sorted(MEANINGLESS))
def test_a_key_that_cannot_mean_anything_is_refused_before_any_work(tmp_path, item):
    from configs import tiny
    from stackft_jax.config import spec
    from stackft_jax.runtime.cli_errors import ConfigError

    with pytest.raises(ConfigError) as error:
        spec.resolve(tiny.get_config(item))
    assert str(error.value) == MEANINGLESS[item]


def test_a_meaningless_key_through_the_command_line(tmp_path):
    """One of them end to end (the others take the same path, spec.resolve, before any work)."""
    workdir = tmp_path / "run"
    proc = _command(
        "stackft_jax.main",
        "--config=configs/tiny.py",
        "--config.adaptation.lora.alpha=0",
        f"--workdir={workdir}",
    )
    _refused(proc, 2, MEANINGLESS["adaptation.lora.alpha=0"], workdir)


@pytest.mark.parametrize(
    ("targets", "alternative"),
    [
        ("(query|vlaue)", "vlaue"),
        ("(?:query|kye)|value", "kye"),
        ("query|(attention_)?outptu", "(attention_)?outptu"),
        ("intermediate|attention_(output|input)", "input"),
    ],
)
def test_every_alternative_of_lora_targets_names_a_projection(targets, alternative):
    from stackft_jax.models.adaptation import LoraSettings
    from stackft_jax.runtime.cli_errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(f"its alternative '{alternative}' fullmatches none")):
        LoraSettings(rank=8, alpha=16.0, dropout=0.0, targets=targets)
    for good in ("query|value", ".*", "query|key|value|attention_output", "intermediate|(attention_)?output"):
        assert LoraSettings(rank=8, alpha=16.0, dropout=0.0, targets=good).projections


@pytest.mark.slow
def test_every_committed_run_still_loads_as_its_rerun_does(monkeypatch):
    """`--config=RUN/config.json` (config_cli.load, then spec.resolve) for every run under docs/grids:
    the new checks refuse none of them (their data files aside, which live outside the repository)."""
    from stackft_jax.config import config_cli, spec

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(spec, "check_files_exist", lambda run_spec: None)
    records = sorted(REPO.glob("docs/grids/*/runs/*/config.json"))
    assert len(records) >= 400
    for record in records:
        spec.resolve(config_cli.load(str(record), kind="run"))


_GRID_FILE = """import ml_collections


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.base = "configs/tiny.py"
    c.axes = "strategy=finetune_only|stack_and_finetune"
    c.num_seeds = 2
    c.baseline = "strategy=finetune_only"
    c.metric = "accuracy"
    {extra}
    return c
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "c.comparisons = ';;;'",
            "config key 'comparisons' = ';;;' names no comparison: write `<cell name> vs <cell name>; ...` "
            "and/or `baseline` (the default)",
        ),
        ("c.comparisons = ''", "config key 'comparisons' = '' names no comparison"),
        ("c.num_seed = 3", "config key 'num_seed' does not exist; did you mean 'num_seeds'?"),
        ("c.paper_result = ''", "config key 'paper_result' does not exist; did you mean 'paper_results'?"),
    ],
)
def test_a_grid_config_that_cannot_mean_anything_is_refused_before_any_run(tmp_path, extra, message):
    from stackft_jax.config import config_cli
    from stackft_jax.experiments import grid
    from stackft_jax.runtime.cli_errors import ConfigError

    config_file = tmp_path / "grid.py"
    config_file.write_text(_GRID_FILE.format(extra=extra))
    with pytest.raises(ConfigError) as error:
        grid.plan_grid(config_cli.load(str(config_file), kind="grid"), tmp_path / "grid")
    assert str(error.value).startswith(message)
    assert not (tmp_path / "grid").exists()


def test_empty_comparisons_through_the_experiment_command(tmp_path):
    config_file = tmp_path / "grid.py"
    config_file.write_text(_GRID_FILE.format(extra="c.comparisons = ';;;'"))
    proc = _command("stackft_jax.experiment", f"--config={config_file}", f"--workdir={tmp_path / 'grid'}")
    message = (
        "config key 'comparisons' = ';;;' names no comparison: write `<cell name> vs <cell name>; ...` "
        "and/or `baseline` (the default)"
    )
    _refused(proc, 2, message, tmp_path / "grid")


def _finished_run(workdir: Path, run, dev: dict[str, float]) -> None:
    """A finished run's files as train.run writes them (results.json, dev predictions, metrics.jsonl)."""
    from stackft_jax.training import prediction_files

    run_dir = workdir / "runs" / run.name
    run_dir.mkdir(parents=True)
    results = {"final": {"dev": dev}, "final_params": "last", "phases": [{"phase": "phase2", "steps": 2}]}
    (run_dir / "results.json").write_text(json.dumps(results))
    records = [{"key": f"ex{i}", "prediction": 1, "label": 1, "probabilities": [0.0, 1.0]} for i in range(2)]
    prediction_files.write(prediction_files.path(run_dir, "dev"), records)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"split": "dev", "global_step": 2, **dev}) + "\n")


def test_a_loss_grid_reports_a_lower_loss_as_a_gain(tmp_path):
    import ml_collections

    from stackft_jax.experiments import cells, grid_report, markdown

    g = ml_collections.ConfigDict(
        {
            "base": "configs/tiny.py",
            "axes": "strategy=finetune_only|stack_and_finetune",
            "num_seeds": 3,
            "baseline": "strategy=finetune_only",
            "metric": "loss",
            "ensembles": "",
        }
    )
    loss = {"finetune_only": [0.50, 0.52, 0.51], "stack_and_finetune": [0.40, 0.41, 0.43]}
    for run in cells.runs_of(g):
        _finished_run(tmp_path, run, {"accuracy": 0.5, "loss": loss[run.cell[0][1]][run.seed]})
    (row,) = grid_report.comparisons(grid_report.load_runs(g, tmp_path), g, aso_iterations=50)
    assert row["name"] == "strategy=stack_and_finetune" and row["versus"] == "strategy=finetune_only"
    assert row["per_seed"] == pytest.approx([0.10, 0.11, 0.08])  # the baseline's loss minus the cell's
    assert row["t_interval"]["ci_low"] > 0 and row["aso_epsilon"] < 0.5  # the cell is the better one
    assert (
        "`vs` minus cell (lower loss is better: a positive difference is a gain)"
        in markdown._comparison_lines(
            g, {"comparisons": [], "objective": "classification", "statistics": {"equivalence_margin": 0.01}}
        )[0]
    )
    assert cells.gain_sign("accuracy") == 1.0 and cells.gain_sign("loss") == -1.0


def test_a_read_only_workdir_exits_1_as_the_table_says(tmp_path, monkeypatch):
    """docs/guarantees.md: a folder without permission is exit 1 (cli_errors: a read-only folder), for a
    workdir that exists as for one whose parent is read-only. (As root every folder is writable, so
    the permission is taken away where train.run asks for it.)"""
    from configs import tiny
    from stackft_jax.runtime import cli_errors
    from stackft_jax.training import train

    workdir = tmp_path / "run"
    workdir.mkdir()
    monkeypatch.setattr(train.os, "access", lambda path, mode: False)
    with pytest.raises(cli_errors.UserError) as error:
        train.run(tiny.get_config(), workdir)
    assert str(error.value) == f"--workdir={workdir} is not writable: the run writes its checkpoints there"
    assert cli_errors.exit_code_of(error.value) == cli_errors.EXIT_DATA == 1
    assert list(workdir.iterdir()) == []
