"""The run defaults every experiment starts from. Task configs (the checkout's configs/*.py, or your own
file anywhere) call `defaults.get_config()` and change a few keys.

Keys that form the interface (see README, "Configuration"):
  model.name_or_path         hub id (bert-base-uncased, roberta-base, xlm-roberta-base,
                             google/electra-base-discriminator, distilbert-base-uncased), local folder,
                             or "embedded:minilm"
  data.task                  qqp | mrpc | stsb | sst2 | conll2003 | yahoo_answers
  data.train_file / dev_file / test_file   local files; unset -> the Hugging Face dataset
  strategy                   finetune_only | finetune_only_uniform | stack_only | stack_and_finetune |
                             gradual_unfreezing | lp_ft | lora | lp_lora | bitfit | lp_bitfit | adapters,
                             or the name of the schedule written in `phases`
  phases                     a list of phase blocks (stackft_jax/config/phases.py); empty: the preset
  seed, max_seq_length, per_device_batch_size (global batch = per-device x device count)
  phase1.*                   the frozen-backbone phase (stack_only, and phase 1 of stack_and_finetune)
  phase2.*                   the all-parameters phase (finetune_only, and phase 2 of stack_and_finetune)
  unfreezing.*               gradual_unfreezing's phases between the head and everything
Presets: `--config=configs/quora.py:demo,head=cls_mlp,strategy=finetune_only` (comma-separated; a bare
word names a preset of that file, `key=value` sets a key).
"""

import ml_collections
from ml_collections.config_dict import placeholder

from stackft_jax.config import phases
from stackft_jax.models import adaptation
from stackft_jax.models.heads import default_head_configs


