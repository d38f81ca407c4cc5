"""Fixed-shape batching on a synthetic dataset whose rows identify themselves; the batching config
(config.batching): its checks, how older records read it, its binding."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from configs import tiny
from stackft_jax.config import config_cli, spec
from stackft_jax.data import batching
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import compute, workdirs

REPO = Path(__file__).resolve().parent.parent

KEYS = {"input_ids", "token_type_ids", "segment_ids", "attention_mask", "labels", "example_mask"}
BUCKETS = (32, 64, 128)


def make_dataset(n: int, max_seq_length: int = 128, seed: int = 0) -> batching.Dataset:
    """Row i is filled with token i + 1 up to its length, so a batch row names its example."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, max_seq_length + 1, size=n).astype(np.int32)
    lengths[: n // 2] = rng.integers(3, 20, size=n // 2)  # many short rows, as in real data
    positions = np.arange(max_seq_length)[None, :]
    real = positions < lengths[:, None]
    input_ids = np.where(real, np.arange(1, n + 1)[:, None], 0).astype(np.int32)
    token_type_ids = (real & (positions >= lengths[:, None] // 2)).astype(np.int32)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "segment_ids": (token_type_ids + 1) * real,
        "lengths": lengths,
        "labels": np.arange(n, dtype=np.int32),
    }


def check_batch(batch: dict, ds: batching.Dataset, batch_size: int) -> np.ndarray:
    """Checks shapes and internal consistency; returns the example index of each row."""
    assert set(batch) - {"index"} == KEYS | set(ds) - {"lengths"}
    seq_len = batch["input_ids"].shape[1]
    assert seq_len in BUCKETS
    for key in ("input_ids", "token_type_ids", "segment_ids", "attention_mask"):
        assert batch[key].shape == (batch_size, seq_len) and batch[key].dtype == np.int32
    assert batch["example_mask"].dtype == np.float32 and batch["example_mask"].shape == (batch_size,)
    rows = batch["labels"]
    lengths = ds["lengths"][rows]
    assert (batch["attention_mask"].sum(axis=1) == lengths).all()
    # The smallest bucket that fits the longest row.
    assert seq_len == min(b for b in BUCKETS if b >= lengths.max())
    np.testing.assert_array_equal(batch["input_ids"], ds["input_ids"][rows, :seq_len])
    np.testing.assert_array_equal(batch["token_type_ids"], ds["token_type_ids"][rows, :seq_len])
    np.testing.assert_array_equal(batch["segment_ids"], ds["segment_ids"][rows, :seq_len])
    return rows


@pytest.mark.parametrize(
    "max_seq_length, min_bucket, expected",
    [
        (128, 32, (32, 64, 128)),
        (100, 32, (32, 64, 100)),
        (512, 32, (32, 64, 128, 256, 512)),
        (32, 32, (32,)),
        (16, 32, (16,)),
        (64, 16, (16, 32, 64)),
    ],
)
def test_length_buckets(max_seq_length, min_bucket, expected):
    assert batching.length_buckets(max_seq_length, min_bucket) == expected


def test_steps_per_epoch_drops_remainder_and_rejects_tiny_sets():
    assert batching.steps_per_epoch(50, 8) == 6
    assert batching.steps_per_epoch(8, 8) == 1
    with pytest.raises(ValueError, match=r"7 examples.*batch of 8"):
        batching.steps_per_epoch(7, 8)


def test_train_batch_is_a_pure_function_of_seed_and_step():
    ds = make_dataset(48)
    kwargs = dict(global_batch_size=8, seed=3, buckets=BUCKETS)
    a = batching.train_batch(ds, step=4, **kwargs)
    b = batching.train_batch(ds, step=4, **kwargs)
    assert set(a) == KEYS
    for key in KEYS:
        np.testing.assert_array_equal(a[key], b[key])
    check_batch(a, ds, 8)
    assert (a["example_mask"] == 1).all()
    other_seed = batching.train_batch(ds, step=4, global_batch_size=8, seed=4, buckets=BUCKETS)
    assert not np.array_equal(a["labels"], other_seed["labels"])


def test_every_example_once_per_epoch_and_epochs_differ():
    ds = make_dataset(48)
    kwargs = dict(global_batch_size=8, seed=0, buckets=BUCKETS)
    epochs = [
        np.concatenate([check_batch(batching.train_batch(ds, step=s, **kwargs), ds, 8) for s in steps])
        for steps in (range(0, 6), range(6, 12))
    ]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(48))
    assert not np.array_equal(epochs[0], epochs[1])


def test_remainder_is_dropped_without_repeats():
    ds = make_dataset(50)
    rows = np.concatenate(
        [
            batching.train_batch(ds, step=s, global_batch_size=8, seed=1, buckets=BUCKETS)["labels"]
            for s in range(6)
        ]
    )
    assert len(set(rows.tolist())) == 48


def test_train_batches_resumes_bit_exactly_across_epochs():
    ds = make_dataset(50)
    kwargs = dict(global_batch_size=8, seed=5, buckets=BUCKETS)
    stream = batching.train_batches(ds, start_step=4, **kwargs)
    for step in range(4, 16):  # crosses the epoch boundaries at steps 6 and 12
        expected = batching.train_batch(ds, step=step, **kwargs)
        got = next(stream)
        for key in KEYS:
            np.testing.assert_array_equal(got[key], expected[key])


def test_eval_covers_every_example_once_with_a_padded_last_batch():
    ds = make_dataset(50)
    batches = list(batching.eval_batches(ds, global_batch_size=8, buckets=BUCKETS))
    assert len(batches) == 7
    for batch in batches:
        assert set(batch) == KEYS | {"index"} and batch["index"].dtype == np.int32
        rows = check_batch(batch, ds, 8)
        real = batch["index"] >= 0
        np.testing.assert_array_equal(batch["example_mask"], real.astype(np.float32))
        np.testing.assert_array_equal(rows[real], batch["index"][real])
    index = np.concatenate([b["index"] for b in batches])
    assert sorted(index[index >= 0].tolist()) == list(range(50))
    last = batches[-1]
    assert last["example_mask"].tolist() == [1, 1] + [0] * 6
    assert last["index"][2:].tolist() == [-1] * 6


def test_eval_limit_takes_the_first_examples():
    ds = make_dataset(50)
    batches = list(batching.eval_batches(ds, global_batch_size=4, buckets=BUCKETS, limit=10))
    assert len(batches) == 3
    index = np.concatenate([b["index"] for b in batches])
    assert sorted(index[index >= 0].tolist()) == list(range(10))
    assert sum(b["example_mask"].sum() for b in batches) == 10


def test_batch_shapes_are_bounded_by_the_buckets():
    ds = make_dataset(300, seed=2)
    shapes = set()
    for _, batch in zip(
        range(100),
        batching.train_batches(ds, start_step=0, global_batch_size=4, seed=0, buckets=BUCKETS),
        strict=False,
    ):
        shapes.add(batch["input_ids"].shape)
    for batch in batching.eval_batches(ds, global_batch_size=4, buckets=BUCKETS):
        shapes.add(batch["input_ids"].shape)
    assert shapes <= {(4, b) for b in BUCKETS}
    assert len(shapes) > 1  # short rows really do get a smaller bucket


def test_process_slice_partitions_the_global_batch():
    ds = make_dataset(48)
    batch = next(batching.eval_batches(ds, global_batch_size=8, buckets=BUCKETS))
    slices = [batching.process_slice(batch, i, 4) for i in range(4)]
    for key in batch:
        assert all(s[key].shape[0] == 2 for s in slices)
        np.testing.assert_array_equal(np.concatenate([s[key] for s in slices]), batch[key])
    with pytest.raises(ValueError, match="does not split evenly"):
        batching.process_slice(batch, 0, 3)


def test_word_arrays_are_sliced_by_row_and_kept_whole():
    """A tagging task's per-word arrays ride along: rows like every array, full `max_words` width
    whatever the length bucket; `lengths` becomes `attention_mask`."""
    ds = make_dataset(20)
    max_words = 126
    ds["word_starts"] = np.arange(20 * max_words, dtype=np.int32).reshape(20, max_words)
    ds["num_words"] = np.arange(20, dtype=np.int32)
    for batch in batching.eval_batches(ds, global_batch_size=8, buckets=BUCKETS):
        rows = check_batch(batch, ds, 8)
        assert "lengths" not in batch
        np.testing.assert_array_equal(batch["word_starts"], ds["word_starts"][rows])
        np.testing.assert_array_equal(batch["num_words"], rows)


# Training batch schemes (config.batching): random and length_grouped.

FINE = batching.train_buckets(128, 16)  # (16, 32, ..., 128)
GROUPED = dict(buckets=FINE, scheme=batching.LENGTH_GROUPED, group_batches=4)


@pytest.mark.parametrize(
    "max_seq_length, bucket_tokens, expected",
    [
        (128, 16, (16, 32, 48, 64, 80, 96, 112, 128)),
        (100, 16, (16, 32, 48, 64, 80, 96, 100)),
        (48, 16, (16, 32, 48)),
        (48, 48, (48,)),
        (128, 0, (32, 64, 128)),  # the doubling buckets evaluation uses (and older runs trained in)
    ],
)
def test_train_buckets_every_width_up_to_max_seq_length(max_seq_length, bucket_tokens, expected):
    assert batching.train_buckets(max_seq_length, bucket_tokens) == expected
    order = batching.TrainOrder.of(
        batching.LENGTH_GROUPED, max_seq_length=max_seq_length, bucket_tokens=bucket_tokens, group_batches=50
    )
    # The bound the docs state: at most ceil(max_seq_length / bucket_tokens) train-step compilations.
    assert order.max_compilations == len(expected)
    if bucket_tokens:
        assert order.max_compilations == -(-max_seq_length // bucket_tokens)


def test_the_random_scheme_cuts_each_epochs_permutation_in_order():
    """What runs recorded before config.batching trained on: a committed run replays these rows."""
    ds = make_dataset(50)
    for step in (0, 5, 6, 13):  # 6 steps per epoch
        epoch, i = divmod(step, 6)
        expected = np.random.default_rng([7, epoch]).permutation(50)[i * 8 : (i + 1) * 8]
        batch = batching.train_batch(ds, step=step, global_batch_size=8, seed=7, buckets=BUCKETS)
        np.testing.assert_array_equal(batch["labels"], expected)
        explicit = batching.train_batch(
            ds, step=step, global_batch_size=8, seed=7, buckets=BUCKETS, scheme=batching.RANDOM
        )
        np.testing.assert_array_equal(explicit["input_ids"], batch["input_ids"])


def _grouped_epoch(ds, seed: int, epoch: int, per_epoch: int, batch_size: int) -> list[np.ndarray]:
    return [
        batching.train_batch(
            ds, step=epoch * per_epoch + s, global_batch_size=batch_size, seed=seed, **GROUPED
        )["labels"]
        for s in range(per_epoch)
    ]


def test_length_grouped_sees_the_random_schemes_rows_each_epoch_in_batches_of_similar_length():
    ds = make_dataset(420, seed=1)
    per_epoch = batching.steps_per_epoch(420, 8)  # 52 batches, 13 mega-batches of 4
    for epoch in (0, 1):
        grouped = _grouped_epoch(ds, 3, epoch, per_epoch, 8)
        random_rows = np.concatenate(
            [
                batching.train_batch(
                    ds, step=epoch * per_epoch + s, global_batch_size=8, seed=3, buckets=FINE
                )["labels"]
                for s in range(per_epoch)
            ]
        )
        # The same rows each epoch (every row at most once, the same dropped remainder) ...
        assert sorted(np.concatenate(grouped).tolist()) == sorted(random_rows.tolist())
        # ... in batches whose lengths spread less than random batches'.
        spread = np.mean([np.ptp(ds["lengths"][rows]) for rows in grouped])
        random_spread = np.mean([np.ptp(ds["lengths"][rows]) for rows in random_rows.reshape(-1, 8)])
        assert spread < random_spread / 3
        # Batches come in random order, not shortest first.
        longest = [ds["lengths"][rows].max() for rows in grouped]
        assert longest != sorted(longest)
    assert not np.array_equal(np.concatenate(_grouped_epoch(ds, 3, 0, per_epoch, 8)),
                              np.concatenate(_grouped_epoch(ds, 3, 1, per_epoch, 8)))  # fmt: skip


def test_length_grouped_batches_are_a_pure_function_of_seed_and_step_and_resume_exactly():
    ds = make_dataset(100, seed=4)
    kwargs = dict(global_batch_size=8, seed=5, **GROUPED)
    stream = batching.train_batches(ds, start_step=9, **kwargs)
    for step in range(9, 40):  # 12 steps per epoch: crosses three epoch boundaries
        expected = batching.train_batch(ds, step=step, **kwargs)
        got = next(stream)
        assert set(got) == KEYS
        for key in KEYS:
            np.testing.assert_array_equal(got[key], expected[key])
        # Padded to the smallest fine bucket that holds the longest row.
        assert got["input_ids"].shape[1] == min(b for b in FINE if b >= ds["lengths"][got["labels"]].max())
    other = batching.train_batch(ds, step=9, global_batch_size=8, seed=6, **GROUPED)
    assert not np.array_equal(other["labels"], batching.train_batch(ds, step=9, **kwargs)["labels"])


def test_token_counts_are_what_the_batches_hold_and_grouping_cuts_the_padding():
    ds = make_dataset(300, seed=2)
    shares = {}
    for scheme, buckets in ((batching.RANDOM, BUCKETS), (batching.LENGTH_GROUPED, FINE)):
        order = batching.TrainOrder(scheme, buckets, group_batches=5)
        steps = 90  # 37 steps per epoch: three epochs, the last one cut short
        real, padding = batching.token_counts(
            ds["lengths"], steps=steps, global_batch_size=8, seed=1, order=order
        )
        stream = batching.train_batches(
            ds, start_step=0, global_batch_size=8, seed=1, buckets=buckets, scheme=scheme, group_batches=5
        )
        batches = [next(stream) for _ in range(steps)]
        assert real == sum(int(b["attention_mask"].sum()) for b in batches)
        assert real + padding == sum(b["attention_mask"].size for b in batches)
        shares[scheme] = real / (real + padding)
    assert shares[batching.LENGTH_GROUPED] > shares[batching.RANDOM] + 0.2


def test_an_unknown_scheme_is_refused():
    with pytest.raises(
        ValueError, match="unknown batching scheme 'sorted': choose length_grouped or packed or random"
    ):
        batching.train_batch(
            make_dataset(16), step=0, global_batch_size=8, seed=0, buckets=FINE, scheme="sorted"
        )


# The batching config (config.batching).


def test_new_runs_pack_random_batches_and_the_mini_presets_keep_the_committed_ones():
    # Packed, one group of per_device_batch_size examples per device; fine buckets for cached phases.
    assert spec.resolve(tiny.get_config()).train_order == batching.TrainOrder(
        batching.PACKED,
        (16, 32),
        batching.GROUP_BATCHES,
        batching.BATCH_MEAN,
        group_examples=1,
        min_row_share=0.05,
    )
    order = spec.resolve(tiny.get_config("per_device_batch_size=4")).train_order
    assert (order.scheme, order.group_examples) == (batching.PACKED, 4)
    for preset in ("configs/quora.py:mini", "configs/conll03.py:mini", "configs/yahoo.py:mini"):
        order = spec.resolve(config_cli.load(preset, []), recorded=True).train_order
        assert (order.scheme, order.buckets) == (batching.RANDOM, batching.length_buckets(128)), preset
        assert order.loss_weighting == batching.BATCH_MEAN, preset


def test_corpus_mean_divides_by_a_batchs_mean_count_in_the_objectives_unit():
    # Tagging counts words (models/objectives.py), the other objectives rows.
    tagging = {"lengths": np.array([3, 5, 9]), "num_words": np.array([2, 4, 9])}
    classification = {"lengths": np.array([3, 5, 9])}
    corpus = batching.TrainOrder(loss_weighting=batching.CORPUS_MEAN)
    assert corpus.loss_denominator(tagging, 32) == 32 * 5.0
    assert corpus.loss_denominator(classification, 32) == 32.0
    assert batching.TrainOrder(loss_weighting=batching.BATCH_MEAN).loss_denominator(tagging, 32) is None


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            "batching.scheme=sorted",
            "config.batching.scheme='sorted': choose length_grouped or packed or random",
        ),
        (
            "batching.bucket_tokens=48",
            "config.batching.bucket_tokens=48: a bucket width from 8 to max_seq_length (32) tokens, or 0 "
            "for the doubling buckets (32,)",
        ),
        ("batching.bucket_tokens=4", "config.batching.bucket_tokens=4: a bucket width from 8 to"),
        ("batching.group_batches=0", "config.batching.group_batches=0: at least 1"),
        (
            "batching.loss_weighting=token_mean",
            "config.batching.loss_weighting='token_mean': choose corpus_mean or batch_mean",
        ),
    ],
)
def test_bad_batching_keys_are_one_line_naming_the_key_and_the_allowed_values(item, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        spec.resolve(tiny.get_config(item))


def test_a_bad_scheme_on_the_command_line_is_one_line_before_any_work(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stackft_jax.main",
            "--config=configs/tiny.py",
            "--config.batching.scheme=sorted",
            f"--workdir={tmp_path / 'run'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].endswith("config.batching.scheme='sorted': choose length_grouped or packed or random"), (
        lines
    )
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_record_without_the_batching_block_reads_as_the_random_batches_it_ran(tmp_path):
    plain = config_cli.to_plain(tiny.get_config())
    del plain["batching"]
    (tmp_path / "config.json").write_text(json.dumps({"config": plain}))
    for config in (config_cli.load(str(tmp_path / "config.json")), spec.config_from_plain(plain)):
        order = spec.resolve(config, recorded=True).train_order
        assert (order.scheme, order.buckets) == (batching.RANDOM, batching.length_buckets(32))
        assert order.loss_weighting == batching.BATCH_MEAN
    # A record with the block but from before loss_weighting divided each batch by its own count.
    plain = config_cli.to_plain(tiny.get_config())
    del plain["batching"]["loss_weighting"]
    plain["batching"]["scheme"] = batching.LENGTH_GROUPED
    assert spec.resolve(spec.config_from_plain(plain), recorded=True).train_order == batching.TrainOrder(
        batching.LENGTH_GROUPED, (16, 32), batching.GROUP_BATCHES, batching.BATCH_MEAN
    )
    # Every committed run reruns as what it ran: random batches in doubling buckets where it recorded no
    # batching block, else the scheme it recorded.
    committed = sorted((REPO / "docs" / "grids").glob("*/runs/*/config.json"))
    recorded = {path: json.loads(path.read_text())["config"].get("batching") for path in committed[::25]}
    assert None in recorded.values()
    for path, block in recorded.items():
        order = spec.resolve(config_cli.recorded_run_config(path), recorded=True).train_order
        if block is None:
            assert (order.scheme, order.buckets) == (
                batching.RANDOM,
                batching.length_buckets(order.buckets[-1]),
            ), path
        else:
            assert order.scheme == block["scheme"] and order.loss_weighting == block["loss_weighting"], path


def test_resuming_with_another_batching_is_refused_like_any_changed_key(tmp_path):
    def bind(items: str = "") -> None:
        run_spec = spec.resolve(tiny.get_config(items or None))
        workdirs.bind_run(tmp_path, run_spec, global_batch_size=8, allow_change=False)

    bind()
    (tmp_path / "metrics.jsonl").write_text("")  # the run has started (a workdir without progress rebinds)
    bind("log_every_steps=3")  # a neutral key: the same run
    with pytest.raises(
        workdirs.ConfigMismatch,
        match=re.escape("config.batching.scheme: 'packed' recorded, 'length_grouped' now"),
    ):
        bind("batching.scheme=length_grouped")
    with pytest.raises(
        workdirs.ConfigMismatch, match=re.escape("config.batching.bucket_tokens: 16 recorded, 8 now")
    ):
        bind("batching.bucket_tokens=8")
    with pytest.raises(
        workdirs.ConfigMismatch,
        match=re.escape("config.batching.loss_weighting: 'batch_mean' recorded, 'corpus_mean' now"),
    ):
        bind("batching.loss_weighting=corpus_mean")
    # A workdir recorded before the key ran random batches in the doubling buckets: resuming it under
    # today's default is refused, and with the batching it ran it resumes.
    record = json.loads((tmp_path / workdirs.CONFIG_FILE).read_text())
    del record["config"]["batching"]
    (tmp_path / workdirs.CONFIG_FILE).write_text(json.dumps(record))
    with pytest.raises(workdirs.ConfigMismatch, match="config.batching.bucket_tokens: 0 recorded, 16 now"):
        bind()
    mismatch = "config.batching.scheme: 'random' recorded, 'packed' now"
    with pytest.raises(workdirs.ConfigMismatch, match=mismatch):
        bind("batching.bucket_tokens=0")
    with pytest.raises(
        workdirs.ConfigMismatch, match="config.batching.min_row_share: 0.0 recorded, 0.05 now"
    ):
        bind("batching.scheme=random,batching.bucket_tokens=0")
    bind("batching.scheme=random,batching.bucket_tokens=0,batching.min_row_share=0")


def test_compute_counts_each_phases_real_and_padding_tokens():
    run_spec = spec.resolve(tiny.get_config())
    lengths = np.random.default_rng(0).integers(5, 33, size=40).astype(np.int32)
    results = {
        "global_batch_size": 4,
        "data": {"num_examples": {"train": 40}},
        "phases": [
            {"phase": p.name, "steps": steps} for p, steps in zip(run_spec.phases, (3, 25), strict=True)
        ],
    }
    counted = compute.of_results(run_spec, results, train_lengths=lengths)
    for index, (phase, steps) in enumerate(zip(counted["phases"], (3, 25), strict=True)):
        real, padding = batching.token_counts(
            lengths,
            steps=steps,
            global_batch_size=4,
            seed=batching.phase_seed(0, index),
            order=run_spec.train_order,
        )
        assert (phase["tokens_real"], phase["tokens_padding"]) == (real, padding)
        assert real > 0 and padding >= 0
    assert counted["total"]["tokens_real"] == sum(p["tokens_real"] for p in counted["phases"])
    # Read back from the run's record (run_compute, the grid report's cost columns and ratios) ...
    again = compute.of_results(run_spec, {**results, compute.RESULTS_KEY: counted})
    assert again["phases"] == counted["phases"] and again["total"] == counted["total"]
    # ... and runs recorded before the counts have none (and no total of them).
    assert "tokens_real" not in compute.of_results(run_spec, results)["total"]
