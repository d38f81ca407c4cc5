"""A trained run as a folder that outside tools load:

    python -m stackft_jax.export --workdir=runs/demo --out=exports/demo

    config.json, model.safetensors   the fine-tuned encoder, transformers' names: AutoModel.from_pretrained
    tokenizer files                  the run's (vocab.txt, tokenizer.json, ...): AutoTokenizer.from_pretrained
    head.safetensors                 the head's parameters, named by their `head/...` paths
    head_config.json                 task, label names, tag scheme, strategy, phases, final metrics, and the
                                     run's config (what `predict --model` and stackft_jax rebuild it from)
    transformers_task_model/         where the head is exactly a transformers class (a [CLS] tanh MLP as wide
                                     as the encoder: BertForSequenceClassification's pooler + classifier;
                                     a linear word tagger: *ForTokenClassification), that model whole
    README.md                        the model card
    export_manifest.json             every file the export wrote: what a later --overwrite replaces

The encoder also starts new runs: `--config.model.name_or_path=exports/demo`. The folder is written by
process 0 only, into a temporary sibling renamed into place, so it is complete or absent; a non-empty
target is replaced only with --overwrite, and then only the files its manifest lists: whatever was added
to the folder since (notes, a copied workdir) stays. The run's tokenizer files must still be those it
recorded (data_files.json), as for a rerun of the run; head_config.json records the export's own, which
`predict --model` checks.
"""

import json
from pathlib import Path

from absl import app, flags

from stackft_jax.runtime import cli_errors
from stackft_jax.runtime.cli_errors import UsageError
from stackft_jax.trained import hf_export, opening

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "The run's workdir.")
flags.DEFINE_string("out", None, "The export folder to write.")
flags.DEFINE_enum(
    "params", None, ["best", "last"], "Which parameters of a finished run (default: what it scored)."
)
flags.DEFINE_string("phase", None, "Export the end of this finished phase instead.")
flags.DEFINE_bool("overwrite", False, "Replace a non-empty --out.")


@cli_errors.guarded
def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS.workdir or not FLAGS.out:
        raise UsageError("--workdir and --out are required")
    from stackft_jax.runtime import logs  # after the flags: a mistake answers at once

    logs.setup()
    source = opening.open_workdir(FLAGS.workdir, params=FLAGS.params, phase=FLAGS.phase)
    written = hf_export.export(source, Path(FLAGS.out), overwrite=FLAGS.overwrite)
    if written is not None:
        record = json.loads((written / opening.HEAD_CONFIG).read_text())
        print(
            f"{written}: encoder (config.json, model.safetensors, tokenizer), head ({record['params']}), "
            f"transformers task model: {record['transformers_task_model'] or 'none'}"
        )


if __name__ == "__main__":
    app.run(main, flags_parser=cli_errors.parse_flags)
