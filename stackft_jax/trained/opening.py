"""A trained model opened for use: from a run's workdir or from an export folder (export.py).

`open_workdir` and `open_export` only read small files and check what was asked for (a finished run or
phase, parameters that exist), so a command refuses before any compute; `Source.load` then builds the
model and reads its parameters. Neither writes anything: the workdir stays the run's (it may still be
training), and nothing goes through the workdir binding (workdirs.py).

    source = trained.open_workdir("runs/demo")                 # what results.json's `final` scored
    source = trained.open_workdir("runs/demo", phase="phase1") # the stacked head after phase 1
    source = trained.open_export("exports/demo")
    model = source.load()                                      # graphdef, params (one device)
"""

import copy
import dataclasses
from pathlib import Path
from typing import Any

import jax
from flax import nnx

from stackft_jax.config import spec
from stackft_jax.config.spec import RunSpec
from stackft_jax.data.task_spec import TaskSpec
from stackft_jax.models import bert, heads
from stackft_jax.models.adaptation import EncoderAdaptation
from stackft_jax.runtime import records
from stackft_jax.runtime.cli_errors import DataError, UsageError
from stackft_jax.trained import run_params
from stackft_jax.training import build

PARAMS = ("best", "last")
HEAD_CONFIG = "head_config.json"  # an export's head, task and run (export.py)
HEAD_WEIGHTS = "head.safetensors"
EXPORT_AGAIN = "export the run again"
TOKENIZER_RECORD = "tokenizer_files"  # head_config.json: {file name: sha256} of the export's tokenizer


@dataclasses.dataclass(frozen=True)
class Loaded:
    graphdef: nnx.GraphDef
    params: dict[str, Any]  # the full parameters, nested pure dict (`backbone/...`, `head/...`)
    bert_config: bert.BertConfig
    which: str  # what they are: "last", "best (global step N)", "phase1 (end)"


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a trained model comes from and what was asked of it; `load` reads it."""

    path: Path  # the workdir or the export folder
    run_spec: RunSpec  # the run's recorded config, resolved (an export's model.name_or_path is the folder)
    is_export: bool
    params: str  # "best" or "last"
    phase: str | None  # a finished phase whose end is wanted; None: the run's final parameters
    results: dict[str, Any] | None  # the run's results.json (an export's head_config.json `run`)

    @property
    def task(self) -> TaskSpec:
        """The run's task, configured by its data.* keys."""
        return self.run_spec.task

    @property
    def model_dir(self) -> Path:
        """The encoder's folder: its tokenizer, config.json and (unless model.init=random) weights."""
        return bert.resolve_model_dir(self.run_spec.model.name_or_path)

    @property
    def adaptation(self) -> EncoderAdaptation | None:
        """The run's LoRA / adapter parameters (its spec's, from the kinds its phases use). None for an
        export, whose encoder is plain: LoRA folded into it (hf_export), and no export of an adapters run
        exists."""
        return None if self.is_export else self.run_spec.adaptation

    def load(self) -> Loaded:
        model, bert_config = build.build_model(self.run_spec, self.task, self.model_dir, self.adaptation)
        graphdef, state = nnx.split(model)
        params = nnx.to_pure_dict(state)
        if self.is_export:
            params["head"] = _read_head(self.path / HEAD_WEIGHTS, params["head"])
            return Loaded(graphdef, params, bert_config, self.results.get("final_params", "last"))
        if self.phase is not None:
            which = f"{self.phase} (end)"
            params = run_params.phase_params(self.path, self.phase, initial=params)
        elif self.params == "best":
            step, params = run_params.best_params(self.path, params)
            which = f"best (global step {step})"
        else:
            params, which = run_params.phase_params(self.path, initial=params), "last"
        return Loaded(graphdef, params, bert_config, which)


