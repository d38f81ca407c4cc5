"""predict's throughput against the run's own dev evaluation, on the same model, file and devices.

  python -m benchmarks.predict_speed --workdir=runs/demo          # its dev file
  python -m benchmarks.predict_speed --workdir=runs/demo --input=FILE --repeats=5

Timed, interleaved, after one warm-up call of each (compilation excluded from both):
  - dev evaluation: `Evaluator.evaluate` on the dev split already read and encoded, what the run's
    final scoring does (evaluation.py);
  - predict: `inference.read_input` + `Predictor.predict` (read, tokenize, evaluate, build the records),
    what `python -m stackft_jax.predict` does between loading the model and writing the file.
Target: predict within 10% of the dev evaluation's examples/s. Writes JSON (--out).
"""

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.machine import load_average, machine_info, write_json
from stackft_jax.data import task_spec
from stackft_jax.trained import inference, opening


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a finished run")
    parser.add_argument("--input", default=None, help="the file to predict; default the run's data.dev_file")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/out/predict_speed.json")
    args = parser.parse_args(argv)

    source = opening.open_workdir(args.workdir)
    path = Path(args.input or source.run_spec.data.dev_file)
    predictor = inference.Predictor(source)
    run_spec = source.run_spec
    examples = inference.read_input(source.task, path)
    split = task_spec.Split(
        "dev",
        examples,
        task_spec.encode_examples(
            source.task,
            predictor.tokenizer,
            examples,
            max_seq_length=run_spec.max_seq_length,
            options=source.task.encoding_options(run_spec.data.as_mapping()),
        ),
        source.task.is_labelled(examples),
    )

    def evaluate() -> None:
        predictor.evaluator.evaluate(predictor.params, split, progress=False)

    def predict_file() -> None:
        predictor.predict(inference.read_input(source.task, path), progress=False)

    evaluate(), predict_file()  # compiles every bucket the file needs
    evaluate_s, predict_s = [], []
    for _ in range(args.repeats):  # interleaved: a busy machine slows both alike
        for fn, times in ((evaluate, evaluate_s), (predict_file, predict_s)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    n = len(examples)
    rows = {
        "dev evaluation (run's evaluator, encoded split)": statistics.median(evaluate_s),
        "predict (read + tokenize + evaluate + records)": statistics.median(predict_s),
    }
    ratio = (
        rows["predict (read + tokenize + evaluate + records)"]
        / rows["dev evaluation (run's evaluator, encoded split)"]
    )
    print(f"{n} examples of {path}; {source.path}, global batch {predictor.global_batch_size}")
    print("| what | median time | examples/s |\n| --- | --- | --- |")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.3f} s | {n / seconds:,.1f} |")
    print(f"predict takes {ratio:.2f}x the evaluation's time (target <= 1.10); load average {load_average()}")
    payload = {
        "machine": machine_info(),
        "workdir": str(source.path),
        "input": str(path),
        "examples": n,
        "global_batch_size": predictor.global_batch_size,
        "repeats": args.repeats,
        "seconds": {"dev_evaluation": evaluate_s, "predict": predict_s},
        "predict_over_evaluation": ratio,
        "load_average": load_average(),
    }
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()