def get_config() -> ml_collections.ConfigDict:
    # Every key has a comment (`--show_config` prints them): at the end of its line, or just above it.
    c = ml_collections.ConfigDict()
    # A preset: finetune_only | finetune_only_uniform | stack_only | stack_and_finetune |
    # gradual_unfreezing | lp_ft | lora | lp_lora | bitfit | lp_bitfit | adapters (stackft_jax/config/
    # phases.py); with `phases` written, the name of that schedule.
    c.strategy = "stack_and_finetune"
    # The schedule as a list of phases.block(...) (a config file writes it); []: the preset. Rules
    # address backbone/embeddings/..., backbone/layers/<i>/..., backbone/pooler/... (BERT, RoBERTa,
    # XLM-R) and head/...
    c.phases = []
    c.seed = 0  # parameter init, data order and dropout
    c.max_seq_length = 128  # tokens per example; batches are padded to length buckets up to it
    c.per_device_batch_size = 32  # training batch per device; global batch = this x device count
    c.eval_per_device_batch_size = 64  # evaluation batch per device (does not change results)
    # How training draws its batches (stackft_jax/data/batching.py). Runs recorded before this block
    # read as scheme=random, bucket_tokens=0, loss_weighting=batch_mean (what they ran).
    c.batching = ml_collections.ConfigDict()
    # random (each epoch's permutation cut in order: the composition every recorded run trained on) |
    # length_grouped (each mega-batch of group_batches batches sorted by length, batches in random order:
    # a third of the padding, but on CoNLL-2003 at 300 steps every grouped run scored below every random
    # one, about 1 F1 point; benchmarks/RESULTS.md §12) |
    # packed (the default: random's batches, the encoder computing them packed several examples per row
    # and unpacking its outputs: the same examples per step, a tenth of the padding on CoNLL-2003 and dev
    # F1 inside random's seed spread; data/packing.py, benchmarks/RESULTS.md §15)
    c.batching.scheme = "packed"
    # Training batches pad to the next multiple of this (or max_seq_length): a phase's train step compiles
    # at most ceil(max_seq_length / bucket_tokens) times; 0: the doubling buckets 32, 64, ..., max_seq_length
    c.batching.bucket_tokens = 16
    c.batching.group_batches = 50  # length_grouped: batches per mega-batch sorted by length
    # packed: a phase compiles its train step for the packed row counts that at least this share of its
    # batches need (and the largest); a batch needing a rarer count pads up to the next one (data/packing.py:
    # on CoNLL-2003 at 128 tokens 3 compilations instead of 5; benchmarks/RESULTS.md §15). 0: every row
    # bucket a batch needs compiles.
    c.batching.min_row_share = 0.05
    # batch_mean (a batch's summed loss over its own count of real rows or tagging words: its mean) |
    # corpus_mean (over the count a batch holds on average over the training split, so every row or word
    # weighs the same in every batch; meant for length_grouped, whose batches of short sentences hold a
    # tenth of the words of its batches of long ones)
    c.batching.loss_weighting = "batch_mean"

    c.model = ml_collections.ConfigDict()
    # Hub id or local folder of a BERT, RoBERTa, XLM-R, ELECTRA or DistilBERT (config.json model_type),
    # or "embedded:minilm"
    c.model.name_or_path = "bert-base-uncased"
    c.model.init = "pretrained"  # pretrained | random (name_or_path's config and tokenizer, random weights)
    c.model.allow_pickle = False  # load pytorch_model.bin (unpickling runs code) when no safetensors
    # Compute dtype: auto | float32 | bfloat16; auto is bfloat16 on GPU and TPU, float32 on CPU (parameters,
    # optimizer state, softmax, LayerNorm statistics and the loss stay float32). Recorded resolved.
    c.model.dtype = "auto"
    # Attention: auto | einsum | dot_product | splash (stackft_jax/models/attention.py); auto is cuDNN's
    # fused kernel on GPU in bfloat16, splash on one TPU chip, einsum elsewhere. The fused paths have no
    # dropout on the attention probabilities. Recorded resolved.
    c.model.attention = "auto"
    # What each encoder layer keeps for the backward pass: none | dots_saveable (recompute all but the
    # matrix products) | full (recompute the layer); less memory for more compute, same results
    c.model.remat = "none"
    c.model.scalar_mix = False  # heads see a learned mix of all BERT layers instead of the last
    c.model.dropout_rate = placeholder(float)  # overrides BERT's hidden/attention dropout when set
    # Architecture: a non-zero value replaces config.json's (tiny random models for tests; needs
    # model.init=random).
    c.model.config_overrides = ml_collections.ConfigDict(
        {
            "hidden_size": 0,  # width of every layer; 0: config.json's
            "num_hidden_layers": 0,  # transformer layers; 0: config.json's
            "num_attention_heads": 0,  # attention heads per layer; 0: config.json's
            "intermediate_size": 0,  # feed-forward width; 0: config.json's
        }
    )

    c.head = default_head_configs()  # one block of options per head (stackft_jax/models/heads/)
    c.head.name = "cls_mlp"  # the task head (README: heads)
    c.head.dropout_rate = 0.1  # dropout inside the head

    # > 0: the last phase's step budget (stack-and-finetune's phase 2, finetune-only's one phase),
    # replacing its num_steps / num_epochs: a grid's budget axis (experiments/budget_curves.py); 0: off.
    c.budget_steps = 0
    c.data = ml_collections.ConfigDict()
    c.data.task = "qqp"  # qqp | mrpc | stsb | sst2 | conll2003 | yahoo_answers (stackft_jax/data/tasks.py)
    c.data.train_file = placeholder(str)  # local file; unset: the Hugging Face dataset
    c.data.dev_file = placeholder(str)  # local file; unset: the Hugging Face dataset
    c.data.test_file = placeholder(str)  # local file, scored at the end; unset: no test split
    c.data.cache_dir = placeholder(str)  # tokenized-data cache; default ~/.cache/stackft_jax
    # A share of train in (0, 0.5] held out for selection (the loop's evaluations, best checkpoint, stop
    # rules, phase boundaries), so dev and test are only reported; 0: off, selection reads dev.
    c.data.selection_fraction = 0.0
    c.data.selection_seed = 0  # which examples the selection slice holds (the same for every run seed)
    # Word tagging: fill each window with the neighbouring sentences of the same document (unlabelled).
    c.data.document_context = False
    # conll2003: the entity F1 a run's rules read (best checkpoint, phase-1 gap `f1`): conlleval | strict
    c.data.entity_f1 = "conlleval"
    # yahoo_answers: its topics in label order, snake_case names joined by "+" (or "all")
    c.data.classes = "society_culture+science_mathematics"
    c.data.dev_fraction = 0.1  # yahoo_answers without data.dev_file: train share held out as dev
    c.data.truncation = "head"  # yahoo_answers: head (first tokens) | head_tail (first 25% + last 75%)

    # The inputs of the presets, with their keys' defaults and comments written once, in
    # stackft_jax/config/phases.py (ALIASES; the Phase keys they carry are Phase's).
    c.phase1 = phases.ALIASES["phase1"].config()  # the frozen-backbone phase (stack_only, and s&f's first)
    c.phase2 = phases.ALIASES["phase2"].config()  # the all-parameters phase (finetune_only, and s&f's second)
    c.unfreezing = phases.ALIASES["unfreezing"].config()  # gradual_unfreezing: the phases after the head's
    # Each adaptation kind's options (stackft_jax/models/adaptation/<kind>.py), read by the phases whose
    # `adaptation` names it (the presets lora, lp_lora, bitfit, lp_bitfit, adapters).
    c.adaptation = adaptation.default_adaptation_configs()
    # Where feature-cached phases keep their backbone features: a folder shared by runs (one subfolder
    # per fingerprint of model, data and options; training/feature_cache.py); "": WORKDIR/feature_cache,
    # or a grid's shared folder; "none": WORKDIR's, also in a grid.
    c.feature_cache_dir = ""

    # At the end of each frozen-backbone phase: the head's parameter norm, dev ECE and the train/dev gap
    # (results.json `phases[i].boundary`), the gap over this many train examples.
    c.boundary_train_examples = 2000
    c.calibration = ml_collections.ConfigDict()
    # Fit one softmax temperature on dev to the final model (Guo et al. 2017); ECE before and after in
    # results.json `calibration` (classification tasks).
    c.calibration.temperature = False

    c.final_params = "last"  # what results.json's `final` scores: "last" parameters, or "best" on dev
    c.max_grad_norm = 1.0  # clip the trainable leaves' global gradient norm to this; 0: off
    # What a step whose loss or gradients are not finite (and every step after it) does, leaving params
    # and optimizer state as they were either way: skip_update (one lax.cond around the optimizer update:
    # fewer bytes per step) | select (the update runs, then a select per trainable leaf and moment).
    # A run recorded before the key reads as select (what it ran; the two differ in the last bits).
    c.nonfinite_guard = "skip_update"
    # Micro-batches per optimizer step: each step sums the gradients of this many global batches (one
    # effective batch of grad_accum_steps x global batch examples, which budgets and reports count);
    # batching.scheme=packed packs each micro-batch's examples apart (data/packing.py)
    c.grad_accum_steps = 1
    c.log_every_steps = 50  # training loss, gradient norm and examples/s to TensorBoard
    c.eval_every_steps = 500  # dev evaluation (and the phase-1 stop rules) every this many steps
    c.checkpoint_every_steps = 500  # periodic checkpoint for resuming
    c.keep_checkpoints = 2  # periodic checkpoints kept per running phase
    c.async_checkpointing = True  # write checkpoints in the background while training goes on
    # Compiled programs on disk, reused by later runs (command line only; runtime/compilation_cache.py).
    # "auto": $JAX_COMPILATION_CACHE_DIR, else ~/.cache/stackft_jax/jax_compilation_cache; "none": off.
    c.compilation_cache_dir = "auto"
    # Set by a grid's matched-budget cells (`matched`, stackft_jax/experiments/budgets.py), for the
    # report; they change nothing the run computes (its phase's num_steps carries the budget).
    c.matched_budget = ml_collections.ConfigDict()
    c.matched_budget.rule = ""  # steps | examples | flops [.no_cache: that budget kind]; "": not matched
    c.matched_budget.compared = ""  # the axis value whose planned budget this run got
    c.matched_budget.budget = 0.0  # that budget in the rule's unit (steps, examples or FLOPs)
    # every | light: the heads a flops rule's budget counted (models/flops.py HEAD_COUNTS); "": no flops rule
    c.matched_budget.head_flops = ""
    # Locked: a config file that sets a key the defaults lack (`c.phase1.num_step = 3`) fails at that
    # line (config_cli.load names it), rather than adding a key that nothing reads.
    c.lock()
    return c
