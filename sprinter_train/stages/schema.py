"""What every setting of conf/ holds, one declaration per key, grouped as conf/ groups them.

stages.settings checks a config against these before a stage is dispatched (nothing loads
before); a test sweeps every numeric and list key with 0, a negative, NaN, a float where an
integer is meant and [], and refuses a key of conf/ that is declared nowhere here. Where 0
or a negative is a meaningful value the declaration says so (`note`). Relations between
keys (fractions that must leave a train split, λ inside train.lam_range, a method the bench
knows) stay with the hand checks of the packages that own them.
"""

from __future__ import annotations

from sprinter_train.core.schema import Num, Seq, Spec, Switch, Text, Word, positive, share, whole
from sprinter_train.verifier.labels import LABELS
from sprinter_train.verifier.sidecar import FEATURE_NAMES, FEATURE_SETTINGS, HEADS, MLP_HIDDEN

SEED = whole(0)
FRACTION = Num(low=0, high=1, above=True, note="a share of prompts: 0 leaves the split empty")
WORKERS = {"devices": whole(1), "num_nodes": whole(1)}
LAM = positive()
C_GRID = Seq(positive())
LONGEST = 1 << 17  # tokens: beyond any supported model's context, a KV cache that exhausts memory
TOKENS = whole(1, high=LONGEST)
ON = Switch()
AUTO_ON = Switch(words=("auto",))
TEXT = Text()
MAYBE = Text(null=True)
NULL = Word((), null=True)  # a node that is null or a table of its own keys (models.companion)
SPLIT = Word(("train", "val", "test"))
START = Word(("spawn", "fork", "forkserver"))
STRATEGY = Word(("auto", "ddp"))

TOP: dict[str, Spec] = {
    "stage": TEXT,
    "experiment": TEXT,
    "artifacts_root": TEXT,
    "experiment_dir": TEXT,
    "checkpoints_root": TEXT,
    "checkpoint_dir": TEXT,
    "device": TEXT,
    "dtype": TEXT,
    "num_threads": whole(0, note="0: torch's default"),
    "all_steps": Seq(unique=True, note="stage=all names an unknown step before any work"),
}

DATA: dict[str, Spec] = {
    "num_prompts": whole(0, null=True, note="null or 0: every prompt of the split"),
    "seed": SEED,
    "val_fraction": FRACTION,
    "test_fraction": FRACTION,
    "max_prompt_tokens": whole(0, null=True, note="0 or null: no limit"),
    "prefix_fraction": Num(low=0, high=1, above=True),
    "name": TEXT,
    "source": TEXT,
    "chat_template": Switch(null=True, note="null: by the source"),
    **{f"{k}_field": MAYBE for k in ("prompt", "id", "reference", "text")},
    "prompt_format": MAYBE,
    **{f"hf_{k}": MAYBE for k in ("path", "name", "split", "revision", "data_dir", "data_files")},
}

DISTILL: dict[str, Spec] = {
    "seed": SEED,
    "max_minutes": positive(),
    "max_tokens": whole(1, null=True, note="null: no limit"),
    "eval_every_shards": whole(1),
    "passes_per_shard": whole(1),
    "eval_sequences": whole(1),
    "save_every_visits": whole(1),
    "corpus.seq_len": whole(2),
    "corpus.shard_sequences": whole(1),
    "corpus.max_tokens": whole(1),
    "corpus.max_user_chars": whole(1),
    "corpus.generated.max_tokens": whole(1),
    "corpus.generated.max_new_tokens": whole(1),
    "corpus.generated.block_prompts": whole(1),
    "teacher.top_k": whole(1),
    "teacher.batch_size": whole(1),
    "teacher.threads": whole(1),
    "train_threads": whole(1),
    "student.init_layers": Seq(whole(0)),
    "student.embed_rank": whole(1),
    "student.head_vocab": whole(1),
    "student.hidden_size": whole(1),
    "student.intermediate_size": whole(1),
    "student.num_attention_heads": whole(1),
    "student.num_key_value_heads": whole(1),
    "student.num_layers": whole(1),
    "optim.lr": positive(),
    "optim.weight_decay": Num(low=0, note="0: none"),
    "optim.warmup_steps": whole(0, note="0: no warm-up"),
    "optim.decay_fraction": share(note="0: no anneal"),
    "optim.final_lr_fraction": share(),
    "optim.batch_sequences": whole(1),
    "optim.grad_clip": positive(),
    "loss.ce_weight": Num(low=0, note="0: term off"),
    "loss.tv_weight": Num(low=0, note="0: term off"),
    "loss.top1_weight": Num(low=0, note="0: term off"),
    "name": TEXT,
    "role": Word(("draft", "companion")),
    "output_dir": TEXT,
    "work_dir": TEXT,
    "export": ON,
    "warm_start": ON,
    "corpus.source": Word(("replies", "generated", "mix")),
    "teacher.background": ON,
    "student.init": Word(("target_layers", "pca")),
    "student.freeze_embedding": ON,
}

