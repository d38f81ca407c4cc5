"""A trained model (trained.py) written as a folder that transformers and PyTorch load: the encoder in
Hugging Face layout, the head, a transformers task model where one is exact, a model card. The command
and the folder's layout: export.py.

Adaptation (models/adaptation/): a LoRA run's encoder is written with the update folded into its kernels,
and the update itself in peft's format in `peft_adapter/` for the encoder it was trained on; a BitFit
run's encoder is plain; a run with Houlsby adapters has no export (`refuse_unexportable`).
"""

import copy
import dataclasses
import json
import os
import shutil
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np

from stackft_jax.runtime import records
from stackft_jax.runtime.cli_errors import UsageError, refuse_to_replace
from stackft_jax.trained import opening
from stackft_jax.training import workdirs

TASK_MODEL_DIR = "transformers_task_model"
PEFT_DIR = "peft_adapter"  # a LoRA run's update in peft's format
PEFT_BASE_DIR = "base_model"  # inside PEFT_DIR: the encoder it applies to, when not the run's checkpoint
# transformers' class-name stem per config.json model_type.
_CLASS_STEMS = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "electra": "Electra",
    "distilbert": "DistilBert",
}
_TOKENIZER_FILES = (
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
)


def hf_config(model_dir: Path, bert_config, architecture: str) -> dict[str, Any]:
    """The encoder's config.json: the run's model folder's, with the run's architecture and dropout."""
    config = json.loads((model_dir / "config.json").read_text())
    family = bert_config.family
    own_keys = {ours: theirs for theirs, ours in family.config_keys.items()}
    for field, value in vars(bert_config).items():
        if field == "embedding_size" and value is None:
            continue
        if field == "sinusoidal_positions" and field not in own_keys:
            continue
        if field == "type_vocab_size" and bert_config.model_type == "distilbert":
            continue
        config[own_keys.get(field, field)] = value
    config["architectures"] = [architecture]
    config.pop("torch_dtype", None)
    config["dtype"] = "float32"
    return config


def transformers_task_model(source: opening.Source, loaded: opening.Loaded) -> tuple[str, dict, dict] | str:
    """(class name, extra config.json keys, tensors) of the transformers class the run's model is
    exactly, or why there is none."""
    run_spec, task, bert_config = source.run_spec, source.task, loaded.bert_config
    stem, family = _CLASS_STEMS[bert_config.model_type], bert_config.family
    if run_spec.model.scalar_mix:
        return "the head reads a learned mix of all layers (model.scalar_mix), no transformers class does"
    backbone = {k: v for k, v in loaded.params["backbone"].items()}
    head = loaded.params["head"]["net"]
    names = list(getattr(task, "prediction_names", None) or task.output_names)
    labels = {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}
    name = run_spec.head.name
    from stackft_jax.models import bert, heads  # flax: only when writing an export

    def linear(prefix: str, node: dict) -> dict:
        return {
            f"{prefix}.weight": np.ascontiguousarray(np.asarray(node["kernel"], np.float32).T),
            f"{prefix}.bias": np.asarray(node["bias"], np.float32),
        }

    if task.objective.name == "word_tagging":
        if not heads.is_linear(run_spec.head):
            return f"head {name!r} is more than one dense layer on the words; *ForTokenClassification is one"
        body = bert.to_hf_weights({**backbone, "pooler": None}, bert_config)
        tensors = {family.prefix + k: v for k, v in body.items()} | linear("classifier", head["output"])
        return f"{stem}ForTokenClassification", labels, tensors
    if name != "cls_mlp" or run_spec.head.cls_mlp.hidden_dim != bert_config.hidden_size:
        return (
            f"head {name!r} has no transformers class: only cls_mlp with hidden_dim = hidden_size "
            f"({bert_config.hidden_size}) is BertForSequenceClassification's pooler + classifier"
        )
    problem = "regression" if task.objective.name == "regression" else "single_label_classification"
    extra = {**labels, "problem_type": problem}
    if bert_config.model_type == "bert":
        body = bert.to_hf_weights({**backbone, "pooler": head["hidden"]}, bert_config)
        tensors = {family.prefix + k: v for k, v in body.items()} | linear("classifier", head["output"])
        return f"{stem}ForSequenceClassification", extra, tensors
    if bert_config.model_type in ("roberta", "xlm-roberta"):
        body = bert.to_hf_weights({**backbone, "pooler": None}, bert_config)
        tensors = (
            {family.prefix + k: v for k, v in body.items()}
            | linear("classifier.dense", head["hidden"])
            | linear("classifier.out_proj", head["output"])
        )
        return f"{stem}ForSequenceClassification", extra, tensors
    return f"{stem}ForSequenceClassification's head is not a tanh MLP on the first token"


