"""Resolve once: the ConfigDict as a frozen, typed run spec, with every check run here, before any work.

    run_spec = spec.resolve(config)   # ConfigError (one line, naming the keys) on anything wrong

The spec holds what a run uses and nothing else: the configured task, the model, the chosen head's
block (not every head's), the phases (either `config.phases` or the preset `config.strategy` names,
with only the `phase1.*`/`phase2.*`/`unfreezing.*` alias blocks that preset reads) and the run options.
`binding_form` is its plain form for workdir binding (workdirs.py): adding a head, a task or a key with a
default leaves an old workdir's form unchanged, and a preset binds the phases it builds, not its inputs.

Nothing here imports jax itself (the task and head registries it reads do, but no backend starts).
"""

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from stackft_jax.config import config_cli, phases
from stackft_jax.data import task_spec, tasks
from stackft_jax.data.task_spec import TaskSpec
from stackft_jax.models import heads
from stackft_jax.models.objectives import CLASSIFICATION
from stackft_jax.runtime.cli_errors import ConfigError

SPLITS = ("train", "dev", "test")
FINAL_PARAMS = ("last", "best")
MODEL_INITS = ("pretrained", "random")
MODEL_DTYPES = ("float32", "bfloat16")
# The shortest max_seq_length that leaves room for text: [CLS] a [SEP] b [SEP] takes 3 special tokens.
MIN_SEQ_LENGTH = 8
_POSITIVE = (
    "log_every_steps",
    "eval_every_steps",
    "checkpoint_every_steps",
    "per_device_batch_size",
    "eval_per_device_batch_size",
    "max_seq_length",
)
# Keys that change how a run is watched or stored, never what it computes: left out of the binding form.
_NEUTRAL = (
    "log_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "async_checkpointing",
    "eval_per_device_batch_size",
    "compilation_cache_dir",
    "matched_budget",  # a record of how a grid chose the step count (experiments/budgets.py)
)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name_or_path: str
    init: str  # pretrained | random
    dtype: str  # float32 | bfloat16
    scalar_mix: bool
    dropout_rate: float | None
    config_overrides: Mapping[str, int]  # the non-zero architecture overrides
    allow_pickle: bool


@dataclasses.dataclass(frozen=True)
class DataSpec:
    task: str
    train_file: str | None
    dev_file: str | None
    test_file: str | None
    cache_dir: str | None
    options: Mapping[str, Any]  # the other data.* keys (a task's own: classes, truncation, ...)

    def file(self, split: str) -> str | None:
        return {"train": self.train_file, "dev": self.dev_file, "test": self.test_file}[split]

    def as_mapping(self) -> dict[str, Any]:
        """data.* as TaskSpec.configure/encoding_options read it."""
        return {**self.options, "task": self.task, "dev_file": self.dev_file}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    strategy: str
    seed: int
    max_seq_length: int
    per_device_batch_size: int
    eval_per_device_batch_size: int
    max_grad_norm: float
    final_params: str  # last | best
    boundary_train_examples: int
    calibration_temperature: bool
    log_every_steps: int
    eval_every_steps: int
    checkpoint_every_steps: int
    keep_checkpoints: int
    async_checkpointing: bool
    compilation_cache_dir: str
    model: ModelSpec
    # The chosen head: {name, dropout_rate, <name>: its block}, the form heads.build_head reads.
    head: ml_collections.ConfigDict
    data: DataSpec
    task: TaskSpec = dataclasses.field(compare=False)  # configured by data.* (TaskSpec.configure)
    # The schedule: (phase block, source) pairs of config.phases, or None for a preset...
    written_phases: tuple[tuple[ml_collections.ConfigDict, str], ...] | None
    # ...whose inputs are these alias blocks (only those it reads: phase1, phase2, unfreezing).
    aliases: ml_collections.ConfigDict
    raw: dict[str, Any] = dataclasses.field(compare=False, repr=False)  # the config, plain (results.json)

    def phase_blocks(self, num_layers: int, *, has_pooler: bool = True):
        """The schedule as (phase block, source) pairs for an encoder of `num_layers` layers."""
        if self.written_phases is not None:
            return list(self.written_phases)
        return phases.PRESETS[self.strategy](self.aliases, num_layers, has_pooler)

    def plan(self, steps_per_epoch: int, num_layers: int, *, has_pooler: bool = True) -> list[phases.Phase]:
        return [
            phases.to_phase(b, steps_per_epoch, source)
            for b, source in self.phase_blocks(num_layers, has_pooler=has_pooler)
        ]


