"""Resolve once: the ConfigDict as a frozen, typed run spec, with every check run here, before any work.

    run_spec = spec.resolve(config)   # ConfigError (one line, naming the keys) on anything wrong

The spec holds what a run uses and nothing else: the configured task, the model and its encoder's shape
(read from its config.json), the chosen head's block (not every head's), the concrete phases (either
`config.phases`, or the preset `config.strategy` names built for that encoder's depth and pooler) and
the run options. `binding_form` is its plain form for workdir binding (workdirs.py): adding a head, a
task or a key with a default leaves an old workdir's form unchanged, and a preset binds the phases it
builds, not its inputs.

The encoder's shape is read with an abstract model (nnx.eval_shape); jax is asked its platform (which
starts the backend) only to resolve `model.dtype` or `model.attention` "auto".
"""

import dataclasses
import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from stackft_jax.config import config_cli, defaults, phases
from stackft_jax.data import batching, task_spec, tasks
from stackft_jax.data.task_spec import TaskSpec
from stackft_jax.models import adaptation as adaptation_kinds
from stackft_jax.models import attention, bert, heads
from stackft_jax.models.objectives import CLASSIFICATION
from stackft_jax.runtime.cli_errors import ConfigError

SPLITS = ("train", "dev", "test")
FINAL_PARAMS = ("last", "best")
NONFINITE_GUARDS = ("skip_update", "select")  # training/steps.train_step
MODEL_INITS = ("pretrained", "random")
MODEL_DTYPES = ("auto", "float32", "bfloat16")
# The shortest max_seq_length that leaves room for text: [CLS] a [SEP] b [SEP] takes 3 special tokens.
MIN_SEQ_LENGTH = 8
MAX_SEED = 2**31 - 1
_POSITIVE = (
    "log_every_steps",
    "eval_every_steps",
    "checkpoint_every_steps",
    "per_device_batch_size",
    "eval_per_device_batch_size",
    "max_seq_length",
    "boundary_train_examples",
)
# Keys that change how a run is watched or stored, never what it computes: left out of the binding form
# and of the comparison of two records (workdirs.config_differences).
RESULT_NEUTRAL_KEYS = (
    "log_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "async_checkpointing",
    "eval_per_device_batch_size",
    "compilation_cache_dir",
    "feature_cache_dir",  # the cache is content-addressed (training/feature_cache.py)
    "data.cache_dir",
    "model.allow_pickle",
    "matched_budget",  # a record of how a grid chose the step count (experiments/budgets.py)
)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name_or_path: str
    init: str  # pretrained | random
    dtype: str  # float32 | bfloat16 ("auto" resolved for the platform: `resolve_compute`)
    attention: str  # einsum | dot_product | splash (models/attention.py; "auto" resolved)
    remat: str  # none | dots_saveable | full (models/bert.py REMAT_POLICIES)
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
    selection_fraction: float = 0.0  # data/task_spec.py SELECTION; a record without it: off
    selection_seed: int = 0

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
    nonfinite_guard: str  # skip_update | select
    grad_accum_steps: int
    final_params: str  # last | best
    boundary_train_examples: int
    calibration_temperature: bool
    log_every_steps: int
    eval_every_steps: int
    checkpoint_every_steps: int
    keep_checkpoints: int
    async_checkpointing: bool
    compilation_cache_dir: str
    feature_cache_dir: str  # "": the workdir's (or a grid's); "none": the workdir's; else a shared folder
    train_order: batching.TrainOrder  # config.batching: how training batches are drawn
    model: ModelSpec
    encoder: phases.EncoderShape  # read from the model's config.json (with model.config_overrides)
    # The adaptation kinds the phases use, each with its options (config.adaptation.<kind>), and the
    # parameters they add to the encoder (None: none; BitFit adds none).
    adaptation_options: Mapping[str, Mapping[str, Any]]
    adaptation: adaptation_kinds.EncoderAdaptation | None
    # The chosen head: {name, dropout_rate, <name>: its block}, the form heads.build_head reads.
    head: ml_collections.ConfigDict
    data: DataSpec
    task: TaskSpec = dataclasses.field(compare=False)  # configured by data.* (TaskSpec.configure)
    # The schedule: config.phases, or the preset config.strategy names, built for `encoder`; budgets
    # may be in epochs (`plan` gives them in steps).
    phases: tuple[phases.Phase, ...]
    raw: dict[str, Any] = dataclasses.field(compare=False, repr=False)  # the config, plain (results.json)

    @property
    def written(self) -> bool:
        """Whether the config wrote its schedule (`config.phases`) rather than naming a preset."""
        return bool(self.raw["phases"])

    def plan(self, steps_per_epoch: int) -> list[phases.Phase]:
        """The phases with their budgets in steps, for a train split of `steps_per_epoch` batches."""
        return [phase.budgeted(steps_per_epoch) for phase in self.phases]


