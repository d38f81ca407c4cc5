"""Every command the README and docs/ show still parses: its flags exist on that command, and its
`--config` (file, presets, keys) loads and resolves, so a renamed key, preset or flag fails here rather
than in a reader's terminal. Commands that only run online, or on files a reader brings, are resolved
without reading files (the spec's recorded mode); the demos themselves run end to end in
tests/test_main.py and the other command tests."""

import re
import shlex
from pathlib import Path

import pytest

from stackft_jax.config import config_cli, spec

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"```(?:bash|sh|)\n(.*?)```", re.S)
_COMMAND = re.compile(r"python -m stackft_jax\.(\w+)((?: +[^\s#&|]+)*)")


def _commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for page in PAGES:
        for block in _FENCE.findall(page.read_text()):
            text = block.replace("\\\n", " ")
            for line in text.splitlines():
                for command, rest in _COMMAND.findall(line):
                    if "..." in rest or "$" in rest or "<" in rest or "[" in rest:
                        continue  # a pattern with placeholders, not a command to paste
                    found.append((page.name, command, shlex.split(rest)))
    return found


COMMANDS = _commands()


def _defined_flags(command: str) -> set[str]:
    source = (ROOT / "stackft_jax" / f"{command}.py").read_text()
    names = set(re.findall(r"flags\.DEFINE_\w+\(\s*\"(\w+)\"", source))  # absl
    names |= set(re.findall(r"add_argument\(\s*\"--(\w+)\"", source))  # argparse (ensemble)
    return names | {"help", "helpfull"}


def test_the_docs_show_commands_of_every_kind():
    assert {command for _, command, _ in COMMANDS} == {"main", "experiment", "predict", "export", "ensemble"}
    assert len(COMMANDS) > 30


@pytest.mark.parametrize(
    "page, command, args", COMMANDS, ids=[f"{p}:{c}:{' '.join(a)[:60]}" for p, c, a in COMMANDS]
)
def test_a_documented_command_parses(page, command, args):
    flags = {a.split("=", 1)[0].removeprefix("--") for a in args if a.startswith("--")}
    unknown = {f for f in flags if not f.startswith("config.")} - _defined_flags(command)
    assert not unknown, f"{page}: python -m stackft_jax.{command} has no flag(s) {sorted(unknown)}"
    configs = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    if command not in ("main", "experiment") or not configs:
        return
    overrides = [a.removeprefix("--config.") for a in args if a.startswith("--config.")]
    if configs[0].endswith(".json"):
        return  # a recorded run's config: tests/test_config_cli.py reruns those
    kind = "run" if command == "main" else "grid"
    config = config_cli.load(str(ROOT / configs[0]), overrides, kind=kind)
    if kind == "run":
        # A hub model cannot be read here (no network): the presets expand for the embedded encoder.
        model = config.model.name_or_path
        local = model.startswith("embedded:") or Path(model).expanduser().is_dir()
        spec.resolve(config, recorded=True, encoder=None if local else spec.encoder_shape("embedded:minilm"))


def test_readme_lines_fit_200_characters():
    """The README is a guide read in a terminal and on a phone; long table rows link to docs/ instead."""
    long = [
        (number, len(line))
        for number, line in enumerate((ROOT / "README.md").read_text().splitlines(), start=1)
        if len(line) > 200
    ]
    assert not long, f"README.md lines over 200 characters (line, length): {long}"
