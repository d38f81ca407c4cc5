"""The configuration as a user writes it: `--config=FILE.py[:preset,key=value,...]` and `--config.KEY=VALUE`.

Both syntaxes go through one parser with one set of types and errors, and the config file's
`get_config(arg)` sees every item of both, so what a file derives from a key (configs/glue.py's task
defaults) follows the key however it was set. Order: the file's defaults, then the `:` items left to
right (presets are functions of the file), then the `--config.` flags left to right; later wins.

Values: booleans take only true/false/1/0/yes/no (any case); ints take integers; floats take numbers
(finite; also into `placeholder(float)` keys); strings take anything; `none` empties a placeholder.
A value cannot contain a comma (the `:` list is comma-separated).
"""

import ast
import copy
import difflib
import importlib.util
import inspect
import io
import json
import math
import re
import sys
import sysconfig
import tokenize
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from stackft_jax.config import defaults, phases
from stackft_jax.data import tasks
from stackft_jax.models import adaptation
from stackft_jax.runtime.cli_errors import ConfigError, ConfigFileError, UserError

SHORTHANDS = {"task": "data.task", "head": "head.name"}
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
OVERRIDE_PREFIX = "--config."
# What runs recorded before config.batching existed ran (data/batching.py's random scheme).
LEGACY_BATCHING = {
    "scheme": "random",
    "bucket_tokens": 0,
    "group_batches": 50,
    "loss_weighting": "batch_mean",
    "min_row_share": 0.0,  # packed runs before the row plan compiled every row bucket they needed
}
# The non-finite guard of every run recorded before config.nonfinite_guard (training/steps.py).
LEGACY_NONFINITE_GUARD = "select"


def flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> Iterator[str]:
    """Every leaf key, dotted; a list of blocks (`config.phases`) by index: `phases.0.num_steps`."""
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            yield from flat_keys(value, f"{prefix}{key}.")
        elif _is_block_list(value):
            for i, item in enumerate(value):
                yield from flat_keys(item, f"{prefix}{key}.{i}.")
        else:
            yield f"{prefix}{key}"


def _is_block_list(value: Any) -> bool:
    return isinstance(value, list | tuple) and any(isinstance(v, ml_collections.ConfigDict) for v in value)


