"""predict: a trained run's predictions on new inputs, the same as the run's own prediction files."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackft_jax.data import conll, glue, tasks, yahoo
from stackft_jax.data.samples import sample_path
from stackft_jax.runtime.cli_errors import UsageError
from stackft_jax.trained import inference, opening

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def _predict_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "stackft_jax.predict", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "locks" not in p.parts
    }


@pytest.fixture(scope="module")
def conll_run(tmp_path_factory, run_cli) -> Path:
    workdir = tmp_path_factory.mktemp("conll_run")
    proc = run_cli(workdir, config="configs/tiny.py:conll")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return workdir


@pytest.mark.slow
def test_predict_on_the_dev_file_reproduces_the_runs_predictions_byte_for_byte(uninterrupted, tmp_path):
    before = _snapshot(uninterrupted)
    out, scores = tmp_path / "dev.jsonl", tmp_path / "scores.json"
    proc = _predict_cli(
        f"--workdir={uninterrupted}",
        f"--input={FIXTURES / 'qqp' / 'dev.tsv'}",
        f"--output={out}",
        f"--scores={scores}",
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (uninterrupted / "predictions" / "dev.jsonl").read_bytes()
    run_scores = json.loads((uninterrupted / "results.json").read_text())["final"]["dev"]
    predicted = json.loads(scores.read_text())
    assert predicted["accuracy"] == run_scores["accuracy"] and predicted["f1"] == run_scores["f1"]
    assert "accuracy=" in proc.stderr
    assert _snapshot(uninterrupted) == before  # the workdir is read, never written
    # A healthy run restores without warnings (orbax's "Metadata file does not exist" for an item).
    assert not [line for line in proc.stderr.splitlines() if " WARNING " in line or "Metadata" in line]


@pytest.mark.slow
def test_line_inputs_give_label_names_and_refuse_to_overwrite(uninterrupted, tmp_path):
    lines = tmp_path / "pairs.jsonl"
    lines.write_text(
        json.dumps({"text_a": "How do I learn Python?", "text_b": "What is the best way to learn Python?"})
        + "\n\n"
        + "Is the sky blue?\tWhy is the sky blue?\n"
    )
    out = tmp_path / "out.jsonl"
    assert _predict_cli(f"--workdir={uninterrupted}", f"--input={lines}", f"--output={out}").returncode == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and [r["key"].split("-")[0] for r in records] == ["line1", "line3"]
    assert all(r["prediction_name"] == ["not_duplicate", "duplicate"][r["prediction"]] for r in records)
    assert all("label" not in r for r in records)
    again = _predict_cli(f"--workdir={uninterrupted}", f"--input={lines}", f"--output={out}")
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"error: --output={out} exists and is not empty: pass --overwrite to replace it"
    ]
    folder = tmp_path / "predictions"
    folder.mkdir()
    into_folder = _predict_cli(f"--workdir={uninterrupted}", f"--input={lines}", f"--output={folder}")
    assert into_folder.returncode == 2 and into_folder.stderr.strip().splitlines() == [
        f"error: --output={folder} is a folder: name a file"
    ]


@pytest.mark.slow
def test_stdin_is_answered_line_by_line(uninterrupted):
    cmd = [
        sys.executable,
        "-m",
        "stackft_jax.predict",
        f"--workdir={uninterrupted}",
        "--input=-",
        "--output=-",
    ]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        input="a question\tanother question\nno tab here\nx\ty\n",
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr  # a line was refused: the status says so
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["key"].split("-")[0] for r in records] == ["line1", "line3"]
    assert "<stdin>:2: task 'qqp' takes a text pair" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: 1 input line(s) refused (above); the others were answered"
    )


def test_params_and_phases(uninterrupted):
    last = opening.open_workdir(uninterrupted)
    assert (last.params, last.phase) == ("last", None)
    head_only = inference.Predictor(opening.open_workdir(uninterrupted, phase="phase1"))
    best = inference.Predictor(opening.open_workdir(uninterrupted, params="best"))
    assert head_only.loaded.which == "phase1 (end)" and best.loaded.which.startswith("best (global step ")
    examples = inference.read_input(last.task, FIXTURES / "qqp" / "dev.tsv")
    a, b = head_only.predict(examples).records, best.predict(examples).records
    assert [r["key"] for r in a] == [r["key"] for r in b] == [e.key for e in examples]
    # phase1 trains the head only: the backbone is the initial one, the head phase 1's.
    import numpy as np

    initial = head_only.loaded.params["backbone"]["embeddings"]["word_embeddings"]["embedding"]
    final = inference.Predictor(last).loaded.params["backbone"]["embeddings"]["word_embeddings"]["embedding"]
    assert not np.array_equal(np.asarray(initial), np.asarray(final))


def test_unfinished_run_needs_a_phase(uninterrupted, tmp_path):
    copy = tmp_path / "unfinished"
    shutil.copytree(uninterrupted, copy)
    (copy / "results.json").unlink()
    shutil.rmtree(copy / "checkpoints" / "phase2_end")
    with pytest.raises(
        ValueError, match=r"has not finished \(no results.json\).*--phase \(finished: phase1\)"
    ):
        opening.open_workdir(copy)
    with pytest.raises(ValueError, match="has not finished phase2 yet"):
        opening.open_workdir(copy, phase="phase2")
    assert opening.open_workdir(copy, phase="phase1").phase == "phase1"
    with pytest.raises(ValueError, match=r"the run's phases are \['phase1', 'phase2'\]"):
        opening.open_workdir(copy, phase="phase3")
    with pytest.raises(FileNotFoundError, match="not a run's workdir"):
        opening.open_workdir(tmp_path)


@pytest.mark.slow
def test_conll_raw_sentences_get_one_tag_per_word(conll_run, tmp_path):
    dev = sample_path("conll_dev.txt")
    out = tmp_path / "dev.jsonl"
    assert _predict_cli(f"--workdir={conll_run}", f"--input={dev}", f"--output={out}").returncode == 0
    assert out.read_bytes() == (conll_run / "predictions" / "dev.jsonl").read_bytes()
    raw = tmp_path / "raw.txt"
    sentences = ["EU rejects German call to boycott British lamb .", "Peter Blackburn", "BRUSSELS 1996-08-22"]
    raw.write_text("\n".join(sentences) + "\n")
    out = tmp_path / "raw.jsonl"
    proc = _predict_cli(f"--workdir={conll_run}", f"--input={raw}", f"--output={out}")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["prediction"]) for r in records] == [len(s.split()) for s in sentences]
    assert all(tag in conll.TAGS for r in records for tag in r["prediction"]) and "label" not in records[0]


@pytest.mark.slow
def test_iob2_decoding_predicts_well_formed_sequences_from_the_same_parameters(
    run_cli, conll_run, uninterrupted, tmp_path
):
    """--decode=iob2 on a softmax tagger (a tiny token_mlp run): every predicted sentence is well-formed
    IOB2, so conlleval's and strict entity F1 agree on it; a CRF head, or a head that tags no words,
    refuses in one line."""
    with pytest.raises(UsageError, match="decodes a softmax word tagger .*head is cls_mlp$"):
        opening.with_iob2_decoding(opening.open_workdir(uninterrupted))
    workdir = tmp_path / "token_mlp"
    proc = run_cli(workdir, config="configs/tiny.py:conll,head=token_mlp")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    scores, out = tmp_path / "scores.json", tmp_path / "dev.jsonl"
    dev = sample_path("conll_dev.txt")
    proc = _predict_cli(
        f"--workdir={workdir}", f"--input={dev}", f"--output={out}", f"--scores={scores}", "--decode=iob2"
    )
    assert proc.returncode == 0, proc.stderr
    for record in (json.loads(line) for line in out.read_text().splitlines()):
        tags = record["prediction"]
        for previous, current in zip(["O", *tags], tags, strict=False):
            assert not current.startswith("I-") or previous[2:] == current[2:], tags
    scored = json.loads(scores.read_text())
    assert scored["f1"] == scored["strict_f1"]
    refused = _predict_cli(f"--workdir={conll_run}", f"--input={dev}", "--output=-", "--decode=iob2")
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1
    assert "head is bilstm_crf, whose CRF decodes under IOB2 constraints already" in refused.stderr


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_refusals_name_the_file_and_line(tmp_path):
    qqp, sst2, conll_task = tasks.TASKS["qqp"], tasks.TASKS["sst2"], tasks.TASKS["conll2003"]
    with pytest.raises(ValueError, match=r"empty.tsv:1: the file is empty"):
        inference.read_input(qqp, _write(tmp_path / "empty.tsv", ""))
    with pytest.raises(ValueError, match=r"bad.txt:2: not UTF-8 text"):
        inference.read_input(qqp, _write(tmp_path / "bad.txt", b"a\tb\n\xff\tb\n"))
    with pytest.raises(ValueError, match=r"a conll2003 file \(CoNLL\), but the model was trained on qqp"):
        inference.read_input(qqp, sample_path("conll_dev.txt"))
    with pytest.raises(ValueError, match=r"a qqp file .*trained on sst2"):
        inference.read_input(sst2, FIXTURES / "qqp" / "dev.tsv")
    with pytest.raises(ValueError, match=r"a yahoo_answers file .*trained on conll2003"):
        inference.read_input(conll_task, sample_path("yahoo_dev.csv"))
    with pytest.raises(ValueError, match=r"c.jsonl:2: label 'maybe' is not a class the model knows"):
        inference.read_input(
            qqp,
            _write(
                tmp_path / "c.jsonl",
                '{"text_a":"a","text_b":"b","label":1}\n{"text_a":"a","text_b":"b","label":"maybe"}\n',
            ),
        )
    with pytest.raises(ValueError, match=r"t.jsonl:1: unknown tag 'B-DATE'"):
        inference.read_input(
            conll_task, _write(tmp_path / "t.jsonl", '{"words": ["May", "5"], "tags": ["B-DATE", "O"]}\n')
        )
    with pytest.raises(ValueError, match=r"1 of 2 examples have labels"):
        inference.read_input(
            qqp, _write(tmp_path / "mixed.jsonl", '{"text_a":"a","text_b":"b","label":1}\na\tb\n')
        )
    topics = yahoo.YAHOO_ANSWERS.configure(
        {"classes": "health+sports", "dev_fraction": 0.1, "truncation": "head"}
    )
    with pytest.raises(ValueError, match=r"yahoo_dev.csv:\d+: topic '\w+' is not a class the model knows"):
        inference.read_input(topics, sample_path("yahoo_dev.csv"))


@pytest.mark.slow
def test_cli_refusal_is_one_line_before_any_compute(uninterrupted, tmp_path):
    proc = _predict_cli(f"--workdir={uninterrupted}", f"--input={sample_path('conll_dev.txt')}", "--output=-")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: ") and "trained on qqp" in proc.stderr


def test_every_task_reads_its_line_forms():
    sst2, stsb = glue.SST2, glue.STSB
    topics = yahoo.YAHOO_ANSWERS.configure({"classes": "all", "dev_fraction": 0.1, "truncation": "head"})
    assert sst2.example_from_line("a fine film\n", index=0, where="f:3").text_a == "a fine film"
    assert sst2.example_from_line('{"text_a": "bad", "label": "negative"}', index=0, where="f:1").label == 0
    with pytest.raises(ValueError, match="f:1: task 'sst2' takes JSON objects .* and no 'text_b'"):
        sst2.example_from_line('{"text_a": "a", "text_b": "b"}', index=0, where="f:1")
    assert (
        stsb.example_from_line('{"text_a": "a", "text_b": "b", "label": 3.5}', index=0, where="f:1").label
        == 3.5
    )
    assert (
        topics.example_from_line("Who won the cup? \\n Spain.", index=0, where="f:1").text_a
        == "Who won the cup? \n Spain."
    )
    assert topics.example_from_line('{"text_a": "x", "label": "sports"}', index=0, where="f:1").label == 5
    sentence = conll.CONLL2003.example_from_line("Peter lives in Paris\n", index=4, where="f:5")
    assert (
        sentence.words == ("Peter", "lives", "in", "Paris") and sentence.tags is None and sentence.index == 4
    )
    tagged = conll.CONLL2003.example_from_line(
        '{"words": ["Peter"], "tags": ["I-PER"]}', index=0, where="f:1"
    )
    assert tagged.tags == ("B-PER",)  # IOB1 read as IOB2, as in files


@pytest.mark.slow
def test_a_labelled_file_scores_as_the_runs_test_file_does(run_cli, tmp_path):
    """predict on a labelled file equals what `data.test_file` scored in the run: records and scores."""
    held_out = tmp_path / "held_out.tsv"
    lines = (FIXTURES / "qqp" / "train.tsv").read_text().splitlines()
    held_out.write_text("\n".join([lines[0], *lines[-12:]]) + "\n")  # header + 12 labelled pairs
    workdir = tmp_path / "run"
    proc = run_cli(workdir, f"--config.data.test_file={held_out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out, scores = tmp_path / "test.jsonl", tmp_path / "scores.json"
    proc = _predict_cli(
        f"--workdir={workdir}", f"--input={held_out}", f"--output={out}", f"--scores={scores}"
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (workdir / "predictions" / "test.jsonl").read_bytes()
    run_scores = json.loads((workdir / "results.json").read_text())["final"]["test"]
    predicted = json.loads(scores.read_text())
    assert predicted["accuracy"] == run_scores["accuracy"] and predicted["f1"] == run_scores["f1"]


@pytest.mark.slow
def test_predict_never_writes_over_a_run_or_its_own_input(uninterrupted, tmp_path):
    before = _snapshot(uninterrupted)
    dev = uninterrupted / "predictions" / "dev.jsonl"
    into_run = _predict_cli(
        f"--workdir={uninterrupted}",
        f"--input={FIXTURES / 'qqp' / 'dev.tsv'}",
        f"--output={dev}",
        "--overwrite",
    )
    assert into_run.returncode == 2 and into_run.stderr.strip().splitlines() == [
        f"error: --output={dev} is inside the workdir of the run {uninterrupted.resolve()}; a command never "
        "writes into a run's folder (even with --overwrite): choose a path outside it"
    ]
    pairs = _write(tmp_path / "pairs.tsv", "Is the sky blue?\tWhy is the sky blue?\n")
    itself = _predict_cli(
        f"--workdir={uninterrupted}", f"--input={pairs}", f"--output={pairs}", "--overwrite"
    )
    assert itself.returncode == 2 and itself.stderr.strip().splitlines() == [
        f"error: --input and --output name one file ({pairs}): name another file for --output"
    ]
    out = tmp_path / "out.jsonl"
    both = _predict_cli(
        f"--workdir={uninterrupted}", f"--input={pairs}", f"--output={out}", f"--scores={out}"
    )
    assert both.returncode == 2 and both.stderr.strip().splitlines() == [
        f"error: --output and --scores name one file ({out}): name another file for --scores"
    ]
    assert pairs.read_text() == "Is the sky blue?\tWhy is the sky blue?\n" and not out.exists()
    assert _snapshot(uninterrupted) == before
