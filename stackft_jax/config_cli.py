"""The configuration as a user writes it: `--config=FILE.py[:preset,key=value,...]` and `--config.KEY=VALUE`.

Both syntaxes go through one parser with one set of types and errors, and the config file's
`get_config(arg)` sees every item of both, so what a file derives from a key (configs/glue.py's task
defaults) follows the key however it was set. Order: the file's defaults, then the `:` items left to
right (presets are functions of the file), then the `--config.` flags left to right; later wins.

Values: booleans take only true/false/1/0/yes/no (any case); ints take integers; floats take numbers
(also into `placeholder(float)` keys); strings take anything; `none` empties a placeholder.
A value cannot contain a comma (the `:` list is comma-separated).
"""

import ast
import difflib
import importlib.util
import io
import sys
import tokenize
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections

SHORTHANDS = {"task": "data.task", "head": "head.name"}
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
OVERRIDE_PREFIX = "--config."


class ConfigError(ValueError):
    """A config problem the user fixes on the command line; main.py prints it as one line."""


def flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> Iterator[str]:
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            yield from flat_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _unknown_key(config: ml_collections.ConfigDict, key: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(flat_keys(config)), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else " (--show_config lists the keys)"
    return ConfigError(f"config key '{key}' does not exist{hint}")


def _parent_and_leaf(config: ml_collections.ConfigDict, key: str) -> tuple[ml_collections.ConfigDict, str]:
    *path, leaf = key.split(".")
    parent = config
    for part in path:
        child = parent.get(part) if isinstance(parent, ml_collections.ConfigDict) else None
        if not isinstance(child, ml_collections.ConfigDict):
            raise _unknown_key(config, key)
        parent = child
    if leaf not in parent or isinstance(parent[leaf], ml_collections.ConfigDict):
        raise _unknown_key(config, key)
    return parent, leaf


def parse_value(key: str, field_type: type, text: str, *, nullable: bool = False) -> Any:
    """`text` as a value of `field_type` (`none` as None where `nullable`), or a ConfigError naming
    the key."""
    if nullable and text.lower() == "none":
        return None
    if field_type is bool:
        if text.lower() not in _BOOLEANS:
            raise ConfigError(f"config key '{key}' takes true/false/1/0/yes/no, not {text!r}")
        return _BOOLEANS[text.lower()]
    if field_type is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"config key '{key}' takes an integer, not {text!r}") from None
    if field_type is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"config key '{key}' takes a number, not {text!r}") from None
    if field_type is str:
        return text
    raise ConfigError(f"config key '{key}' holds a {field_type.__name__}: set it in a config file")


def set_value(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    parent, leaf = _parent_and_leaf(config, key)
    # Placeholders (`placeholder(float)`: unset until given) are the keys that may be None.
    nullable = isinstance(parent._fields[leaf], ml_collections.FieldReference)
    parent[leaf] = parse_value(key, parent.get_type(leaf), text, nullable=nullable)


def items_of(arg: str | None) -> list[str]:
    """`demo,task=mrpc,head=esim` -> ["demo", "data.task=mrpc", "head.name=esim"]."""
    items = []
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        items.append(f"{SHORTHANDS.get(key, key)}={value}" if sep else item)
    return items


def apply_items(
    config: ml_collections.ConfigDict, arg: str | None, presets: Mapping[str, Callable[[Any], None]]
) -> None:
    """Applies `preset,key=value,...` in order; presets are functions that edit the config in place."""
    for item in items_of(arg):
        key, sep, value = item.partition("=")
        if sep:
            set_value(config, key, value)
        elif item in presets:
            presets[item](config)
        else:
            raise ConfigError(f"unknown preset {item!r}; presets of this config file: {sorted(presets)}")


def split_override_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separates `--config.KEY=VALUE` flags (returned as `KEY=VALUE` items) from the other arguments."""
    overrides, rest = [], []
    for arg in argv:
        if arg.startswith(OVERRIDE_PREFIX):
            item = arg[len(OVERRIDE_PREFIX) :]
            if "=" not in item:
                raise ConfigError(f"{arg}: write {arg}=VALUE")
            overrides.append(item)
        else:
            rest.append(arg)
    return overrides, rest


def load(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """`FILE.py[:arg]` plus `KEY=VALUE` overrides -> the locked config (a typo is then an error)."""
    path, _, arg = spec.partition(":")
    if not Path(path).is_file():
        raise ConfigError(f"--config={spec}: no config file {path!r}")
    if any("," in item for item in overrides):
        raise ConfigError(f"a config value cannot contain a comma: {[i for i in overrides if ',' in i]}")
    module_spec = importlib.util.spec_from_file_location(f"_stackft_config_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(",".join(filter(None, [arg, *overrides])) or None)
    config.lock()
    return config


def key_comments() -> dict[str, str]:
    """{key: comment} from configs/common.py, where every default is set once: the comment at the end
    of a `c.KEY = ...` statement, else the comment lines just above it."""
    source_path = Path(__file__).resolve().parent.parent / "configs" / "common.py"
    source = source_path.read_text()
    comments = {
        token.start[0]: token.string.lstrip("# ").rstrip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    found = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        name = ast.unparse(node.targets[0])
        if not name.startswith("c."):
            continue
        trailing = [comments[line] for line in range(node.lineno, node.end_lineno + 1) if line in comments]
        above, line = [], node.lineno - 1
        while line in comments:
            above.insert(0, comments[line])
            line -= 1
        text = " ".join(trailing or above)
        if text:
            found[name[2:]] = text
    return found


def show(config: ml_collections.ConfigDict, out=None) -> None:
    """Every key with its value and comment, to `out` (default: stdout)."""
    out = out or sys.stdout
    comments = key_comments()
    for key in flat_keys(config):
        parent, leaf = _parent_and_leaf(config, key)
        # A key inside a block set as a whole (head.<name>.*, model.config_overrides.*) shows the block's.
        prefixes = [key.rsplit(".", n)[0] for n in range(key.count(".") + 1)]
        comment = next((comments[p] for p in prefixes if p in comments), None)
        line = f"{key} = {parent[leaf]!r}"
        print(f"{line:<60}  # {comment}" if comment else line, file=out)