def resolve(
    config: ml_collections.ConfigDict, *, recorded: bool = False, encoder: phases.EncoderShape | None = None
) -> RunSpec:
    """The run `config` describes, every key checked (ConfigError, or FileNotFoundError for a missing
    data file). `recorded`: a config a workdir recorded (run_params, binding), whose files need not
    exist now and whose refusals that older versions did not make (an alias key beside a written
    schedule, an inert gap rule) are left out: its run went on without them. `encoder`: the encoder's
    shape when the caller has it (else read from the model's config.json, downloaded for a hub id)."""
    _check_options(config)
    if "adaptation" in config:  # absent from a recorded binding form whose phases used no kind
        adaptation_kinds.check_options(config.adaptation.to_dict())  # every kind's, used or not
    train_order = _train_order(config)
    task = _task(config)
    _check_gap_metrics(config, task)
    head = _head(config, task)
    if not recorded:
        _check_aliases(config)
    dtype, attention, remat = resolve_compute(config.model)
    model = ModelSpec(
        name_or_path=config.model.name_or_path,
        init=config.model.init,
        dtype=dtype,
        attention=attention,
        remat=remat,
        scalar_mix=config.model.scalar_mix,
        dropout_rate=config.model.dropout_rate,
        config_overrides={k: v for k, v in config.model.config_overrides.items() if v},
        allow_pickle=config.model.allow_pickle,
    )
    kinds = phases.adaptation_kinds_of(config)
    options = {
        kind: adaptation_kinds.KINDS[kind].resolve(config.adaptation[kind].to_dict()) for kind in kinds
    }
    extra = adaptation_kinds.encoder_adaptation(kinds, options)
    encoder = encoder or encoder_shape(model.name_or_path, model.config_overrides, extra)
    data = config.data
    spec = RunSpec(
        strategy=config.strategy,
        seed=config.seed,
        max_seq_length=config.max_seq_length,
        per_device_batch_size=config.per_device_batch_size,
        eval_per_device_batch_size=config.eval_per_device_batch_size,
        max_grad_norm=config.max_grad_norm,
        nonfinite_guard=config.nonfinite_guard,
        grad_accum_steps=config.get("grad_accum_steps", 1),  # runs recorded before it: 1
        final_params=config.final_params,
        boundary_train_examples=config.boundary_train_examples,
        calibration_temperature=config.calibration.temperature,
        log_every_steps=config.log_every_steps,
        eval_every_steps=config.eval_every_steps,
        checkpoint_every_steps=config.checkpoint_every_steps,
        keep_checkpoints=config.keep_checkpoints,
        async_checkpointing=config.async_checkpointing,
        compilation_cache_dir=config.compilation_cache_dir,
        feature_cache_dir=config.feature_cache_dir,
        train_order=train_order,
        model=model,
        encoder=encoder,
        adaptation_options=options,
        adaptation=extra,
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
                if k
                not in (
                    "task",
                    "train_file",
                    "dev_file",
                    "test_file",
                    "cache_dir",
                    "selection_fraction",
                    "selection_seed",
                )
            },
            selection_fraction=float(data.get("selection_fraction", 0.0)),
            selection_seed=int(data.get("selection_seed", 0)),
        ),
        task=task,
        phases=_with_budget(phases.expand(config, encoder), config.get("budget_steps", 0)),
        # The resolved compute settings, so that config.json and results.json say what ran and a rerun
        # from them on another platform runs the same.
        raw=_with_model(config_cli.to_plain(config), dtype=dtype, attention=attention, remat=remat),
    )
    if not recorded:
        _check_rules_apply(spec)
        check_files_exist(spec)
    return spec


def _with_budget(plan: tuple[phases.Phase, ...], budget_steps: int) -> tuple[phases.Phase, ...]:
    """`budget_steps` > 0 sets the last phase's step budget (a grid's budget axis: learning curves);
    0 leaves every phase's own."""
    if not isinstance(budget_steps, int) or budget_steps < 0:
        raise ConfigError(f"config key 'budget_steps' = {budget_steps!r}: 0 (off) or a positive step count")
    if not budget_steps:
        return plan
    return (*plan[:-1], dataclasses.replace(plan[-1], num_steps=budget_steps))