def resolve(config: ml_collections.ConfigDict, *, recorded: bool = False) -> RunSpec:
    """The run `config` describes, every key checked (ConfigError, or FileNotFoundError for a missing
    data file). `recorded`: a config a workdir recorded (run_params, binding), whose files need not
    exist now and whose refusals that older versions did not make (an alias key beside a written
    schedule, an inert gap rule) are left out: its run went on without them."""
    _check_options(config)
    task = _task(config)
    head = _head(config, task)
    written, aliases = _schedule(config, check_aliases=not recorded)
    data = config.data
    spec = RunSpec(
        strategy=config.strategy,
        seed=config.seed,
        max_seq_length=config.max_seq_length,
        per_device_batch_size=config.per_device_batch_size,
        eval_per_device_batch_size=config.eval_per_device_batch_size,
        max_grad_norm=config.max_grad_norm,
        final_params=config.final_params,
        boundary_train_examples=config.boundary_train_examples,
        calibration_temperature=config.calibration.temperature,
        log_every_steps=config.log_every_steps,
        eval_every_steps=config.eval_every_steps,
        checkpoint_every_steps=config.checkpoint_every_steps,
        keep_checkpoints=config.keep_checkpoints,
        async_checkpointing=config.async_checkpointing,
        compilation_cache_dir=config.compilation_cache_dir,
        model=ModelSpec(
            name_or_path=config.model.name_or_path,
            init=config.model.init,
            dtype=config.model.dtype,
            scalar_mix=config.model.scalar_mix,
            dropout_rate=config.model.dropout_rate,
            config_overrides={k: v for k, v in config.model.config_overrides.items() if v},
            allow_pickle=config.model.allow_pickle,
        ),
        head=head,
        data=DataSpec(
            task=data.task,
            train_file=data.train_file,
            dev_file=data.dev_file,
            test_file=data.test_file,
            cache_dir=data.cache_dir,
            options={
                k: v
                for k, v in data.items()
                if k not in ("task", "train_file", "dev_file", "test_file", "cache_dir")
            },
        ),
        task=task,
        written_phases=written,
        aliases=aliases,
        raw=config_cli.to_plain(config),
    )
    if not recorded:
        _check_rules_apply(spec)
        check_files_exist(spec)
    return spec


def check_files_exist(spec: RunSpec) -> None:
    for split in SPLITS:
        path = spec.data.file(split)
        if path and not Path(path).exists():
            raise FileNotFoundError(f"config.data.{split}_file: no such file: {path}")
    model_dir = Path(spec.model.name_or_path).expanduser()
    if (model_dir / "config.json").is_file():  # a hub id's is read once it is downloaded
        from stackft_jax.models import bert  # flax; only for a local model folder

        bert.BertConfig.from_pretrained(model_dir)  # an unsupported model_type, named with its file


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"config.{key}={value!r}: choose {' or '.join(choices)}")


def _check_options(config: ml_collections.ConfigDict) -> None:
    _choice("final_params", config.final_params, FINAL_PARAMS)
    _choice("model.init", config.model.init, MODEL_INITS)
    _choice("model.dtype", config.model.dtype, MODEL_DTYPES)
    for key in _POSITIVE:
        if config[key] <= 0:
            raise ConfigError(f"config.{key} must be positive, got {config[key]}")
    if config.keep_checkpoints < 1:  # 0 would keep none, and a killed run could not resume
        raise ConfigError(
            f"config.keep_checkpoints={config.keep_checkpoints}: keep at least 1 (the run resumes from it)"
        )
    if config.seed < 0:
        raise ConfigError(f"config.seed={config.seed}: choose a seed of 0 or more")
    if config.max_grad_norm < 0:  # 0 is the documented "off"; a negative norm would silently be off too
        raise ConfigError(
            f"config.max_grad_norm={config.max_grad_norm}: a norm of 0 or more (0 turns clipping off)"
        )
    # A rate of 1 or more drops every unit (flax raises on it at the first step; above 1 scales by a
    # negative keep probability).
    for key, rate in (
        ("model.dropout_rate", config.model.dropout_rate),
        ("head.dropout_rate", config.head.dropout_rate),
    ):
        if rate is not None and not 0 <= rate < 1:
            raise ConfigError(f"config.{key}={rate}: a dropout rate is at least 0 and below 1")
    if config.max_seq_length < MIN_SEQ_LENGTH:
        raise ConfigError(
            f"config.max_seq_length={config.max_seq_length}: at least {MIN_SEQ_LENGTH} tokens, so that "
            "text fits beside [CLS] and [SEP]"
        )
    architecture = {k for k, v in config.model.config_overrides.items() if v}
    if config.model.init == "pretrained" and architecture:
        raise ConfigError(
            f"config.model.config_overrides ({', '.join(sorted(architecture))}) change the architecture: "
            "they need config.model.init='random'"
        )