def open_workdir(workdir: str | Path, *, params: str | None = None, phase: str | None = None) -> Source:
    """The run in `workdir`: `phase` (a finished phase's end), else `params` ("best" or "last";
    None: what the run's `final` scored), which needs a finished run."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise FileNotFoundError(f"--workdir={workdir}: no such folder")
    if (workdir / HEAD_CONFIG).is_file():
        raise UsageError(
            f"--workdir={workdir} is an export, not a run's workdir: pass it as --model={workdir}"
        )
    run_spec = run_params.recorded_spec(workdir)
    _check_tokenizer(workdir, run_spec)
    results_file = workdir / "results.json"
    results = (
        records.read_json(results_file, records.RERUN_RESULTS.format(workdir=workdir), keys=("final",))
        if results_file.is_file()
        else None
    )
    if params is not None and params not in PARAMS:
        raise UsageError(f"--params={params}: choose one of {PARAMS}")
    if phase is not None:
        if params is not None:
            raise UsageError(
                "--phase names a phase's end parameters; --params picks a finished run's: give one"
            )
        names = run_params.phase_names(run_spec)
        if phase not in names:
            raise UsageError(f"--phase={phase}: the run's phases are {names}")
        from stackft_jax.training import checkpointing  # orbax: a workdir only, never an export

        unfinished = [
            n
            for n in names[: names.index(phase) + 1]
            if not checkpointing.phase_end_path(workdir, n).is_dir()
        ]
        if unfinished:
            raise UsageError(f"--phase={phase}: {workdir} has not finished {unfinished[0]} yet")
        return Source(workdir, run_spec, False, "last", phase, results)
    if results is None:
        finished = [n for n in run_params.phase_names(run_spec) if _phase_done(workdir, n)]
        raise UsageError(
            f"{workdir}: the run has not finished (no results.json); name a finished phase with --phase"
            + (f" (finished: {', '.join(finished)})" if finished else " (none has finished yet)")
        )
    if params is None:
        params = "best" if str(results.get("final_params", "last")).startswith("best") else "last"
    if params == "best" and not (workdir / "checkpoints" / "best").is_dir():
        raise UsageError(f"--params=best: {workdir} has no best checkpoint (checkpoints/best)")
    return Source(workdir, run_spec, False, params, None, results)


def with_iob2_decoding(source: Source, flag: str = "--decode=iob2") -> Source:
    """`source` with its softmax word tagger decoding the most probable well-formed IOB2 sequence
    (the head option `iob2_decoding`; the parameters are unchanged). One line where the head has a CRF
    (which decodes under IOB2 constraints already) or tags no words."""
    head = source.run_spec.head
    if not heads.is_word_tagger(head) or head[head.name].crf:
        raise UsageError(
            f"{flag} decodes a softmax word tagger (token_mlp, bilstm); {source.path}'s head is "
            f"{head.name}"
            + (", whose CRF decodes under IOB2 constraints already" if heads.is_word_tagger(head) else "")
        )
    decoded = copy.deepcopy(head)
    with decoded.unlocked():
        decoded[head.name].iob2_decoding = True
    return dataclasses.replace(source, run_spec=dataclasses.replace(source.run_spec, head=decoded))


def _check_tokenizer(workdir: Path, run_spec: RunSpec) -> None:
    """The model folder's tokenizer files must be those the run recorded (as a rerun of the run
    requires): other files give other ids than its parameters learned."""
    from stackft_jax.training import workdirs  # transformers, for the fingerprint: a workdir only

    changes = workdirs.tokenizer_changes(workdir, bert.resolve_model_dir(run_spec.model.name_or_path))
    if changes:
        raise DataError(
            f"{workdir}: {changes[0]}; its parameters expect the ids of the files it recorded "
            f"({workdirs.DATA_FILE}): restore them"
        )


def _phase_done(workdir: Path, name: str) -> bool:
    from stackft_jax.training import checkpointing  # orbax: a workdir only, never an export

    return checkpointing.phase_end_path(workdir, name).is_dir()


def open_export(folder: str | Path) -> Source:
    """An export folder (export.py): its encoder (config.json, model.safetensors, tokenizer) and head."""
    folder = Path(folder)
    head_config = folder / HEAD_CONFIG
    if not head_config.is_file() or not (folder / HEAD_WEIGHTS).is_file():
        raise FileNotFoundError(
            f"--model={folder}: not an export of stackft_jax.export (no {HEAD_CONFIG} and {HEAD_WEIGHTS})"
        )
    record = records.read_json(head_config, EXPORT_AGAIN, keys=("config", "run"))
    try:
        config = spec.config_from_plain(record["config"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise records.damaged(
            head_config, f"its config: {type(error).__name__}: {error}", EXPORT_AGAIN
        ) from None
    run = record["run"]
    recorded = record.get(TOKENIZER_RECORD)  # exports before the key have none
    if recorded is not None:
        from stackft_jax.data import tokenization  # transformers: an export's fingerprint only

        now = tokenization.tokenizer_fingerprint(folder)
        differing = sorted(n for n in recorded.keys() | now.keys() if recorded.get(n) != now.get(n))
        if differing:
            raise DataError(
                f"{folder}: its tokenizer files ({', '.join(differing)}) changed since the export wrote them "
                f"({HEAD_CONFIG} `{TOKENIZER_RECORD}`); the model expects their ids: export the run again"
            )
    config.model.name_or_path = str(folder)  # the record says "." (hf_export): the folder itself
    return Source(folder, spec.resolve(config, recorded=True), True, "last", None, run)


def flat_head(head: dict[str, Any]) -> dict[str, Any]:
    """`head/...` parameters as {"/"-joined path: array} (safetensors names)."""
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(head)
    }


def _read_head(path: Path, like: dict[str, Any]) -> dict[str, Any]:
    """The head parameters of an export, into the tree of `like` (the model's own head parameters);
    a name missing on either side or a shape that differs is an error naming it."""
    from safetensors.numpy import load_file

    try:
        stored = load_file(str(path))
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types for damage
        raise DataError(
            f"{path}: cannot read the head's weights ({error}); the file is damaged or truncated: export "
            "the run again"
        ) from None
    expected = flat_head(like)
    if set(stored) != set(expected):
        missing, extra = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
        raise DataError(
            f"{path}: head parameters differ from the model's: missing {missing}, unexpected {extra}"
        )
    for name, value in stored.items():
        if value.shape != tuple(expected[name].shape):
            raise DataError(
                f"{path}: {name} has shape {value.shape}, the model {tuple(expected[name].shape)}"
            )
    leaves_with_path = jax.tree_util.tree_leaves_with_path(like)
    values = [stored["/".join(str(getattr(k, "key", k)) for k in p)] for p, _ in leaves_with_path]
    return jax.tree.unflatten(jax.tree.structure(like), values)