DRAFT_EVAL: dict[str, Spec] = {
    "extra_sources": Seq(empty=True, note="[]: `source` alone"),
    "seed": SEED,
    "num_sequences": whole(1),
    "seq_len": whole(2),
    "prompt_fraction": Num(low=0, high=1, above=True),
    "max_user_chars": whole(1),
    "min_reply_tokens": whole(1),
    "gammas": Seq(whole(1)),
    "latency_reps": whole(1),
    "context_tokens": whole(1),
    "temperatures": Seq(Num(low=0), empty=True, note="0 is greedy; []: `sampling` alone"),
    "targets.*": positive(),
    "floor_reps": whole(1),
    "step_targets.*": positive(),
    "source": TEXT,
    "split": SPLIT,
    "update_model_card": ON,
}

HARVEST: dict[str, Spec] = {
    "mix_weights.*": Num(low=0, note="0: the mix is off"),
    "continuation_tokens": TOKENS,
    "max_positions_per_prompt": whole(1, null=True, note="null: continuation_tokens"),
    "interleaved_max_run": whole(1),
    "calibration_prompts": whole(1),
    "gamma": whole(1),
    "hidden_layer": Num(low=-1, whole=True, note="-1: the last, normed state"),
    "seed": SEED,
    "batch_size": whole(1),
    "generation_batch_size": whole(1),
    "shared_generation_rows": whole(0, note="0: never share a call"),
    "statistics_rows": whole(1),
    "shard_rows": whole(1),
    "interleaved_accept": Num(low=0, high=1, above=True, words=("auto",), note="auto: measured"),
    "split": Word(("train", "val", "test"), null=True),
    "start_method": START,
    "strategy": STRATEGY,
    "verify_hashes": ON,
    **WORKERS,
}

TRAIN: dict[str, Spec] = {
    "all_labels": Seq(Word(("ratio", "accept_prob")), unique=True),
    "lam": positive(null=True, note="null: every λ of train.lams"),
    "lams": Seq(LAM, unless="train.lam"),
    "lam_range": Seq(positive(), size=2, note="[low, high]"),
    "mlp.hidden": MLP_HIDDEN,
    "mlp.dropout": Num(low=0, high=1, note="0: none; below 1"),
    "mlp.weight_decay": Num(low=0, note="0: none"),
    "mlp.lr": positive(),
    "features": FEATURE_NAMES,
    "select.l2_grid": Seq(positive()),
    "select.l2_scalars": Num(low=0, note="0: no L2"),
    "select.tie": Num(low=0, note="0: only equal AUCs tie"),
    "select.max_train_rows": whole(1),
    "select.max_iter": whole(1),
    **{f"feature_settings.{key}": spec for key, spec in FEATURE_SETTINGS.items()},
    "batch_size": whole(1),
    "min_batches_per_epoch": whole(1),
    "lr": positive(),
    "weight_decay": Num(low=0, note="0: none"),
    "plateau_factor": Num(low=0, high=1, above=True),
    "plateau_patience": whole(0, note="0: lower the lr after one flat epoch"),
    "max_epochs": whole(1),
    "patience": whole(0, note="0: stop at the first flat epoch"),
    "min_delta": Num(low=0),
    "seed": SEED,
    "learning_curve": Seq(Num(low=0, high=1, above=True), empty=True, note="[] skips"),
    "log_every_n_steps": whole(1),
    "head": Word(HEADS),
    "label": Word(tuple(LABELS), null=True),  # null: ratio, as before labels
    "progress_bar": ON,
    "select.enabled": ON,
    "start_method": START,
    "strategy": STRATEGY,
    **WORKERS,
}

TABLES: dict[str, Spec] = {
    "grids": Seq(whole(1)),
    "adaptive": Seq(whole(1)),
    "min_count": whole(1),
    "x_bins": whole(1),
    "fit_splits": Seq(Word(("train", "val", "test")), unique=True),
    "seed": SEED,
    "default": TEXT,
}