def _task(config: ml_collections.ConfigDict) -> TaskSpec:
    try:
        task = tasks.get_task(config.data.task)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    for key, default in task_spec.TASK_DATA_KEYS.items():
        value = config.data.get(key, default)
        if key not in task.data_keys and value != default:
            readers = sorted(name for name, t in tasks.TASKS.items() if key in t.data_keys)
            raise ConfigError(
                f"config.data.{key}={value!r}: data.task={config.data.task!r} does not read it (only "
                f"{', '.join(readers)} do{'es' if len(readers) == 1 else ''}); remove it"
            )
    task = task.configure(config.data)  # the task's own data.* keys
    if config.calibration.temperature and task.objective is not CLASSIFICATION:
        raise ConfigError(
            f"config.calibration.temperature=True scales class probabilities; data.task={config.data.task!r} "
            f"has none ({task.objective.name})"
        )
    return task


def _head(config: ml_collections.ConfigDict, task: TaskSpec) -> ml_collections.ConfigDict:
    """The chosen head's settings, checked against the task (what it reads, what it outputs)."""
    heads.check_head(config.head)  # a registered name (with a close match)
    heads.check_fits(config.head, task.objective, task_name=task.name)  # words vs sentences
    name = config.head.name
    if heads.head_input(name) == heads.PAIR and not getattr(task, "sentence_pair", False):
        raise ConfigError(
            f"config.head.name={name!r} with config.data.task={config.data.task!r}: the head compares two "
            "sentences and the task gives one text per example; choose e.g. cls_mlp, linear, densenet or "
            "highway_lstm"
        )
    head = ml_collections.ConfigDict(
        {"name": name, "dropout_rate": config.head.dropout_rate, name: config.head[name].to_dict()}
    )
    if config.strategy == "lp_ft" and not config.phases and not heads.is_linear(head):
        raise ConfigError(
            f"config.strategy=lp_ft trains a linear probe first, and config.head.name={name!r} "
            "is not linear: set head.name=linear (head.linear.pooling=cls|mean), or for word tagging "
            "token_mlp with head.token_mlp.hidden_dim=0"
        )
    head.lock()
    return head


def _schedule(config: ml_collections.ConfigDict, *, check_aliases: bool = True):
    """(written blocks or None, the alias blocks a preset reads); checks every phase's keys."""
    if config.phases and check_aliases:
        changed = [
            f"config.{alias}.{key}"
            for alias, defaults in phases.ALIAS_DEFAULTS.items()
            for key, default in defaults.items()
            if key in config[alias] and config[alias][key] != default
        ]
        if changed:
            raise ConfigError(
                f"config.phases is written, and {changed[0]}={_value(config, changed[0])!r} "
                "would be ignored: set it in the phase blocks instead (phases.clear_aliases resets the "
                "alias keys in a config file)"
            )
    phases.check_config(config)
    if config.phases:
        return tuple(phases.expand(config, 2)), ml_collections.ConfigDict()
    used = phases.PRESET_ALIASES[config.strategy]
    aliases = ml_collections.ConfigDict({alias: config[alias].to_dict() for alias in used})
    block = aliases.get("phase1")
    if block is not None:
        if block.feature_cache and block.backbone_dropout:
            raise ConfigError(
                "config.phase1.feature_cache=True needs config.phase1.backbone_dropout=False: the cache "
                "holds the frozen backbone's outputs without dropout, and with dropout they change every step"
            )
    aliases.lock()
    return None, aliases


def _value(config: ml_collections.ConfigDict, key: str) -> Any:
    _, alias, leaf = key.split(".")
    return config[alias][leaf]


