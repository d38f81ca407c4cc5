"""One parser for `--config=FILE.py:key=value` and `--config.key=value`: the same types, the same errors,
task defaults however the task is chosen, one-line errors on the command line, and --show_config."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stackft_jax.config import config_cli, phases
from stackft_jax.runtime.cli_errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _both_syntaxes(spec: str, items: list[str]):
    """The config from `spec:items` and from `spec` plus the same items as --config. flags."""
    colon = config_cli.load(f"{spec}:{','.join(items)}" if items else spec)
    flags = config_cli.load(spec, items)
    assert colon.to_dict() == flags.to_dict()
    return colon


def _value(config, key: str):
    for part in key.split("."):
        config = config[part]
    return config


@pytest.mark.parametrize(
    ("item", "key", "expected"),
    [
        ("model.scalar_mix=yes", "model.scalar_mix", True),
        ("model.scalar_mix=FALSE", "model.scalar_mix", False),
        ("model.scalar_mix=1", "model.scalar_mix", True),
        ("model.scalar_mix=No", "model.scalar_mix", False),
        ("model.dropout_rate=0.2", "model.dropout_rate", 0.2),  # a placeholder(float)
        ("phase1.num_steps=7", "phase1.num_steps", 7),
        ("phase1.learning_rate=3e-4", "phase1.learning_rate", 3e-4),
        ("phase1.num_epochs=2", "phase1.num_epochs", 2.0),  # an integer into a float key
        ("model.dtype=bfloat16", "model.dtype", "bfloat16"),
        ("data.train_file=/tmp/t.tsv", "data.train_file", "/tmp/t.tsv"),  # a placeholder(str)
        ("head=esim", "head.name", "esim"),
        ("task=mrpc", "data.task", "mrpc"),
        ("head.esim.lstm_units=64", "head.esim.lstm_units", 64),
        ("data.cache_dir=none", "data.cache_dir", None),  # a placeholder back to unset
        ("model.dropout_rate=None", "model.dropout_rate", None),
    ],
)
def test_values_are_typed_the_same_in_both_syntaxes(item, key, expected):
    value = _value(_both_syntaxes("configs/quora.py", [item]), key)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("model.scalar_mix=ture", "config key 'model.scalar_mix' takes true/false/1/0/yes/no, not 'ture'"),
        ("model.scalar_mix=", "config key 'model.scalar_mix' takes true/false/1/0/yes/no, not ''"),
        ("phase1.num_steps=0.5", "config key 'phase1.num_steps' takes an integer, not '0.5'"),
        ("phase1.num_steps=none", "config key 'phase1.num_steps' takes an integer, not 'none'"),
        ("phase1.learning_rate=fast", "config key 'phase1.learning_rate' takes a finite number, not 'fast'"),
        ("model.dropout_rate=nan", "config key 'model.dropout_rate' takes a finite number, not 'nan'"),
        (
            "phase1.max_train_dev_gap=inf",
            "config key 'phase1.max_train_dev_gap' takes a finite number, not 'inf'",
        ),
        (
            "phase1.learnig_rate=1",
            "config key 'phase1.learnig_rate' does not exist; did you mean 'phase1.learning_rate'?",
        ),
        (
            "phase3.num_steps=1",
            "config key 'phase3.num_steps' does not exist; did you mean 'phase2.num_steps'?",
        ),
        ("model=1", "config key 'model' does not exist; did you mean 'model.init'?"),  # a block
        ("xyzzy=1", "config key 'xyzzy' does not exist (--show_config lists the keys)"),
        ("dem", "unknown preset 'dem'; presets of this config file: ['demo', 'mini']"),
    ],
)
def test_errors_are_the_same_in_both_syntaxes(item, message):
    with pytest.raises(ConfigError) as colon:
        config_cli.load(f"configs/quora.py:{item}")
    assert str(colon.value) == message
    if "=" in item:  # a bare word is a preset, which only the `:` syntax names
        with pytest.raises(ConfigError) as flag:
            config_cli.load("configs/quora.py", [item])
        assert str(flag.value) == message


def test_errors_outside_the_items():
    with pytest.raises(ConfigError) as error:
        config_cli.load("configs/nope.py:demo")
    assert str(error.value) == "--config=configs/nope.py:demo: no config file 'configs/nope.py'"
    with pytest.raises(ConfigError) as error:
        config_cli.load("configs/quora.py", ["data.train_file=a,b.tsv"])
    assert str(error.value) == "a config value cannot contain a comma: ['data.train_file=a,b.tsv']"
    with pytest.raises(ConfigError) as error:
        config_cli.split_override_flags(["main.py", "--config.seed", "3"])
    assert str(error.value) == "--config.seed: write --config.seed=VALUE"
    assert config_cli.split_override_flags(
        ["main.py", "--config=c.py", "--config.seed=3", "--workdir=w"]
    ) == (
        ["seed=3"],
        ["main.py", "--config=c.py", "--workdir=w"],
    )


def test_order_presets_and_items_left_to_right_then_flags():
    # demo sets phase1.num_steps=60 and name_or_path; an item after it wins, a flag after both wins.
    config = config_cli.load("configs/quora.py:demo,phase1.num_steps=5", ["phase1.num_steps=9"])
    assert config.model.name_or_path == "embedded:minilm" and config.phase1.num_steps == 9
    assert config_cli.load("configs/quora.py:demo,phase1.num_steps=5").phase1.num_steps == 5
    # A preset after an item wins over it: left to right.
    assert config_cli.load("configs/quora.py:phase1.num_steps=5,demo").phase1.num_steps == 60
    # Among flags the last wins; a flag beats a preset.
    assert config_cli.load("configs/quora.py:demo", ["seed=1", "seed=2"]).seed == 2
    assert config_cli.load("configs/quora.py:demo", ["phase1.num_steps=7"]).phase1.num_steps == 7


def test_task_defaults_follow_the_task_however_it_is_chosen():
    sst2 = config_cli.load("configs/glue.py")
    assert (sst2.data.task, sst2.max_seq_length, sst2.phase1.num_epochs) == ("sst2", 64, 1.0)
    mrpc = _both_syntaxes("configs/glue.py", ["data.task=mrpc"])
    assert (mrpc.data.task, mrpc.max_seq_length, mrpc.phase1.num_epochs) == ("mrpc", 128, 3.0)
    assert config_cli.load("configs/glue.py:task=mrpc").to_dict() == mrpc.to_dict()
    assert config_cli.load("configs/glue.py", ["task=sst2", "data.task=mrpc"]).to_dict() == mrpc.to_dict()
    # An explicit value beats the task default, whichever syntax chose the task and set the value.
    for spec, flags in [
        ("configs/glue.py:task=mrpc", ["max_seq_length=64"]),
        ("configs/glue.py:max_seq_length=64", ["data.task=mrpc"]),
        ("configs/glue.py:max_seq_length=64,task=mrpc", []),
        ("configs/glue.py", ["max_seq_length=64", "task=mrpc"]),
    ]:
        config = config_cli.load(spec, flags)
        assert (config.data.task, config.max_seq_length, config.phase1.num_epochs) == ("mrpc", 64, 3.0)
    for spec, flags in [("configs/glue.py", ["data.task=qnli"]), ("configs/glue.py:task=qnli", [])]:
        with pytest.raises(ConfigError) as error:
            config_cli.load(spec, flags)
        assert str(error.value) == (
            "config key 'data.task' takes one of ['mrpc', 'sst2', 'stsb'] in configs/glue.py, not 'qnli'"
        )


def test_a_config_file_that_ignores_its_argument_is_an_error(tmp_path):
    config_file = tmp_path / "forgetful.py"
    config_file.write_text(
        "from stackft_jax.config import defaults\n\n\n"
        "def get_config(arg=None):\n    return defaults.get_config()\n"
    )
    for spec, flags in [(f"{config_file}", ["seed=3"]), (f"{config_file}:seed=3", [])]:
        with pytest.raises(ConfigError) as error:
            config_cli.load(spec, flags)
        assert (
            str(error.value)
            == f"{config_file}: get_config(arg) did not apply 'seed=3'; give arg to config_cli.apply_arg"
        )


def test_config_is_locked():
    config = config_cli.load("configs/quora.py")
    with pytest.raises(AttributeError):
        config.phase1.learnig_rate = 1.0


def test_comments_are_read_where_each_default_is_set(tmp_path):
    source = tmp_path / "defaults.py"
    source.write_text(
        "c.a = 1  # trailing\n"
        "# above, line 1\n"
        "# above, line 2\n"
        "c.b = (\n    2\n)\n"
        "c.c = 3  # not c.d's: a trailing comment belongs to its own line\n"
        "c.d = 4\n"
        "# a block\n"
        "c.e = ConfigDict(\n    {\n        'x': 0,  # x's\n        'y': 1,\n    }\n)\n"
        "TOP = {'z': 2}  # z's\n"
    )
    assert config_cli.source_comments(source) == {
        "a": "trailing",
        "b": "above, line 1 above, line 2",
        "c": "not c.d's: a trailing comment belongs to its own line",
        "e": "a block",
        "e.x": "x's",
        "z": "z's",
    }


@pytest.mark.parametrize(
    "spec", ["configs/quora.py", "configs/glue.py", "configs/tiny.py", "configs/yahoo.py"]
)
def test_every_key_has_its_own_comment(spec):
    config = config_cli.load(spec)
    comments = config_cli.key_comments()
    keys = list(config_cli.flat_keys(config))
    assert [key for key in keys if key not in comments] == []
    assert comments["max_grad_norm"] == "clip the trainable leaves' global gradient norm to this; 0: off"
    assert comments["head.cls_mlp.hidden_dim"] == "width of the tanh layer between [CLS] and the output"
    assert comments["model.config_overrides.num_hidden_layers"] == "transformer layers; 0: config.json's"
    # Comments are one per key, not a block's repeated: no two keys of a head share all their text.
    assert len({comments[key] for key in keys if key.startswith("head.sim_transformer.")}) == 9


def test_show_prints_every_key_with_value_and_comment():
    config = config_cli.load("configs/quora.py:demo", ["seed=3"])
    lines = []
    config_cli.show(config, out=_Lines(lines))
    assert len(lines) == len(list(config_cli.flat_keys(config)))
    seed = next(line for line in lines if line.startswith("seed "))
    assert seed.split("  # ") == ["seed = 3".ljust(60), "parameter init, data order and dropout"]
    assert any(line.startswith("model.name_or_path = 'embedded:minilm'") for line in lines)


def test_show_comments_the_keys_of_written_phases():
    config = config_cli.load("configs/tiny.py:three_phases")
    lines = []
    config_cli.show(config, out=_Lines(lines))
    written = [line for line in lines if line.startswith("phases.")]
    # name, rules and the option keys per phase (phases.Phase), and a rate per group: "top" has two.
    per_phase = 2 + len(phases.OPTION_KEYS)
    assert len(written) == 3 * per_phase + 4 and all("  # " in line for line in written)
    rate = next(line for line in written if line.startswith("phases.1.learning_rates.top "))
    assert rate.endswith("# peak learning rate per trained group of `rules` (the group `frozen` has none)")


class _Lines:
    """A text stream that collects printed lines."""

    def __init__(self, lines: list[str]):
        self.lines = lines

    def write(self, text: str) -> None:
        self.lines.extend(line for line in text.split("\n") if line)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "stackft_jax.main", *args], cwd=REPO, env=env, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--config=configs/tiny.py", "--config.phase1.lerning_rate=0.1"],
            "config key 'phase1.lerning_rate' does not exist; did you mean 'phase1.learning_rate'?",
        ),
        (
            ["--config=configs/tiny.py:model.scalar_mix=ture"],
            "config key 'model.scalar_mix' takes true/false/1/0/yes/no, not 'ture'",
        ),
        (
            ["--config=configs/glue.py", "--config.data.task=qnli"],
            "config key 'data.task' takes one of ['mrpc', 'sst2', 'stsb'] in configs/glue.py, not 'qnli'",
        ),
        (
            ["--config=configs/tiny.py", "--config.model.scalar_mix"],
            "--config.model.scalar_mix: write --config.model.scalar_mix=VALUE",
        ),
        (
            # A value the parser accepts but spec.resolve refuses: the same one line.
            ["--config=configs/tiny.py", "--config.strategy=stack_nly"],
            f"config.strategy='stack_nly': choose one of {phases.STRATEGIES}, or write config.phases",
        ),
        (
            # Task x head: a pair head on a single-sentence task, tagging heads only on tagging tasks.
            ["--config=configs/glue.py:task=sst2,head=bimpm"],
            "config.head.name='bimpm' with config.data.task='sst2': the head compares two sentences and "
            "the task gives one text per example; choose e.g. cls_mlp, linear, densenet or highway_lstm",
        ),
        (
            ["--config=configs/tiny.py:head=bilstm"],
            "config.head.name='bilstm' is a word tagging head, and data.task='qqp' is a classification "
            "task: choose one of ['bimpm', 'bimpm_no_context', 'cls_mlp', 'densenet', 'esim', "
            "'highway_lstm', 'linear', 'sim_transformer']",
        ),
        (
            ["--config=configs/tiny.py:conll,head=cls_mlp"],
            "config.head.name='cls_mlp' is a sentence head, and data.task='conll2003' is a word_tagging "
            "task: choose one of ['bilstm', 'bilstm_crf', 'crf', 'token_mlp']",
        ),
        (
            # An alias key next to a written schedule would be ignored.
            ["--config=configs/tiny.py:three_phases", "--config.phase1.num_steps=3"],
            "config.phases is written, and config.phase1.num_steps=3 would be ignored: set it in the phase "
            "blocks instead (phases.clear_aliases resets the alias keys in a config file)",
        ),
        (
            # A negative budget skipped the phase without a word (budgeted() kept it as it was).
            ["--config=configs/tiny.py", "--config.phase1.num_steps=-5"],
            "config.phase1.num_steps=-5: must be 0 or more",
        ),
        (
            # A stop rule that could never fire.
            ["--config=configs/tiny.py:task=stsb,phase1.gap_eval_examples=0"],
            "config.phase1.max_train_dev_gap=1.0 needs config.phase1.gap_eval_examples > 0 (the train "
            "examples scored for the train/dev pearson gap); set max_train_dev_gap=none to turn the rule off",
        ),
        (
            # A task's own data.* keys are checked before anything runs (TaskSpec.configure).
            ["--config=configs/yahoo.py", "--config.data.classes=society_culture+cooking"],
            "config.data.classes='society_culture+cooking': unknown topic 'cooking'; choose from "
            "['business_finance', 'computers_internet', 'education_reference', 'entertainment_music', "
            "'family_relationships', 'health', 'politics_government', 'science_mathematics', "
            "'society_culture', 'sports'] joined by '+', or 'all'",
        ),
    ],
)
@pytest.mark.slow
def test_cli_config_errors_are_one_line_with_status_2(tmp_path, args, message):
    proc = _cli(*args, f"--workdir={tmp_path / 'run'}")
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, f"error: {message}\n", "")
    assert not (tmp_path / "run").exists()  # nothing ran


@pytest.mark.slow
def test_cli_show_config_needs_no_workdir():
    proc = _cli("--config=configs/glue.py:head=esim", "--config.data.task=mrpc", "--show_config")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert (
        "max_seq_length = 128".ljust(60)
        + "  # tokens per example; batches are padded to length buckets up to it"
        in lines
    )
    assert any(line.startswith("data.task = 'mrpc'") for line in lines)
    assert any(line.startswith("head.name = 'esim'") for line in lines)
    assert "--show_config" in _cli("--help").stdout


QQP_RUN = "docs/grids/paper_qqp_small/runs/strategy=stack_and_finetune-name=bimpm-seed0"


def test_a_committed_run_reruns_from_its_record(monkeypatch):
    """`--config=<run>/config.json` is the run the grid ran (only where it kept its features differs)."""
    from stackft_jax.config import spec
    from stackft_jax.experiments import grid
    from stackft_jax.training import workdirs

    monkeypatch.chdir(REPO)
    grid_config = config_cli.load("configs/experiments/paper_qqp.py:small", kind="grid")
    (run,) = [r for r in grid.runs_of(grid_config) if r.name == Path(QQP_RUN).name]
    ran = spec.binding_form(grid.run_spec(grid_config, run, recorded=True))
    for record in ("config.json", "results.json"):
        config = config_cli.load(f"{QQP_RUN}/{record}", ["data.test_file=test.tsv"], kind="run")
        assert config.feature_cache_dir == "" and config.data.test_file == "test.tsv"
        rerun = spec.binding_form(spec.resolve(config, recorded=True))
        assert workdirs.config_differences(ran, rerun) == {"config.data.test_file": (None, "test.tsv")}


def test_a_recorded_config_takes_todays_defaults_for_keys_added_since(tmp_path):
    config = config_cli.load("configs/tiny.py:seed=4")
    plain = config_cli.to_plain(config)
    del plain["boundary_train_examples"], plain["phase2"]["head_learning_rate"]
    plain["removed_since"] = 1
    (tmp_path / "config.json").write_text(json.dumps({"config": plain}))
    loaded = config_cli.load(str(tmp_path / "config.json"))
    assert loaded.to_dict() == config.to_dict()


@pytest.mark.parametrize(
    ("record", "items", "message"),
    [
        ({"grid": {"axes": ""}}, [], "a grid's record; run the grid with python -m stackft_jax.experiment"),
        ({"final": {}}, [], 'no "config" object'),
        (None, ["demo"], "a recorded config has no presets; 'demo' is not key=value"),
        (None, ["phase1.lerning_rate=1"], "did you mean 'phase1.learning_rate'?"),
    ],
)
def test_a_bad_record_fails_naming_the_file(tmp_path, record, items, message):
    path = tmp_path / "config.json"
    if record is None:
        record = {"config": config_cli.to_plain(config_cli.load("configs/tiny.py"))}
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_cli.load(f"{path}:{','.join(items)}" if items else str(path))
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: not JSON"):
        config_cli.load(str(path))


def test_the_command_line_reads_a_recorded_config():
    proc = _cli(f"--config={QQP_RUN}/config.json", "--config.seed=7", "--show_config")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^seed = 7\b", proc.stdout, re.M) and "head.name = 'bimpm'" in proc.stdout


def test_show_config_gives_each_written_phase_key_its_own_comment():
    import io

    from configs import tiny

    shown = io.StringIO()
    config_cli.show(tiny.get_config("three_phases"), shown)
    lines = {line.split(" = ")[0]: line for line in shown.getvalue().splitlines()}
    assert lines["phases.0.num_steps"].endswith("# step budget; 0: use num_epochs")
    assert lines["phases.1.learning_rates.top"].endswith(
        "# peak learning rate per trained group of `rules` (the group `frozen` has none)"
    )
    assert not [
        k for k, line in lines.items() if k.startswith("phases.") and "The schedule as a list" in line
    ]