EVALUATE: dict[str, Spec] = {
    "lams": Seq(LAM, null=True, note="null: the λs stage=train trains"),
    "taus": Seq(share()),
    "tau": share(),
    "ece_bins": whole(1),
    "theorem_mixes": Seq(),
    "seed": SEED,
    "bootstrap.resamples": whole(1),
    "bootstrap.seed": SEED,
    "bootstrap.level": Num(low=0, high=1, above=True),
    "target_auc": positive(note="an AUC the learning curve is read against; above 1: unreached"),
    "transfer": Seq(empty=True, note="[]: none"),
    "ceiling.lam": LAM,
    "ceiling.max_train_rows": whole(1),
    "ceiling.c_grid": C_GRID,
    "ceiling.mlp_hidden": whole(1),
    "ceiling.mlp_alphas": Seq(positive()),
    "mixes": Seq(empty=True, note="[] skips"),
    "ablation.groups": Seq(null=True, note="null: every group the records give"),
    "ablation.lam": LAM,
    "ablation.max_train_rows": whole(1),
    "ablation.max_val_rows": whole(1),
    "ablation.c_grid": C_GRID,
    "split": SPLIT,
    "allow_train_overlap": ON,
    "ablation.enabled": ON,
    "ablation.base": MAYBE,
    "ablation.embedding": ON,
    "ceiling.enabled": ON,
    "ceiling.embedding": ON,
}

BENCH: dict[str, Spec] = {
    "methods": Seq(unique=True),
    "num_prompts": whole(1, high=1 << 16, note="more would be timed for days"),
    "max_new_tokens": TOKENS,
    "batch_sizes": Seq(whole(1), empty=True, note="batch 1 always runs"),
    "law_distance_prompts": whole(0, note="0: no law distance"),
    "warmup_runs": whole(0, note="0: no warm-up"),
    "min_timed_runs": whole(1),
    "seed": SEED,
    "gamma_max": whole(0, note="0: sd drafts nothing"),
    "latency.reps": whole(1),
    "latency.context_tokens": TOKENS,
    "latency.check_factor": Num(low=1),
    "latency.unchecked_gamma": whole(0),
    "hf_assisted.num_assistant_tokens": whole(1, words=("auto",)),
    "hf_assisted_heuristic.num_assistant_tokens": whole(1, words=("auto",)),
    "judge.timeout": positive(),
    "guard.ppl_ratio": Num(low=1),
    "guard.nll_batch_size": whole(1),
    "guard.score_shift": Num(low=0, high=1, above=True),
    "guard.acceptance_ratio": Num(low=1),
    "guard.tau_ladder": Seq(
        Num(low=0, high=1, above=True),
        empty=True,
        unique=True,
        note="[]: no decode at a stricter τ",
    ),
    "frontier.enabled": AUTO_ON,
    "frontier.batches": Seq(whole(1), unique=True),
    "frontier.verifier_vs_hand": positive(),
    **{
        key: Seq(Num(low=0, high=1, above=True), empty=True, unique=True, note="[]: left out")
        for key in (
            *(f"frontier.{r}" for r in ("verifier", "entropy", "typical")),
            *(f"stop_rules.{r}" for r in ("product", "hazard")),
        )
    },
    "stop_rules.split": SPLIT,
    "stop_rules.every": whole(0, note="0: never chosen again"),
    "targets.*": Num(low=0),
    "split": SPLIT,
    "allow_train_overlap": ON,
    "energy": ON,
    "latency.reuse": ON,
    "hf_static.compile_mode": TEXT,
    "vllm.python": TEXT,
    "vllm.num_speculative_tokens": whole(1, words=("auto",)),
    "vllm.dtype": Word(("auto", "float32", "bfloat16")),
    "vllm.runs": whole(1),
    "vllm.kv_cache_gib": whole(1, null=True, note="null: vLLM's default share of memory"),
    "judge.enabled": ON,
    "judge.baseline": TEXT,
    "judge.api_key_env": TEXT,
    "judge.endpoint": MAYBE,
    "judge.local": Word(("target", "draft"), null=True),
    "judge.model": MAYBE,
}

