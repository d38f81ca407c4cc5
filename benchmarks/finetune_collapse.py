"""Why finetune-only pair heads predicted the majority class, and what moves them (docs/finetune_collapse.md).

  python -m benchmarks.finetune_collapse                    # every case below (about 25 CPU-minutes)
  python -m benchmarks.finetune_collapse --cases bimpm_uniform,bimpm_new_head
  python -m benchmarks.finetune_collapse --quick            # configs/tiny.py, 4 steps (the smoke test)

Each case is a real `train.run` of finetune-only at the CPU budget of
`configs/experiments/paper_qqp.py:short` (60 steps of 16 QQP pairs, embedded MiniLM, seed 0) with one
setting changed, logging every step: loss, gradient and update norms of the backbone and of the head
(the train step's `grad_norm/<part>`, `update_norm/<part>`, read back from TensorBoard), dev accuracy
and F1 every `--eval-every` steps, and the class balance of the final dev predictions. Runs are kept in
`--runs`/<case> and reused when finished. Writes a table, `--out` (JSON), and figures into `--figures`.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.machine import finish, machine_info
from configs.experiments import paper_qqp
from stackft_jax.config import config_cli
from stackft_jax.training import prediction_files, train
from stackft_jax.training.run_report import train_scalars

# case -> the keys it changes from the grid's finetune-only run (the head at BERT's rate, 5e-5, is
# `finetune_only_uniform`; the library default gives a new head `phase2.new_head_learning_rate`).
CASES = {
    "bimpm_uniform": ["strategy=finetune_only_uniform", "head.name=bimpm"],
    "bimpm_head_2e-4": ["strategy=finetune_only", "head.name=bimpm", "phase2.new_head_learning_rate=2e-4"],
    "bimpm_new_head": ["strategy=finetune_only", "head.name=bimpm"],
    "bimpm_uniform_no_warmup": ["strategy=finetune_only_uniform", "head.name=bimpm", "phase2.warmup_ratio=0"],
    "bimpm_uniform_4x_budget": ["strategy=finetune_only_uniform", "head.name=bimpm", "phase2.num_steps=240"],
    "sim_transformer_uniform": ["strategy=finetune_only_uniform", "head.name=sim_transformer"],
    "sim_transformer_new_head": ["strategy=finetune_only", "head.name=sim_transformer"],
    "cls_mlp_uniform": ["strategy=finetune_only_uniform", "head.name=cls_mlp"],
}
QUICK_CASES = {  # BERT's rate below the tiny config's, so that the two head rates differ
    "tiny_uniform": ["strategy=finetune_only_uniform", "phase2.backbone_learning_rate=1e-5"],
    "tiny_new_head": ["strategy=finetune_only", "phase2.backbone_learning_rate=1e-5"],
}


def case_config(name: str, args: argparse.Namespace):
    if args.quick:
        base, settings = "configs/tiny.py", [*QUICK_CASES[name], "phase2.num_steps=4"]
    else:
        base, settings = paper_qqp.get_config("small").base, CASES[name]
    return config_cli.load(
        base, [*settings, "seed=0", "log_every_steps=1", f"eval_every_steps={args.eval_every}"]
    )


def measure(name: str, args: argparse.Namespace) -> dict:
    workdir = Path(args.runs) / name
    config = case_config(name, args)
    results = train.run(config, workdir) if not (workdir / "results.json").exists() else None
    results = results or json.loads((workdir / "results.json").read_text())
    records = prediction_files.read(prediction_files.path(workdir, "dev")).values()
    predicted = np.array([r["prediction"] for r in records])
    dev_curve = [
        (r["global_step"], r["accuracy"], r["f1"])
        for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
        if r["split"] == "dev"
    ]
    scalars = train_scalars(workdir)
    return {
        "settings": CASES.get(name) or QUICK_CASES[name],
        "head_learning_rate": results["phases"][-1]["learning_rates"]["head"],
        "dev_accuracy": results["final"]["dev"]["accuracy"],
        "dev_f1": results["final"]["dev"]["f1"],
        "dev_predicted_positive": float(np.mean(predicted == 1)),
        "dev_curve": dev_curve,
        "train": {key: scalars[key] for key in scalars if key != "examples_per_s"},
    }


def _first(series: list, steps: int) -> float:
    return float(np.mean([value for _, value in series[:steps]])) if series else float("nan")


def write_figures(measured: dict[str, dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, m in measured.items():
        steps, loss = zip(*m["train"]["loss"], strict=True)
        window = min(5, len(loss))
        axes[0].plot(
            steps[window - 1 :], np.convolve(loss, np.ones(window) / window, mode="valid"), label=name
        )
        if m["train"].get("update_norm/head"):
            s, u = zip(*m["train"]["update_norm/head"], strict=True)
            axes[1].semilogy(s, u, label=name)
        s, acc, _ = zip(*m["dev_curve"], strict=True)
        axes[2].plot(s, acc, marker="o", label=name)
    axes[0].set(title="train loss (5-step mean)", xlabel="step")
    axes[1].set(title="head update norm per step", xlabel="step")
    axes[2].set(title="dev accuracy", xlabel="step")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    written.append(out / "finetune_collapse_curves.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--quick", action="store_true", help="configs/tiny.py, 4 steps per case")
    parser.add_argument("--eval-every", type=int, default=20, help="dev evaluation every this many steps")
    parser.add_argument("--runs", default="benchmarks/out/finetune_collapse", help="the cases' workdirs")
    parser.add_argument("--out", default="benchmarks/out/finetune_collapse.json", help="the JSON written")
    parser.add_argument("--figures", default="", help="folder for the figures ('' : none)")
    args = parser.parse_args(argv)
    available = QUICK_CASES if args.quick else CASES
    names = [n for n in args.cases.split(",") if n] or list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(available)}")
    info = machine_info()
    measured = {name: measure(name, args) for name in names}
    columns = [
        "case",
        "head lr",
        "dev acc",
        "dev F1",
        "predicted 1",
        "|g| head",
        "|g| BERT",
        "|du| head",
        "|du| BERT",
    ]
    rows = []
    for name, m in measured.items():
        t = m["train"]
        rows.append(
            [
                name,
                f"{m['head_learning_rate']:.0e}",
                f"{m['dev_accuracy']:.4f}",
                f"{m['dev_f1']:.4f}",
                f"{m['dev_predicted_positive']:.3f}",
            ]
            + [
                f"{_first(t.get(k, []), 10):.3g}"
                for k in ("grad_norm/head", "grad_norm/backbone", "update_norm/head", "update_norm/backbone")
            ]
        )
    table = "\n".join(
        ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
        + ["| " + " | ".join(r) + " |" for r in rows]
    )
    table += "\n\nNorms: means over the first 10 steps (|g| gradient, |du| the step's parameter change)."
    figures = write_figures(measured, Path(args.figures)) if args.figures else []
    return finish("finetune_collapse", args, info, measured, table, figures=[str(f) for f in figures])


if __name__ == "__main__":
    main()