def to_plain(value: Any) -> Any:
    """The config as JSON-ready dicts and lists (ConfigDict.to_dict leaves blocks inside lists alone)."""
    if isinstance(value, ml_collections.ConfigDict):
        return {key: to_plain(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value


def _unknown_key(config: ml_collections.ConfigDict, key: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(flat_keys(config)), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else " (--show_config lists the keys)"
    return ConfigError(f"config key '{key}' does not exist{hint}")


def _parent_and_leaf(config: ml_collections.ConfigDict, key: str) -> tuple[ml_collections.ConfigDict, str]:
    *path, leaf = key.split(".")
    parent = config
    for part in path:
        if isinstance(parent, ml_collections.ConfigDict):
            child = parent.get(part)
        else:  # a list of blocks, indexed by position (`phases.1.num_steps`)
            child = parent[int(part)] if part.isdigit() and int(part) < len(parent) else None
        if _is_block_list(child):
            parent = child
            continue
        if not isinstance(child, ml_collections.ConfigDict):
            raise _unknown_key(config, key)
        parent = child
    if not isinstance(parent, ml_collections.ConfigDict):
        raise _unknown_key(config, key)
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
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):  # nan and inf are typos here, never a setting
            raise ConfigError(f"config key '{key}' takes a finite number, not {text!r}")
        return value
    if field_type is str:
        return text
    raise ConfigError(f"config key '{key}' holds a {field_type.__name__}: set it in a config file")


def _parse_item(
    config: ml_collections.ConfigDict, key: str, text: str
) -> tuple[ml_collections.ConfigDict, str, Any]:
    """(parent block, leaf name, typed value) of `key=text`."""
    parent, leaf = _parent_and_leaf(config, key)
    # Placeholders (`placeholder(float)`: unset until given) are the keys that may be None.
    nullable = isinstance(parent._fields[leaf], ml_collections.FieldReference)
    return parent, leaf, parse_value(key, parent.get_type(leaf), text, nullable=nullable)


def set_value(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    parent, leaf, value = _parse_item(config, key, text)
    parent[leaf] = value


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
    previous = None
    for item in items_of(arg):
        key, sep, value = item.partition("=")
        if sep:
            set_value(config, key, value)
        elif item in presets:
            presets[item](config)
        elif previous is not None and "=" in previous:
            # `data.classes=sports,health`: the comma split a value, not a list of presets.
            raise ConfigError(
                f"'{previous},{item}': a config value cannot contain a comma (the items are comma-"
                f"separated), and {item!r} is no preset; a list value joins its parts with '+' "
                f"('{previous}+{item}')"
            )
        else:
            raise ConfigError(f"unknown preset {item!r}; presets of this config file: {sorted(presets)}")
        previous = item


def apply_arg(config: ml_collections.ConfigDict, arg: str | None, presets: dict) -> None:
    """Applies `name1,key=value,...` from `--config=file.py:<arg>` (and the `--config.` flags, which
    main.py appends) in order, then locks the config so a typo is an error: what every config file's
    get_config(arg) ends with."""
    apply_items(config, arg, presets)
    config.lock()


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


# What each command runs, told apart by the grid config's `axes` key: a file given to the other command
# is named with the command that takes it.
_COMMANDS = {"run": "python -m stackft_jax.main", "grid": "python -m stackft_jax.experiment"}


def _kind_of(config: ml_collections.ConfigDict) -> str:
    return "grid" if "axes" in config else "run"


def load(spec: str, overrides: Sequence[str] = (), *, kind: str | None = None) -> ml_collections.ConfigDict:
    """`FILE.py[:arg]` plus `KEY=VALUE` overrides -> the locked config (a typo is then an error).
    `kind` ("run" or "grid"): the config the command takes; a file of the other kind is refused.
    FILE may also be a run's recorded `config.json` or `results.json` (recorded_run_config)."""
    path, arg = _split_spec(spec)
    if not Path(path).is_file():
        raise ConfigError(f"--config={spec}: no config file {path!r}")
    if any("," in item for item in overrides):
        raise ConfigError(f"a config value cannot contain a comma: {[i for i in overrides if ',' in i]}")
    if path.endswith(".json"):
        if kind == "grid":
            raise ConfigError(f"--config={spec}: a run's record; run it with `{_COMMANDS['run']}`")
        config = recorded_run_config(Path(path))
        for item in [*items_of(arg), *overrides]:
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(
                    f"--config={spec}: a recorded config has no presets; {item!r} is not key=value"
                )
            set_value(config, key, value)
        config.lock()
        return config
    if not path.endswith(".py"):
        raise ConfigFileError(
            f"--config={spec}: {path} is no config file: give a Python file with get_config(arg) "
            "(FILE.py), or a run's config.json or results.json"
        )
    module = _run_config_file(path, _import, path)
    if not callable(getattr(module, "get_config", None)):
        raise ConfigFileError(f"{path}: no get_config(arg) function; is it a config file?")
    items = ",".join(filter(None, [arg, *overrides]))
    try:
        config = _run_config_file(path, module.get_config, items or None)
    except ConfigError:
        if kind is not None:  # a grid's keys given to a run config fail first; name the swap instead
            _check_kind(_run_config_file(path, module.get_config, None), path, kind)
        raise
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigFileError(
            f"{path}: get_config(arg) returned a {type(config).__name__}, not an ml_collections.ConfigDict "
            "(start from stackft_jax.config.defaults.get_config())"
        )
    if kind is not None:
        _check_kind(config, path, kind)
    if _kind_of(config) == "run":
        _check_keys(config, path)
    _check_applied(config, path, items)
    config.lock()
    return config


def _split_spec(spec: str) -> tuple[str, str]:
    """`FILE[:arg]` as (FILE, arg): FILE is the longest prefix ending before a `:` that is a file (a run
    folder's name may hold a colon: `...@matched_flops:stack_and_finetune-...-seed0/config.json`)."""
    cuts = [len(spec), *(i for i in range(len(spec) - 1, -1, -1) if spec[i] == ":")]
    for cut in cuts:
        if Path(spec[:cut]).is_file():
            return spec[:cut], spec[cut + 1 :]
    path, _, arg = spec.partition(":")
    return path, arg


def _import(path: str) -> Any:
    module_spec = importlib.util.spec_from_file_location(f"_stackft_config_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _run_config_file(path: str, function: Callable[[Any], Any], arg: Any) -> Any:
    """`function(arg)`, the config file's own code running: a user's mistake (UserError) passes as it is;
    any other exception is the file's, named as one line with the file and line it arose at."""
    try:
        return function(arg)
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001 - the config file's code: anything may arise there
        where = _where(error, path)
        unknown = _locked_key_error(error)
        if unknown is not None:
            raise ConfigError(f"{where}: {unknown}") from None
        text = error.msg if isinstance(error, SyntaxError) else str(error)
        message = " ".join(text.split()) or "(no message)"
        raise ConfigFileError(f"{where}: {type(error).__name__}: {message}") from None


# Code that is not the user's config: the installed packages, the standard library, stackft_jax itself.
_NOT_CONFIG_CODE = [
    Path(p).resolve()
    for p in (
        *(sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")),
        Path(__file__).parents[1],
    )
]


def _where(error: BaseException, path: str) -> str:
    """`FILE:LINE` of the config code where `error` arose: a syntax error's position, else the deepest
    frame in a file of the user's (the config file, or a config file it imports); else `path`."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<")
        and not any(Path(frame.filename).resolve().is_relative_to(root) for root in _NOT_CONFIG_CODE)
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else path


def _locked_key_error(error: BaseException) -> ConfigError | None:
    """A key set (or read) on a ConfigDict that lacks it, as the command line names it: the full dotted
    key and the closest existing one (`_unknown_key`), not ml_collections' dump of the whole block."""
    if not isinstance(error, AttributeError | KeyError):
        return None
    text = error
    while isinstance(text, BaseException):  # ml_collections wraps a KeyError in an AttributeError
        text = text.args[0] if text.args else ""
    text = str(text)
    locked = re.search(r'Key "([^"]+)" does not exist', text)
    leaf = locked[1] if locked else (text.splitlines() or [""])[0].strip("'\"")
    frames, tb = [], error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    parents = [f.f_locals.get("self") for f in frames]
    parent = next((p for p in reversed(parents) if isinstance(p, ml_collections.ConfigDict)), None)
    if parent is None or not leaf.isidentifier() or leaf in parent:
        return None
    # The outermost config the file's code holds that contains that block names the key in full.
    found = [
        (prefix, root)
        for frame in frames
        for root in frame.f_locals.values()
        if isinstance(root, ml_collections.ConfigDict)
        for prefix in [_prefix_of(root, parent)]
        if prefix is not None
    ]
    prefix, root = max(found, key=lambda pair: len(pair[0]), default=("", parent))
    return _unknown_key(root, prefix + leaf)


def _prefix_of(
    root: ml_collections.ConfigDict, block: ml_collections.ConfigDict, prefix: str = ""
) -> str | None:
    """`block`'s dotted path inside `root` ("phase1."; "" for root itself), None when it is not there."""
    if root is block:
        return prefix
    for key, value in root.items():
        children = enumerate(value) if _is_block_list(value) else [(None, value)]
        for index, child in children:
            if isinstance(child, ml_collections.ConfigDict):
                path = f"{prefix}{key}." + ("" if index is None else f"{index}.")
                found = _prefix_of(child, block, path)
                if found is not None:
                    return found
    return None


def _check_keys(config: ml_collections.ConfigDict, path: str) -> None:
    """A run config has the defaults' keys, no more (written phases aside: phases.block checks theirs):
    a key a config file added (on an unlocked config) would be read by nothing."""
    reference = defaults.get_config()
    known = set(flat_keys(reference))
    given = {key for key in flat_keys(config) if not key.startswith("phases.")}
    unknown = sorted(given - known)
    if unknown:
        raise ConfigError(f"{path}: {_unknown_key(reference, unknown[0])}")
    missing = sorted(known - given - {"phases"})
    if missing:
        raise ConfigFileError(
            f"{path}: get_config(arg) returned a config without the key '{missing[0]}' ({len(missing)} "
            "missing): start from stackft_jax.config.defaults.get_config()"
        )


def recorded_run_config(path: Path) -> ml_collections.ConfigDict:
    """The config a run recorded (its workdir's config.json, or results.json's "config"), on today's
    defaults (config/defaults.py): a key added since takes its default, a key removed since is dropped, so
    any committed run reruns as it ran (`--config.data.test_file=FILE` to score a test split too)."""
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not JSON ({error})") from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        if isinstance(record, dict) and "grid" in record:
            raise ConfigError(f"{path}: a grid's record; run the grid with python -m stackft_jax.experiment")
        raise ConfigError(
            f'{path}: no "config" object; a run\'s config.json or results.json holds its config'
        )
    config = defaults.get_config()
    overlay_recorded(config, with_legacy_keys(record["config"]))
    # Where the recorded run kept its features (a grid's shared folder, perhaps on another machine) is no
    # part of what it computes: this run keeps its own.
    config.feature_cache_dir = ""
    return config


def overlay_recorded(target: ml_collections.ConfigDict, recorded: Mapping[str, Any]) -> None:
    """Writes `recorded`'s values into `target` where `target` has the key; a key `recorded` lacks
    (added since it was written) keeps `target`'s value, a key `target` lacks (removed) is dropped."""
    for key, value in recorded.items():
        if key not in target:
            continue
        current = target[key]
        if isinstance(current, ml_collections.ConfigDict) and isinstance(value, Mapping):
            overlay_recorded(current, value)
        elif key == "phases" and isinstance(value, list):
            target[key] = [_recorded_block(b) for b in value]
        else:
            with target.ignore_type():
                target[key] = tuple(map(tuple, value)) if key == "rules" else value


def _recorded_block(plain: Mapping[str, Any]) -> ml_collections.ConfigDict:
    options = {k: v for k, v in plain.items() if k in phases.OPTION_KEYS}
    return phases.block(
        plain["name"], rules=plain["rules"], learning_rates=plain["learning_rates"], **options
    )


def with_legacy_keys(plain: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded config (JSON form) with the keys it predates set to what its run did: phases without
    `gap_metric` compared the task's `legacy_gap_metric` (token accuracy on NER, not entity F1); a
    `feature_cache_dir` in a phase block (before it became a run option) is the run's; a config without
    the `batching` block drew random batches in the doubling buckets (data/batching.py), and one without
    `batching.loss_weighting` divided each batch's loss by its own count, and a packed one without
    `batching.min_row_share` compiled every row bucket its batches needed; a CoNLL run
    without `data.entity_f1` read strict IOB2 entity F1 (before conlleval's became the default); a model
    without `attention` ran the einsum path, without `remat` kept every activation (every record has
    `dtype`); a FLOPs-matched run without `matched_budget.head_flops` was planned counting the light heads
    alone (experiments/budgets.py); a run without `nonfinite_guard` guarded its updates with a select per
    leaf."""
    plain = copy.deepcopy(dict(plain))
    batching = plain.setdefault("batching", {})
    for key, value in LEGACY_BATCHING.items():  # the block, or a key added to it later, as it ran
        batching.setdefault(key, value)
    plain.setdefault("nonfinite_guard", LEGACY_NONFINITE_GUARD)
    matched = plain.get("matched_budget")
    if isinstance(matched, dict) and str(matched.get("rule", "")).split(".")[0] == "flops":
        matched.setdefault("head_flops", "light")
    if isinstance(plain.get("model"), dict):  # runs before model.attention / model.remat: einsum, no remat
        plain["model"].setdefault("attention", "einsum")
        plain["model"].setdefault("remat", "none")
    phase_blocks = [plain.get("phase1"), *(plain.get("phases") or [])]
    folders = [
        b.pop("feature_cache_dir") for b in phase_blocks if isinstance(b, dict) and "feature_cache_dir" in b
    ]
    if "feature_cache_dir" not in plain and any(folders):
        plain["feature_cache_dir"] = next(f for f in folders if f)
    try:
        task = tasks.get_task(plain["data"]["task"])
    except (KeyError, ValueError):  # no task it names now: resolve says so
        return plain
    legacy = task.legacy_gap_metric
    if "entity_f1" in task.data_keys and isinstance(plain["data"], dict):
        plain["data"].setdefault("entity_f1", "strict")
    blocks = [plain[alias] for alias in ("phase1",) if isinstance(plain.get(alias), dict)]
    blocks += [b for b in plain.get("phases") or [] if isinstance(b, dict)]
    for block in blocks:
        block.setdefault("gap_metric", legacy)
    return plain


def _check_kind(config: ml_collections.ConfigDict, path: str, kind: str) -> None:
    found = _kind_of(config)
    if found != kind:
        raise ConfigError(
            f"--config={path} is a {found} config, and this command runs a {kind} config: run it with "
            f"`{_COMMANDS[found]} --config={path} --workdir=...`"
        )


def _check_applied(config: ml_collections.ConfigDict, path: str, items: str) -> None:
    """Each `key=value` after the last preset must hold in the result: a config file whose
    get_config(arg) does not apply its `arg` would otherwise drop them without a word."""
    listed = items_of(items)
    after_presets = listed[max((i + 1 for i, item in enumerate(listed) if "=" not in item), default=0) :]
    for key, text in dict(item.split("=", 1) for item in after_presets).items():
        parent, leaf, value = _parse_item(config, key, text)
        if parent[leaf] != value:
            raise ConfigError(
                f"{path}: get_config(arg) did not apply '{key}={text}'; give arg to config_cli.apply_arg"
            )


def source_comments(path: Path) -> dict[str, str]:
    """{name: comment} for each `c.NAME = ...` statement and each `"NAME": value` dict entry of a Python
    file: the comment ending its last line, else the full-line comments just above it. A dict entry
    inside a `c.NAME = ...` statement is named NAME.KEY."""
    source = path.read_text()
    trailing, full_line = {}, {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            code_before = token.line[: token.start[1]].strip()
            (trailing if code_before else full_line)[token.start[0]] = token.string.lstrip("# ").rstrip()

    def comment(first_line: int, last_line: int) -> str | None:
        if last_line in trailing:
            return trailing[last_line]
        above, line = [], first_line - 1
        while line in full_line:
            above.insert(0, full_line[line])
            line -= 1
        return " ".join(above) or None

    found, dict_prefix = {}, {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = ast.unparse(node.targets[0])
            if target.startswith("c."):
                found[target[2:]] = comment(node.lineno, node.end_lineno)
                dict_prefix.update(
                    {id(d): f"{target[2:]}." for d in ast.walk(node.value) if isinstance(d, ast.Dict)}
                )
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    found[dict_prefix.get(id(node), "") + key.value] = comment(key.lineno, value.end_lineno)
    return {name: text for name, text in found.items() if text}


def key_comments() -> dict[str, str]:
    """{key: comment}, each read from where the key's default is set: config/defaults.py, and each head's
    module for `head.<name>.*`."""
    from stackft_jax.models.heads import HEADS  # imports flax: only when the comments are wanted

    comments = source_comments(Path(defaults.__file__))
    # The phase keys' comments are written once, in phases.py: a written phase's (`phases.<i>.<key>`)
    # and the alias blocks'.
    comments.update({f"phases.{key}": f.metadata["doc"] for key, f in phases.BLOCK_KEYS.items()})
    for alias, declared in phases.ALIASES.items():
        comments.update({f"{alias}.{key}": text for key, text in declared.comments().items()})
    for kind, path in adaptation.option_sources().items():
        comments.update({f"adaptation.{kind}.{key}": text for key, text in source_comments(path).items()})
    for name, (default_config, _) in HEADS.items():
        head_comments = source_comments(Path(inspect.getsourcefile(default_config)))
        comments.update({f"head.{name}.{key}": text for key, text in head_comments.items()})
    return comments


def _phase_key_comment(key: str, comments: dict[str, str]) -> str | None:
    """A written phase's key (`phases.<i>.<key>`): phases.Phase's comment; `learning_rates.<group>` takes
    `learning_rates`'. Never the comment of `phases` itself, which describes the list."""
    match = re.fullmatch(r"phases\.\d+\.(.+)", key)
    if match is None:
        return None
    inner = match[1]
    found = comments.get(f"phases.{inner}")
    if found is None and "." in inner:
        found = comments.get(f"phases.{inner.rsplit('.', 1)[0]}")
    return found


def show(config: ml_collections.ConfigDict, out=None) -> None:
    """Every key with its value and comment, to `out` (default: stdout)."""
    out = out or sys.stdout
    comments = key_comments()
    for key in flat_keys(config):
        parent, leaf = _parent_and_leaf(config, key)
        line = f"{key} = {parent[leaf]!r}"
        comment = comments.get(key) or _phase_key_comment(key, comments)
        print(f"{line:<60}  # {comment}" if comment else line, file=out)