def refuse_unexportable(source: opening.Source) -> None:
    """A run with Houlsby adapters cannot be written as transformers' model (no class has them)."""
    settings = source.adaptation
    if settings is not None and settings.adapters is not None:
        raise UsageError(
            f"{source.path}: the run trains Houlsby adapters (adaptation kind 'adapters'), which cannot be "
            "folded into the encoder and which transformers' models have no place for, so it has no export; "
            f"predict runs it: python -m stackft_jax.predict --workdir={source.path} --input=... --output=..."
        )


def _write_peft_adapter(source: opening.Source, loaded: opening.Loaded, folder: Path) -> dict[str, Any]:
    """The run's LoRA update in peft's format in `folder`, for the encoder it was trained on: the run's
    model (`base_model_name_or_path`) when its weights are still the checkpoint's (only LoRA and the head
    trained), else that encoder written into `folder/base_model`. Returns head_config.json's record."""
    from safetensors.numpy import save_file

    from stackft_jax.models import bert  # flax: only when writing an export
    from stackft_jax.models.adaptation import lora

    settings, bert_config = source.adaptation.lora, loaded.bert_config
    backbone = loaded.params["backbone"]
    tensors = lora.peft_tensors(backbone, settings, lambda i, p: bert.hf_projection_name(bert_config, i, p))
    base = lora.without_lora(backbone)
    name = source.run_spec.model.name_or_path
    if _is_checkpoint(source, base):
        base_model = str(source.model_dir) if name == bert.EMBEDDED_MODEL else name
    else:
        base_dir = folder / PEFT_BASE_DIR
        base_dir.mkdir(parents=True)
        stem = _CLASS_STEMS[bert_config.model_type]
        config = hf_config(source.model_dir, bert_config, f"{stem}Model")
        (base_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(bert.to_hf_weights(base, bert_config), str(base_dir / "model.safetensors"))
        _copy_tokenizer(source.model_dir, base_dir)
        base_model = f"{PEFT_DIR}/{PEFT_BASE_DIR}"
    lora.write_peft_adapter(folder, tensors, settings, base_model=base_model)
    return {"folder": PEFT_DIR, "base_model": base_model, **dataclasses.asdict(settings)}


def _is_checkpoint(source: opening.Source, backbone: dict[str, Any]) -> bool:
    """Whether every encoder weight the run's checkpoint holds is still exactly the checkpoint's."""
    if source.run_spec.model.init != "pretrained":
        return False
    from stackft_jax.models import bert  # flax: only when writing an export

    tensors = bert.load_hf_weights(source.model_dir, allow_pickle=source.run_spec.model.allow_pickle)
    checkpoint, _ = bert.convert_hf_weights(tensors, bert.BertConfig.from_pretrained(source.model_dir))

    def same(ours: Any, theirs: Any) -> bool:
        if isinstance(theirs, dict):
            return all(same(ours[k] if k in ours else ours[str(k)], v) for k, v in theirs.items())
        return np.array_equal(np.asarray(ours, np.float32), theirs)

    return same(backbone, checkpoint)


def _copy_tokenizer(model_dir: Path, folder: Path) -> None:
    for path in sorted(model_dir.iterdir()):
        if path.is_file() and any(fnmatch(path.name, pattern) for pattern in _TOKENIZER_FILES):
            shutil.copy2(path, folder / path.name)


def _export_config(source: opening.Source) -> dict[str, Any]:
    """The run's config as predict and new runs rebuild the model from the export: the encoder is the
    folder's (config.json holds any architecture override)."""
    plain = copy.deepcopy(source.run_spec.raw)  # the run's whole config, as results.json records it
    plain["model"]["name_or_path"] = "."  # the export folder itself (opening.open_export)
    plain["model"]["init"] = "pretrained"
    plain["model"]["config_overrides"] = dict.fromkeys(plain["model"]["config_overrides"], 0)
    return plain


def write(
    source: opening.Source, loaded: opening.Loaded, folder: Path, *, name: str | None = None
) -> dict[str, Any]:
    """Writes the export's files into the (empty) `folder`; returns head_config.json's contents. `name`:
    the folder's name once in place (the model card's commands use it), `folder`'s own by default."""
    from safetensors.numpy import save_file

    from stackft_jax.data import tokenization
    from stackft_jax.models import bert  # flax: only when writing an export
    from stackft_jax.models.adaptation import lora

    refuse_unexportable(source)
    peft_adapter = None
    if source.adaptation is not None and source.adaptation.lora is not None:
        peft_adapter = _write_peft_adapter(source, loaded, folder / PEFT_DIR)
        merged = lora.merge(loaded.params["backbone"], source.adaptation.lora)
        loaded = dataclasses.replace(loaded, params={**loaded.params, "backbone": merged})
    stem = _CLASS_STEMS[loaded.bert_config.model_type]
    config = hf_config(source.model_dir, loaded.bert_config, f"{stem}Model")
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(
        bert.to_hf_weights(loaded.params["backbone"], loaded.bert_config), str(folder / "model.safetensors")
    )
    _copy_tokenizer(source.model_dir, folder)
    head = {
        k: np.ascontiguousarray(np.asarray(v, np.float32))
        for k, v in opening.flat_head(loaded.params["head"]).items()
    }
    save_file(head, str(folder / opening.HEAD_WEIGHTS))
    task_model = transformers_task_model(source, loaded)
    if isinstance(task_model, tuple):
        architecture, extra, tensors = task_model
        sub = folder / TASK_MODEL_DIR
        sub.mkdir()
        (sub / "config.json").write_text(
            json.dumps({**hf_config(source.model_dir, loaded.bert_config, architecture), **extra}, indent=2)
            + "\n"
        )
        save_file(tensors, str(sub / "model.safetensors"))
        _copy_tokenizer(source.model_dir, sub)
    results = source.results or {}
    scores, scores_from = exported_scores(source, results)
    describe = source.task.describe()
    head = source.run_spec.head  # the chosen head's block only
    record = {
        "format": "stackft_jax export 1",
        "source": str(source.path.absolute()),
        "params": loaded.which,
        "task": describe,
        "label_names": list(getattr(source.task, "prediction_names", None) or source.task.output_names),
        "tag_scheme": describe.get("tag_scheme"),
        "head": {"name": head.name, **head[head.name].to_dict()},
        "strategy": source.run_spec.strategy,
        "phases": [
            {k: r.get(k) for k in ("phase", "steps", "stop_reason", "learning_rates")}
            for r in results.get("phases", [])
        ],
        "final": scores,  # the exported parameters' own recorded scores (None: none recorded)
        "final_from": scores_from,
        "transformers_task_model": task_model[0] if isinstance(task_model, tuple) else None,
        "transformers_task_model_why_not": None if isinstance(task_model, tuple) else task_model,
        # What predict --model checks the folder's tokenizer files against.
        opening.TOKENIZER_RECORD: tokenization.tokenizer_fingerprint(folder),
        # A LoRA run: its update in peft's format (folder, base model, rank, alpha, dropout, targets).
        "peft_adapter": peft_adapter,
        "config": _export_config(source),
        # What opening.open_export hands on as the run's results (predict's record of where it came from).
        "run": {
            "final_params": loaded.which,
            "final": scores,
            "phases": results.get("phases", []),
        },
    }
    (folder / opening.HEAD_CONFIG).write_text(json.dumps(record, indent=2) + "\n")
    (folder / "README.md").write_text(model_card(record, name or folder.name))
    return record


def exported_scores(source: opening.Source, results: dict[str, Any]) -> tuple[dict | None, str]:
    """The recorded scores of the parameters exported, and where they come from: the run's `final` when
    it scored these parameters; a phase's end: that phase's boundary evaluation; best: the best
    checkpoint's evaluation; last of a run that scored its best: the last phase's boundary. Never another
    set of parameters' scores (None when none was recorded)."""
    phase_records = {r.get("phase"): r for r in results.get("phases", [])}

    def boundary(name: str | None) -> dict | None:
        dev = ((phase_records.get(name) or {}).get("boundary") or {}).get("dev")
        return {"dev": dev} if dev else None

    if source.phase is not None:
        return boundary(source.phase), f"the end of {source.phase} (its boundary evaluation)"
    scored = "best" if str(results.get("final_params", "last")).startswith("best") else "last"
    if source.params == scored:
        return results.get("final"), "the run's `results.json` `final`"
    if source.params == "best":
        dev = (results.get("best") or {}).get("dev")
        return ({"dev": dev} if dev else None), "the best checkpoint's dev evaluation"
    last = results["phases"][-1].get("phase") if results.get("phases") else None
    return boundary(last), "the end of the last phase (its boundary evaluation)"


def model_card(record: dict[str, Any], name: str) -> str:
    config, task = record["config"], record["task"]
    data = config["data"]
    files = ", ".join(f"{k}={data[k]}" for k in ("train_file", "dev_file", "test_file") if data.get(k))
    final = record["final"] or {}
    scores = "\n".join(
        f"| {split} | " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()) + " |"
        for split, values in final.items()
    )
    phases = "\n".join(
        f"- {p['phase']}: {p['steps']} steps, stopped at {p['stop_reason']}" for p in record["phases"]
    )
    task_model = record["transformers_task_model"]
    transformers_head = (
        f"`{TASK_MODEL_DIR}/` holds the whole model as `{task_model}`:\n\n```python\n"
        f"from transformers import AutoModelFor{task_model.split('For')[1]}, AutoTokenizer\n"
        f'model = AutoModelFor{task_model.split("For")[1]}.from_pretrained("{name}/{TASK_MODEL_DIR}")\n```\n'
        if task_model
        else f"No transformers class holds this head ({record['transformers_task_model_why_not']}); "
        "`head.safetensors` and `head_config.json` describe it.\n"
    )
    adapter = record.get("peft_adapter")
    peft_use = ""
    if adapter:
        # A base written into the export is named relative to it; otherwise it is the run's model.
        base = adapter["base_model"]
        base = f"{name}/{base}" if base.startswith(f"{PEFT_DIR}/") else base
        peft_use = f"""
The encoder holds the run's LoRA update folded into its weights. `{adapter["folder"]}/` holds the update
itself in peft's format (rank {adapter["rank"]}, alpha {adapter["alpha"]}), for the encoder it was trained on:

```python
from peft import PeftModel
from transformers import AutoModel
base = AutoModel.from_pretrained("{base}")
model = PeftModel.from_pretrained(base, "{name}/{adapter["folder"]}")
```
"""
    return f"""# {name}

A BERT-family encoder fine-tuned with stackft_jax on the task `{task["name"]}` ({task["objective"]}; outputs
{", ".join(record["label_names"])}{"; tags " + record["tag_scheme"] if record["tag_scheme"] else ""}).

## Training

- data: {files or "the Hugging Face dataset"}
- head `{record["head"]["name"]}`, strategy `{record["strategy"]}`
- parameters exported: {record["params"]}
{phases}

The run's whole config is `config` in `head_config.json`; its workdir was `{record["source"]}`.

## Results ({record["final_from"]})

| split | scores |
| --- | --- |
{scores or "| - | none recorded |"}

## Use

stackft_jax (the encoder and head, the same predictions as the run):

```
python -m stackft_jax.predict --model={name} --input=FILE --output=predictions.jsonl
python -m stackft_jax.main --config=... --config.model.name_or_path={name}   # a new run from this encoder
```

transformers / PyTorch (the encoder):

```python
from transformers import AutoModel, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("{name}")
model = AutoModel.from_pretrained("{name}")
```
{peft_use}
{transformers_head}"""