def check_files_exist(spec: RunSpec) -> None:
    for split in SPLITS:
        path = spec.data.file(split)
        if path and not Path(path).exists():
            raise FileNotFoundError(f"config.data.{split}_file: no such file: {path}")
    # The model's config.json (an unsupported model_type, named with its file) was read for the
    # encoder's shape (encoder_shape), before any of this.


def resolve_compute(model: ml_collections.ConfigDict | ModelSpec) -> tuple[str, str, str]:
    """`model.dtype`, `model.attention` and `model.remat` checked, "auto" resolved for this platform:
    bfloat16 compute on GPU and TPU, float32 on CPU (parameters and optimizer state stay float32
    either way); the fused attention the platform has (models/attention.py). ConfigError on an unknown
    value or a kernel the platform lacks."""
    _choice("model.dtype", model.dtype, MODEL_DTYPES)
    _choice("model.remat", model.remat, tuple(bert.REMAT_POLICIES))
    _choice("model.attention", model.attention, attention.ATTENTIONS)
    asks_device = "auto" in (model.dtype, model.attention) or model.attention == "splash"
    platform, gpu_capability, num_devices = _device() if asks_device else ("", None, 1)
    dtype = model.dtype
    if dtype == "auto":
        dtype = "bfloat16" if platform in ("gpu", "tpu") else "float32"
    resolved = model.attention
    if resolved in ("auto", "splash"):
        resolved = attention.resolve_attention(
            resolved, platform=platform, dtype=dtype, num_devices=num_devices, gpu_capability=gpu_capability
        )
    return dtype, resolved, model.remat


def _device() -> tuple[str, float | None, int]:
    """jax's platform (cpu, gpu, tpu), the CUDA compute capability of a GPU (else None) and the device
    count. Starts the backend: asked only when "auto" or a platform's kernel needs it."""
    import jax

    capability = getattr(jax.devices()[0], "compute_capability", None)  # CUDA devices: "9.0"
    return jax.default_backend(), float(capability) if capability else None, jax.device_count()


def _with_model(raw: dict[str, Any], **resolved: str) -> dict[str, Any]:
    raw["model"] = {**raw["model"], **resolved}
    return raw


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"config.{key}={value!r}: choose {' or '.join(choices)}")


def _check_options(config: ml_collections.ConfigDict) -> None:
    _choice("final_params", config.final_params, FINAL_PARAMS)
    _choice("nonfinite_guard", config.nonfinite_guard, NONFINITE_GUARDS)
    _choice("model.init", config.model.init, MODEL_INITS)
    for key in _POSITIVE:
        if config[key] <= 0:
            raise ConfigError(f"config.{key} must be positive, got {config[key]}")
    if config.keep_checkpoints < 1:  # 0 would keep none, and a killed run could not resume
        raise ConfigError(
            f"config.keep_checkpoints={config.keep_checkpoints}: keep at least 1 (the run resumes from it)"
        )
    if config.seed < 0:
        raise ConfigError(f"config.seed={config.seed}: choose a seed of 0 or more")
    if config.seed > MAX_SEED:  # the dropout key is made under jit from an int32 seed (training/loop.py)
        raise ConfigError(f"config.seed={config.seed}: choose a seed of at most 2**31 - 1 ({MAX_SEED})")
    for key, zero_means in _sizes().items():
        value = _lookup(config, key)
        if value < 0 or (value == 0 and not zero_means):
            least = f"0 or more ({zero_means})" if zero_means else "at least 1"
            raise ConfigError(f"config.{key}={value}: a size or count, {least}")
    accum = config.get("grad_accum_steps", 1)
    if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
        raise ConfigError(f"config.grad_accum_steps={accum!r}: a whole number of micro-batches, 1 or more")
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


@functools.cache
def _sizes() -> dict[str, str]:
    """{key: what 0 means, "" when nothing} for every integer of the heads' blocks and of
    `model.config_overrides`: widths, units, layer and head counts. Each is checked wherever it is set,
    whether the chosen head reads it or not; 0 only where its comment gives it a meaning ("0: none")."""
    reference = defaults.get_config()
    comments = config_cli.key_comments()
    sizes = {}
    for key in config_cli.flat_keys(reference):
        if not key.startswith(("head.", "model.config_overrides.")):
            continue
        value = _lookup(reference, key)
        if isinstance(value, int) and not isinstance(value, bool):
            zero = re.search(r"\b0: ([^;]+)", comments.get(key, ""))
            sizes[key] = f"0: {zero[1]}" if zero else ""
    return sizes