def _check_rules_apply(spec: RunSpec) -> None:
    """A stop rule that cannot fire is an error, not a loop that scores train rows to no effect."""
    for b, source in spec.phase_blocks(2):
        if b.max_train_dev_gap is None:
            continue
        alias = source.split(" ")[0]  # "config.phase1", "config.phases[0]"
        metric = b.gap_metric or spec.task.gap_metric
        if metric not in spec.task.metrics:
            raise ConfigError(
                f"{alias}.gap_metric={metric!r}: data.task={spec.data.task!r} scores "
                f"{list(spec.task.metrics)}; choose one of those"
            )
        if b.gap_eval_examples <= 0:
            raise ConfigError(
                f"{alias}.max_train_dev_gap={b.max_train_dev_gap} needs {alias}.gap_eval_examples > 0 "
                f"(the train examples scored for the train/dev {metric} gap); set max_train_dev_gap=none "
                "to turn the rule off"
            )


def binding_form(spec: RunSpec) -> dict[str, Any]:
    """What binds a workdir, as `{"config": {...}}` in config key names: the keys the run uses and that
    change its results (workdirs.py compares it)."""
    raw = spec.raw
    plain: dict[str, Any] = {
        k: v for k, v in raw.items() if k not in (*_NEUTRAL, "head", "phase1", "phase2", "unfreezing")
    }
    plain["head"] = spec.head.to_dict()
    if spec.written_phases is None:
        plain.update(_preset_binding(spec))
    else:
        plain["phases"] = [_named_gap_metric(b, spec.task) for b in raw["phases"]]
    return {"config": plain}


# Presets build per-layer groups from the encoder's depth, which the spec does not know: the binding
# form builds them for this many layers (the model's name binds the depth itself).
_BINDING_NUM_LAYERS = 12


def _preset_binding(spec: RunSpec) -> dict[str, Any]:
    """A preset's phases under the alias block each came from (`phase1`, `phase2`; `unfreezing` a list),
    as the run reads them: an alias key the preset puts in no phase does not bind (stack-only's gap subset,
    the uniform-rate baseline's new-head rate), nor does a phase key its phase ignores (phases.to_phase)."""
    by_alias: dict[str, list[dict[str, Any]]] = {}
    for block, source in spec.phase_blocks(_BINDING_NUM_LAYERS):
        by_alias.setdefault(source.removeprefix("config."), []).append(_read_keys(block, spec.task))
    return {alias: blocks[0] if len(blocks) == 1 else blocks for alias, blocks in by_alias.items()}


def _named_gap_metric(block: Mapping[str, Any], task: TaskSpec) -> dict[str, Any]:
    """A phase block (plain) whose `gap_metric` "" reads as the task's: a run recorded before the task's
    default changed binds as what it ran (config_cli.with_legacy_keys), and one that left it empty as
    what it runs."""
    plain = dict(block)
    if plain.get("max_train_dev_gap") is not None:
        plain["gap_metric"] = plain.get("gap_metric") or task.gap_metric
    return plain


def _read_keys(block: ml_collections.ConfigDict, task: TaskSpec) -> dict[str, Any]:
    """A phase block without the keys `phases.to_phase` does not read given the others, and with the
    metric its gap rule compares named ("" reads as the task's, so a run written before the task's
    default changed binds as what it ran)."""
    plain = _named_gap_metric(config_cli.to_plain(block), task)
    unread = {
        "num_epochs": plain["num_steps"] > 0,
        "warmup_ratio": plain["warmup_steps"] > 0,
        "gap_eval_examples": plain["max_train_dev_gap"] is None,
        "gap_metric": plain["max_train_dev_gap"] is None,
        "feature_cache_dtype": not plain["feature_cache"],
        "feature_cache_dir": not plain["feature_cache"],
    }
    return {k: v for k, v in plain.items() if not unread.get(k, False)}


def config_from_plain(plain: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A config from its JSON form (config_cli.to_plain; config.json, results.json), keys it predates read
    as what its run did (config_cli.with_legacy_keys)."""
    config = ml_collections.ConfigDict(config_cli.with_legacy_keys(plain))
    config.phases = [ml_collections.ConfigDict(block) for block in config.phases]  # JSON left them dicts
    return config


def recorded_binding_form(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """The binding form of a workdir's recorded config (config.json's "config": the full tree this and
    earlier versions wrote), read against the `current` config's plain form: a key the record lacks (added
    since) takes its value now, a key only the record has (removed since) is dropped."""
    config = config_from_plain(current)
    config_cli.overlay_recorded(config, config_cli.with_legacy_keys(recorded))
    return binding_form(resolve(config, recorded=True))