def export(source: opening.Source, out: str | Path, *, overwrite: bool = False) -> Path | None:
    """Writes the export of `source` to `out` (process 0; other processes only load); returns `out`."""
    import jax  # jax: only when writing an export

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out={out} is a file: an export is a folder")
    workdirs.refuse_run_target("out", out)
    refuse_to_replace("out", out, overwrite=overwrite)
    if out.is_dir() and any(out.iterdir()) and not (out / opening.HEAD_CONFIG).is_file():
        # --overwrite replaces an earlier export, never a folder of something else.
        raise UsageError(
            f"--out={out} holds files that are no export (no {opening.HEAD_CONFIG}); --overwrite "
            "replaces only an earlier export: choose a new folder"
        )
    refuse_unexportable(source)  # before any compute
    earlier = earlier_export_files(out) if out.is_dir() and any(out.iterdir()) else None
    loaded = source.load()
    if jax.process_index() != 0:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write(source, loaded, tmp, name=out.name)  # tmp is renamed to out
        written = _files_under(tmp)
        manifest = {"format": MANIFEST_FORMAT, "files": written}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if earlier is None:
            os.replace(tmp, out)
        else:
            _replace_export(out, tmp, earlier, [*written, MANIFEST])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


MANIFEST = "export_manifest.json"  # every file an export wrote: what --overwrite may replace
MANIFEST_FORMAT = "stackft_jax export manifest 1"


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def earlier_export_files(out: Path) -> set[str]:
    """The files the export in `out` wrote (its manifest, itself included): --overwrite replaces
    these and nothing else. An export from before manifests: its files that an export writes."""
    manifest = out / MANIFEST
    if manifest.is_file():
        remedy = "remove the export yourself, or choose a new --out"
        record = records.read_json(manifest, remedy, keys=("files",))
        return {*record["files"], MANIFEST}
    own = (opening.HEAD_CONFIG, opening.HEAD_WEIGHTS, "config.json", "model.safetensors", "README.md")
    return {
        name
        for name in _files_under(out)
        if name in own
        or name.split("/")[0] in (TASK_MODEL_DIR, PEFT_DIR)
        or ("/" not in name and any(fnmatch(name, pattern) for pattern in _TOKENIZER_FILES))
    }


def _replace_export(out: Path, new: Path, earlier: set[str], written: list[str]) -> None:
    """Replaces the earlier export's files in `out` by those of `new` (a complete export); whatever
    else `out` holds (notes, a copied workdir) stays where it is, untouched."""
    clashing = [name for name in written if (out / name).exists() and name not in earlier]
    if clashing:
        raise UsageError(
            f"--out={out}: {clashing[0]} was not written by the earlier export, and this export writes a "
            "file there; move it, or choose a new --out"
        )
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    for name in sorted(earlier):  # set aside first: the new files then never meet the old ones
        if (out / name).is_file():
            (old / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(out / name, old / name)
    for name in written:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(new / name, out / name)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(new, ignore_errors=True)
    for folder in sorted({(out / name).parent for name in earlier}, key=lambda p: -len(p.parts)):
        if folder != out and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()  # an earlier export's subfolder this one does not write