def _lookup(config: ml_collections.ConfigDict, key: str) -> Any:
    for part in key.split("."):
        config = config[part]
    return config


def _train_order(config: ml_collections.ConfigDict) -> batching.TrainOrder:
    """config.batching, checked against max_seq_length (a bucket list that fits it, a bounded count)."""
    block = config.batching
    _choice("batching.scheme", block.scheme, batching.SCHEMES)
    _choice("batching.loss_weighting", block.loss_weighting, batching.LOSS_WEIGHTINGS)
    width, length = block.bucket_tokens, config.max_seq_length
    if width != 0 and not MIN_SEQ_LENGTH <= width <= length:
        raise ConfigError(
            f"config.batching.bucket_tokens={width}: a bucket width from {MIN_SEQ_LENGTH} to max_seq_length "
            f"({length}) tokens, or 0 for the doubling buckets {batching.length_buckets(length)}"
        )
    if not 0 <= block.min_row_share < 1:
        raise ConfigError(
            f"config.batching.min_row_share={block.min_row_share}: a share of a phase's batches from 0 "
            "(compile every packed row count needed) to below 1"
        )
    if block.group_batches < 1:
        raise ConfigError(
            f"config.batching.group_batches={block.group_batches}: at least 1 (batches per mega-batch "
            "sorted by length)"
        )
    return batching.TrainOrder.of(
        block.scheme,
        max_seq_length=length,
        bucket_tokens=width,
        group_batches=block.group_batches,
        loss_weighting=block.loss_weighting,
        per_device_batch_size=config.per_device_batch_size,
        # packed lays its rows out for the step's strided micro-batches (data/packing.py)
        grad_accum_steps=config.get("grad_accum_steps", 1),
        min_row_share=block.min_row_share,
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
    task_spec.check_selection_fraction(config.data.get("selection_fraction", 0.0))
    if config.calibration.temperature and task.objective is not CLASSIFICATION:
        raise ConfigError(
            f"config.calibration.temperature=True scales class probabilities; data.task={config.data.task!r} "
            f"has none ({task.objective.name})"
        )
    return task


def _check_gap_metrics(config: ml_collections.ConfigDict, task: TaskSpec) -> None:
    """A `gap_metric` the task does not score is refused wherever it is set, whether a gap rule reads it
    or not ("": the task's primary metric)."""
    blocks = [(f"config.{alias}", config[alias]) for alias in phases.ALIASES]
    blocks += [(f"config.phases[{i}]", block) for i, block in enumerate(config.phases)]
    for where, block in blocks:
        metric = block.get("gap_metric", "")
        if metric and metric not in task.metrics:
            raise ConfigError(
                f"{where}.gap_metric={metric!r}: data.task={task.name!r} scores {list(task.metrics)}; "
                "choose one of those, or '' for its primary one"
            )


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


def encoder_shape(
    name_or_path: str,
    overrides: Mapping[str, int] | None = None,
    adaptation: adaptation_kinds.EncoderAdaptation | None = None,
) -> phases.EncoderShape:
    """The encoder's depth, pooler and parameter paths: its config.json (downloaded for a hub id) with
    the architecture `overrides` (model.config_overrides) and the `adaptation` parameters it adds."""
    return _encoder_shape(name_or_path, tuple(sorted((overrides or {}).items())), adaptation)


@functools.cache
def _encoder_shape(
    name_or_path: str,
    overrides: tuple[tuple[str, int], ...],
    adaptation: adaptation_kinds.EncoderAdaptation | None,
) -> phases.EncoderShape:
    from flax import nnx  # the model registry's own import; no backend starts for an abstract model

    from stackft_jax.models import bert

    encoder = bert.BertConfig.from_pretrained(bert.resolve_model_dir(name_or_path))
    encoder = dataclasses.replace(encoder, **dict(overrides))
    abstract = nnx.eval_shape(lambda: bert.BertModel(encoder, adaptation=adaptation, rngs=nnx.Rngs(0)))
    return phases.EncoderShape(
        num_layers=encoder.num_hidden_layers,
        has_pooler=encoder.family.has_pooler,
        parameters=tuple(
            f"backbone/{name}" for name in _paths(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))
        ),
    )


