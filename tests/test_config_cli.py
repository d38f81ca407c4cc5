"""One parser for `--config=FILE.py:key=value` and `--config.key=value`: the same types, the same errors,
task defaults however the task is chosen, one-line errors on the command line, and --show_config."""

import pytest

from stackft_jax import config_cli
from stackft_jax.config_cli import ConfigError


def _both_syntaxes(spec: str, items: list[str]):
    """The config from `spec:items` and from `spec` plus the same items as --config. flags."""
    colon = config_cli.load(f"{spec}:{','.join(items)}" if items else spec)
    flags = config_cli.load(spec, items)
    assert colon.to_dict() == flags.to_dict()
    return colon


@pytest.mark.parametrize(
    ("item", "key", "expected"),
    [
        ("model.scalar_mix=yes", "model.scalar_mix", True),
        ("model.scalar_mix=FALSE", "model.scalar_mix", False),
        ("model.scalar_mix=1", "model.scalar_mix", True),
        ("model.dropout_rate=0.2", "model.dropout_rate", 0.2),  # a placeholder(float)
        ("phase1.num_steps=7", "phase1.num_steps", 7),
        ("phase1.learning_rate=3e-4", "phase1.learning_rate", 3e-4),
        ("phase1.num_epochs=2", "phase1.num_epochs", 2.0),
        ("data.train_file=/tmp/t.tsv", "data.train_file", "/tmp/t.tsv"),
        ("head=esim", "head.name", "esim"),
        ("data.cache_dir=none", "data.cache_dir", None),  # a placeholder back to unset
    ],
)
def test_values_are_typed_the_same_in_both_syntaxes(item, key, expected):
    config = _both_syntaxes("configs/quora.py", [item])
    value = config
    for part in key.split("."):
        value = value[part]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("model.scalar_mix=ture", "config key 'model.scalar_mix' takes true/false/1/0/yes/no, not 'ture'"),
        ("phase1.num_steps=0.5", "config key 'phase1.num_steps' takes an integer, not '0.5'"),
        ("phase1.learning_rate=fast", "config key 'phase1.learning_rate' takes a number, not 'fast'"),
        (
            "phase1.learnig_rate=1",
            "config key 'phase1.learnig_rate' does not exist; did you mean 'phase1.learning_rate'?",
        ),
        (
            "phase3.num_steps=1",
            "config key 'phase3.num_steps' does not exist; did you mean 'phase2.num_steps'?",
        ),
        ("model=1", "config key 'model' does not exist"),
        ("phase1.num_steps=none", "config key 'phase1.num_steps' takes an integer, not 'none'"),
    ],
)
def test_errors_are_the_same_in_both_syntaxes(item, message):
    for load in (
        lambda: config_cli.load(f"configs/quora.py:{item}"),
        lambda: config_cli.load("configs/quora.py", [item]),
    ):
        with pytest.raises(ConfigError) as error:
            load()
        assert str(error.value).startswith(message)


def test_presets_and_order():
    config = config_cli.load("configs/quora.py:demo,phase1.num_steps=5", ["phase1.num_steps=9"])
    assert config.model.name_or_path == "embedded:minilm" and config.phase1.num_steps == 9
    with pytest.raises(
        ConfigError, match=r"unknown preset 'dem'; presets of this config file: \['demo', 'mini'\]"
    ):
        config_cli.load("configs/quora.py:dem")


def test_task_defaults_follow_the_task_however_it_is_chosen():
    mrpc = _both_syntaxes("configs/glue.py", ["data.task=mrpc"])
    assert (mrpc.data.task, mrpc.max_seq_length, mrpc.phase1.num_epochs) == ("mrpc", 128, 3.0)
    assert config_cli.load("configs/glue.py:task=mrpc").to_dict() == mrpc.to_dict()
    # An explicit value beats the task default, whichever syntax chose the task.
    assert config_cli.load("configs/glue.py:task=mrpc", ["max_seq_length=64"]).max_seq_length == 64
    assert config_cli.load("configs/glue.py:max_seq_length=64", ["data.task=mrpc"]).max_seq_length == 64
    with pytest.raises(ConfigError, match="task='qnli'"):
        config_cli.load("configs/glue.py", ["data.task=qnli"])


def test_config_is_locked():
    config = config_cli.load("configs/quora.py")
    with pytest.raises(AttributeError):
        config.phase1.learnig_rate = 1.0


def test_every_key_has_a_comment(capsys):
    config_cli.show(config_cli.load("configs/quora.py"))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(list(config_cli.flat_keys(config_cli.load("configs/quora.py"))))
    uncommented = [line for line in lines if "  # " not in line]
    assert not uncommented
    assert any(line.startswith("max_grad_norm = 1.0") and "clip" in line for line in lines)


def test_cli_one_line_errors_and_show_config(tmp_path, run_cli):
    proc = run_cli(tmp_path, "--config.phase1.lerning_rate=0.1")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: config key 'phase1.lerning_rate' does not exist; did you mean 'phase1.learning_rate'?"
    )
    proc = run_cli(tmp_path, "--config.model.scalar_mix")
    assert proc.returncode != 0 and "write --config.model.scalar_mix=VALUE" in proc.stderr
    proc = run_cli(tmp_path, "--show_config", "--config.seed=3")
    assert proc.returncode == 0, proc.stderr
    assert "seed = 3" in proc.stdout and "# parameter init, data order and dropout" in proc.stdout
    assert not (tmp_path / "config.json").exists()  # nothing ran