METHODS: dict[str, Spec] = {
    "*.max_gamma": whole(0),
    "*.gamma": whole(0, words=("auto",)),
    "adaedl.gamma": positive(),
    "adaedl.lam": Num(low=0),
    "mtad.beam_width": whole(1),
    "mtad.tau": positive(),
    "*.planner.margin": Num(low=0),
    "*.planner.weight": Num(low=0),
    "*.planner.probe_every": whole(0, note="0: never"),
    "sd_heuristic.gamma_init": whole(1),
    "sd_heuristic.gamma_min": whole(0),
    "*.verifier.lam": positive(null=True),
    "*.online.positions": whole(1),
    "*.online.init_weight": Num(note="a slope: any sign"),
    "*.online.init_bias": Num(note="a logit: any sign"),
    "*.online.l2": Num(low=0),
    "*.online.refit_interval": whole(1),
    "*.online.min_observations": whole(1),
    "*.online.warmup_refits": whole(0),
    "*.online.warmup_score": share(),
    "sprinter.tau": share(),
    "sprinter.max_run": whole(1),
    "*.companion_plan.window": whole(1),
    "*.companion_plan.margin": Num(low=0),
    "*.companion_plan.warmup": whole(0),
    "*.companion_plan.probe_every": whole(0, note="0: never"),
    "*.companion_plan.weight": Num(low=0),
    "typical.epsilon": Num(low=0, high=1, above=True),
    "typical.delta": positive(null=True, note="null: sqrt(epsilon)"),
    "svip.h": positive(),
    "svip.c": positive(),
    "*._target_": TEXT,
    "*.warped_entropy": ON,
    "*.table": NULL,
    "*.table.binning": MAYBE,
    "*.table.optional": ON,
    "*.verifier.label": Word(("ratio", "accept_prob")),
    "*.verifier.head": Word(HEADS),
    "*.verifier.kind": Word(("checkpoint", "online", "entropy")),
    "*.online.margin": Word(("logits", "q")),
}
ONLINE = ("positions", "init_weight", "init_bias", "l2", "refit_interval", "min_observations")
METHODS.update({f"*.verifier.{k}": METHODS[f"*.online.{k}"] for k in ONLINE})
METHODS.update({f"*.verifier.{k}": METHODS[f"*.online.{k}"] for k in ("warmup_refits", "margin")})
METHODS["*.verifier.warmup_score"] = METHODS["*.online.warmup_score"]

DECODING: dict[str, Spec] = {
    "pack_every": whole(1),
    "static_capacity": whole(0, high=LONGEST, note="0: sized from the prompt and budget"),
    "prefill_tokens": whole(1, high=1 << 24, note="more would not fit any device's memory"),
    "compile": AUTO_ON,
    "compile_drafts": AUTO_ON,
    "static_cache": AUTO_ON,
    "capture": AUTO_ON,
    "prefill": Word(("auto", "by_length", "padded")),
    "compile_cache": Text(null=True, note="auto, a folder, or null: none"),
}

SAMPLING: dict[str, Spec] = {
    "temperature": Num(low=0, note="0 is greedy"),
    "top_k": whole(0, null=True, note="0: no top-k"),
    "top_p": Num(low=0, high=1, above=True),
}

MODELS: dict[str, Spec] = {
    "*.seed": SEED,
    "*.path": TEXT,
    "*.gguf_file": MAYBE,
    "*.revision": MAYBE,
    "*.trust_remote_code": ON,
    "companion": NULL,
    "cache_dir": TEXT,
    "pack_linear": ON,
    "lean_draft": ON,
}

LOGGER: dict[str, Spec] = {
    "wandb.enabled": ON,
    "wandb.mode": Word(("offline", "online", "disabled")),
    "wandb.project": TEXT,
}

EXPORT: dict[str, Spec] = {"method": MAYBE, "out_dir": MAYBE}

GROUPS: dict[str, dict[str, Spec]] = {
    "data": DATA,
    "distill": DISTILL,
    "draft_eval": DRAFT_EVAL,
    "harvest": HARVEST,
    "train": TRAIN,
    "tables": TABLES,
    "evaluate": EVALUATE,
    "bench": BENCH,
    "methods": METHODS,
    "decoding": DECODING,
    "sampling": SAMPLING,
    "models": MODELS,
    "logger": LOGGER,
    "export": EXPORT,
}

FREE = ("models.*.config", "models.*.tokenizer")  # a tiny model's own: transformers checks it


def schema() -> dict[str, Spec]:
    """Every declaration, keyed by its full dotted key."""
    flat = dict(TOP)
    for group, specs in GROUPS.items():
        flat.update({f"{group}.{key}": spec for key, spec in specs.items()})
    return flat