def _paths(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    return [
        path
        for key, value in tree.items()
        for path in (_paths(value, f"{prefix}{key}/") if isinstance(value, Mapping) else [f"{prefix}{key}"])
    ]


def _check_aliases(config: ml_collections.ConfigDict) -> None:
    """With `config.phases` written, a changed alias key (`phase1.*`, ...) would be ignored: refused."""
    if config.phases:
        changed = [
            f"config.{alias}.{key}"
            for alias, declared in phases.ALIASES.items()
            for key, default in declared.config().items()
            if key in config[alias] and config[alias][key] != default
        ]
        if changed:
            raise ConfigError(
                f"config.phases is written, and {changed[0]}={_value(config, changed[0])!r} "
                "would be ignored: set it in the phase blocks instead (phases.clear_aliases resets the "
                "alias keys in a config file)"
            )


def _value(config: ml_collections.ConfigDict, key: str) -> Any:
    _, alias, leaf = key.split(".")
    return config[alias][leaf]


def _check_rules_apply(spec: RunSpec) -> None:
    """A stop rule that cannot fire is an error, not a loop that scores train rows to no effect."""
    for b in spec.phases:
        if b.max_train_dev_gap is None:
            continue
        alias = b.source.split(" ")[0]  # "config.phase1", "config.phases[0]"
        metric = spec.task.rule_metric(b.gap_metric or spec.task.gap_metric)
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
        k: v
        for k, v in raw.items()
        if k not in (*RESULT_NEUTRAL_KEYS, "head", "phase1", "phase2", "unfreezing", "adaptation")
    }
    if not _reads_entity_f1(spec):  # a run no rule of which reads it binds alike under either value
        plain["data"] = {k: v for k, v in plain["data"].items() if k != "entity_f1"}
    if spec.adaptation_options:  # only the options of the kinds the phases use
        plain["adaptation"] = {kind: dict(options) for kind, options in spec.adaptation_options.items()}
    for key in RESULT_NEUTRAL_KEYS:
        parent, _, leaf = key.rpartition(".")
        if parent and isinstance(plain.get(parent), Mapping):
            plain[parent] = {k: v for k, v in plain[parent].items() if k != leaf}
    plain["head"] = spec.head.to_dict()
    if spec.written:
        plain["phases"] = [_named_gap_metric(b, spec.task) for b in raw["phases"]]
    else:
        plain.update(_preset_binding(spec))
    return {"config": plain}


def task_data_keys(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The `config.data.*` keys of TASK_DATA_KEYS that config's task reads; () for a task not known."""
    try:
        return tasks.get_task(config.data.task).data_keys
    except (KeyError, ValueError):
        return ()


def _reads_entity_f1(spec: RunSpec) -> bool:
    """Whether `data.entity_f1` changes what the run does: its best checkpoint, or a gap rule on `f1` or
    on the task's primary metric (the key picks which entity F1 those are)."""
    if "entity_f1" not in spec.task.data_keys:
        return False
    gap_rules = [b for b in spec.phases if b.max_train_dev_gap is not None]
    return spec.final_params == "best" or any(b.gap_metric in ("", "f1") for b in gap_rules)


def _preset_binding(spec: RunSpec) -> dict[str, Any]:
    """A preset's phases under the alias block each came from (`phase1`, `phase2`; `unfreezing` a list),
    as the run reads them: an alias key the preset puts in no phase does not bind (stack-only's gap subset,
    the uniform-rate baseline's new-head rate), nor does a phase key its phase ignores (`_read_keys`)."""
    by_alias: dict[str, list[dict[str, Any]]] = {}
    for phase in spec.phases:
        by_alias.setdefault(phase.source.removeprefix("config."), []).append(_read_keys(phase, spec.task))
    return {alias: blocks[0] if len(blocks) == 1 else blocks for alias, blocks in by_alias.items()}


def _named_gap_metric(block: Mapping[str, Any], task: TaskSpec) -> dict[str, Any]:
    """A phase block (plain) whose `gap_metric` "" reads as the task's: a run recorded before the task's
    default changed binds as what it ran (config_cli.with_legacy_keys), and one that left it empty as
    what it runs."""
    plain = dict(block)
    if plain.get("max_train_dev_gap") is not None:
        plain["gap_metric"] = plain.get("gap_metric") or task.gap_metric
    return plain


def _read_keys(phase: phases.Phase, task: TaskSpec) -> dict[str, Any]:
    """A preset's phase without the keys the run does not read given the others, and with the metric its
    gap rule compares named ("" reads as the task's, so a run written before the task's default changed
    binds as what it ran)."""
    plain = _named_gap_metric(phase.as_block(), task)
    unread = {
        "num_epochs": plain["num_steps"] > 0,
        "warmup_ratio": plain["warmup_steps"] > 0,
        "gap_eval_examples": plain["max_train_dev_gap"] is None,
        "gap_metric": plain["max_train_dev_gap"] is None,
        "feature_cache_dtype": not plain["feature_cache"],
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
