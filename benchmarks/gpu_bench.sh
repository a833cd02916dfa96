#!/usr/bin/env bash
# One command for a lent GPU with no network: install what travelled, profile a batch-1 target
# step compiled and eager, run the gpu tests, one stage=bench of the offline pair at batch
# sizes 1, 8 and 64, and stage=draft_eval; everything lands in one folder
# (docs/results/gpu.md). The steps run in the order of what a short lease most needs: the
# compiled step, the bench, the gpu tests, the eager step (today's dynamic engine), draft_eval.
#
#   benchmarks/gpu_bench.sh                          # on the GPU, defaults sized for < 10 min on an H100
#   DEVICE=cpu MODELS=tiny_random PROMPTS=2 MAX_NEW_TOKENS=8 BATCH_SIZES=1,2 benchmarks/gpu_bench.sh
#
# Settings (environment): DEVICE (cuda), DTYPE (auto), MODELS (offline_default), PROMPTS (64),
# MAX_NEW_TOKENS (32), BATCH_SIZES (1,8,64; 32 too once compile time allows), METHODS (target_only,sd,svip,hf_static;
# with the pipeline's verifiers: target_only,sd,svip,sv,sprinter,sd_learned,hf_static), PIPELINE_PROMPTS
# (40) and PIPELINE_ARGS (the pipeline step's data.num_prompts and extra overrides),
# COMPILE (decoding.compile: true), STATIC_CAPACITY (decoding.static_capacity: 1024, one KV
# capacity for every generation, so one compiled shape per rows and width), MAX_PROMPT_TOKENS
# (data.max_prompt_tokens: 960, so prompt + budget fit that capacity), GAMMA_MAX (3: block widths
# 1-4), SD_GAMMA (3: one verify width), PROFILE_STEPS (32), PYTHON (python3), WHEELS (a folder
# of wheels, installed --no-deps; default: shared/wheels or wheels/ when present), PYTEST_PATHS
# (tests), CHECKPOINT_DIR (the bench's verifiers, for sprinter and sd_learned:
# checkpoints/gpu_bench; gpu_stage.py's run.sh sets it to the carried experiment's),
# COMPILE_CACHE (a compile cache an earlier run left, copied into OUT/compile_cache first;
# every step compiles through OUT/compile_cache, which travels back with OUT for the next
# lease: decoding.compile_cache), BENCH_ARGS and DRAFT_EVAL_ARGS (extra Hydra overrides,
# space-separated), STEPS (the
# steps to run, comma-separated; default all six: install,profile,bench,gpu_tests,
# profile_eager,draft_eval; profile_sd when named), OUT
# (gpu_bench_out/<timestamp>), and each step's time limit in seconds: T_INSTALL (25), T_PIPELINE (540),
# T_PROFILE (100), T_BENCH (260), T_TESTS (70), T_PROFILE_EAGER (70), T_DRAFT_EVAL (50),
# T_PROFILE_SD (120). A failed
# or timed-out step is reported and the next one runs; the exit status is 1 when any step
# failed. A bench cut short keeps the batch sizes it finished (bench/partial/). A STEPS naming
# no known step, or a COMPILE_CACHE naming no folder, is refused before anything runs (exit 2).
# Into a reused OUT, each step that runs first deletes what it wrote there before, and the
# summary reports only the steps run now: a bench that stops before finishing a batch size says
# it has no results, never the last run's.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 2
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-auto}
MODELS=${MODELS:-offline_default}
PROMPTS=${PROMPTS:-64}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-32}
BATCH_SIZES=${BATCH_SIZES:-1,8,64}
COMPILE=${COMPILE:-true}
STATIC_CAPACITY=${STATIC_CAPACITY:-1024}
MAX_PROMPT_TOKENS=${MAX_PROMPT_TOKENS:-960}
GAMMA_MAX=${GAMMA_MAX:-3}
SD_GAMMA=${SD_GAMMA:-3}
PROFILE_STEPS=${PROFILE_STEPS:-32}
# the modules holding gpu tests: collecting all of tests/ needs datasets, which does not travel
PYTEST_PATHS=${PYTEST_PATHS:-$(grep -l "pytest.mark.gpu" tests/test_*.py | tr '\n' ' ')}
PIPELINE_PROMPTS=${PIPELINE_PROMPTS:-40}  # the pipeline step's data.num_prompts (make demo's)
PIPELINE_ARGS=${PIPELINE_ARGS:-}
BENCH_ARGS=${BENCH_ARGS:-}
DRAFT_EVAL_ARGS=${DRAFT_EVAL_ARGS:-}
# profile_sd (an sd round of the offline pair, compiled, gamma PROFILE_GAMMA: 3) runs only when
# named: the default six fill a call's 10 minutes
# pipeline (stage=all at demo size: harvest -> train -> tables -> evaluate into the bench's
# experiment, so its bench runs sv, sprinter and sd_learned on this machine's own artifacts)
# runs only when named too: plan it as a call of its own (docs/results/gpu.md)
ALL_STEPS=install,profile,pipeline,bench,gpu_tests,profile_sd,profile_eager,draft_eval
STEPS=${STEPS:-install,profile,bench,gpu_tests,profile_eager,draft_eval}
# a misspelt step would otherwise be skipped like an unnamed one: refuse it before any work
UNKNOWN=() NAMED=0
IFS=, read -ra STEP_NAMES <<<"$STEPS"
for name in "${STEP_NAMES[@]}"; do
  [ -n "$name" ] || continue
  NAMED=$((NAMED + 1))
  case ",$ALL_STEPS," in
    *",$name,"*) ;;
    *) UNKNOWN+=("$name") ;;
  esac
done
if [ "${#UNKNOWN[@]}" -gt 0 ] || [ "$NAMED" -eq 0 ]; then
  if [ "${#UNKNOWN[@]}" -gt 0 ]; then
    problem="no step is called ${UNKNOWN[*]}"
  else
    problem="it names no step"
  fi
  echo "gpu_bench.sh: STEPS=$STEPS refused ($problem): the steps are ${ALL_STEPS//,/, }" \
    "(comma-separated, e.g. STEPS=install,bench)" >&2
  exit 2
fi
# a carried compile cache that is not there would cost a cold compile of every step, unsaid:
# refuse it by name before any work, as a lease's minutes are worth more than a retyped name
if [ -n "${COMPILE_CACHE:-}" ] && [ ! -d "$COMPILE_CACHE" ]; then
  where=$COMPILE_CACHE
  [ "${where#/}" = "$where" ] && where="$REPO/$where"  # a relative one is read from the repo
  echo "gpu_bench.sh: COMPILE_CACHE=$COMPILE_CACHE refused: no folder $where (the compile" \
    "cache an earlier run left, to carry; unset COMPILE_CACHE to compile cold)" >&2
  exit 2
fi
OUT=${OUT:-gpu_bench_out/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/logs" || exit 2
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
STARTED=$(date +%s)
FAILED=()
: >"$OUT/steps.tsv"

selected() {  # selected <name>: STEPS names it
  case ",$STEPS," in
    *",$1,"*) return 0 ;;
  esac
  return 1
}

# the bench's verifiers: the pipeline step's (this run's or an earlier call's into the same
# OUT), else what experiment=gpu_bench reads; with them the default methods add the learned ones
PIPELINE_CHECKPOINTS="$OUT/bench_run/checkpoints"
if selected pipeline || compgen -G "$PIPELINE_CHECKPOINTS/verifier-*.safetensors" >/dev/null; then
  CHECKPOINT_DIR=${CHECKPOINT_DIR:-$PIPELINE_CHECKPOINTS}
  METHODS=${METHODS:-target_only,sd,svip,sv,sprinter,sd_learned,hf_static}
fi
CHECKPOINT_DIR=${CHECKPOINT_DIR:-checkpoints/gpu_bench}
METHODS=${METHODS:-target_only,sd,svip,hf_static}

# what a step writes into OUT: deleted before the step runs, so a step that stops early (or
# fails) cannot leave an earlier run's files looking like its own
clear_outputs() {
  case $1 in
    profile | profile_sd | profile_eager) rm -f "$OUT/$1.txt" "$OUT/$1.json" "$OUT/$1.trace.json" ;;
    bench) rm -rf "$OUT/bench_run/bench" "$OUT/results.json" "$OUT/results.md" ;;
    draft_eval) rm -rf "$OUT/draft_eval" "$OUT/draft_eval.json" ;;
    pipeline)
      rm -rf "$OUT/bench_run/records" "$OUT/bench_run/train" "$OUT/bench_run/tables" \
        "$OUT/bench_run/eval" "$PIPELINE_CHECKPOINTS"
      ;;
  esac
}

# step <name> <seconds> <command...>: run it under a time limit, log to logs/<name>.log (a step
# not in STEPS is skipped)
step() {
  local name=$1 limit=$2 start rc verdict
  shift 2
  if ! selected "$name"; then
    printf '%s\tskipped\t0s\n' "$name" | tee -a "$OUT/steps.tsv"
    return
  fi
  clear_outputs "$name"
  echo "== $name (limit ${limit}s): $*"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    verdict=ok
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    verdict="TIMED OUT after ${limit}s"
  else
    verdict="FAILED (exit $rc)"
  fi
  [ "$verdict" = ok ] || { FAILED+=("$name"); tail -n 15 "$OUT/logs/$name.log"; }
  printf '%s\t%s\t%ss\n' "$name" "$verdict" "$(($(date +%s) - start))" | tee -a "$OUT/steps.tsv"
}

install_deps() {  # wheels that travelled with the repo; never the network
  local dir=${WHEELS:-}
  if [ -z "$dir" ]; then
    for candidate in shared/wheels wheels; do
      [ -d "$candidate" ] && { dir=$candidate; break; }
    done
  fi
  if [ -n "$dir" ] && compgen -G "$dir/*.whl" >/dev/null; then
    echo "installing the wheels of $dir"
    "$PYTHON" -m pip install --no-deps --no-index --find-links "$dir" "$dir"/*.whl || return 1
  else
    echo "no wheels folder (shared/wheels, wheels/ or WHEELS): using what is installed"
  fi
  "$PYTHON" - "$DEVICE" <<'PY'
import importlib, sys
import torch
missing = [m for m in ("hydra", "omegaconf", "transformers", "gguf", "sprinter_train") if importlib.util.find_spec(m) is None]
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0))
if missing:
    sys.exit(f"missing packages: {', '.join(missing)}")
if sys.argv[1].startswith("cuda") and not torch.cuda.is_available():
    sys.exit("DEVICE=cuda but torch sees no CUDA device")
PY
}

# shellcheck disable=SC2086  # BENCH_ARGS and DRAFT_EVAL_ARGS are word lists on purpose
export PYTHON DEVICE WHEELS=${WHEELS:-}
export -f install_deps  # `timeout` runs programs, so the function runs in a child bash
step install "${T_INSTALL:-25}" bash -c install_deps
# the compile cache: a carried one seeds OUT's, which every compiling step reads and fills
mkdir -p "$OUT/compile_cache"
if [ -n "${COMPILE_CACHE:-}" ] && [ "$(cd "$COMPILE_CACHE" && pwd)" != "$OUT/compile_cache" ]; then
  cp -r "$COMPILE_CACHE/." "$OUT/compile_cache/"
  echo "gpu_bench.sh: compile cache seeded from $COMPILE_CACHE"
fi
BASE=("models=$MODELS" "device=$DEVICE" "dtype=$DTYPE" "decoding.static_capacity=$STATIC_CAPACITY"
  "decoding.compile_cache=$OUT/compile_cache")
step profile "${T_PROFILE:-100}" "$PYTHON" benchmarks/profile_step.py --models "$MODELS" \
  --steps "$PROFILE_STEPS" --out "$OUT/profile.txt" --trace "${BASE[@]}" \
  "decoding.compile=$COMPILE"
BASE+=("data.max_prompt_tokens=$MAX_PROMPT_TOKENS")
step pipeline "${T_PIPELINE:-540}" "$PYTHON" -m sprinter_train stage=all "${BASE[@]}" \
  "decoding.compile=$COMPILE" experiment=gpu_bench "experiment_dir=$OUT/bench_run" \
  "checkpoint_dir=$PIPELINE_CHECKPOINTS" "all_steps=[harvest,train,tables,evaluate]" \
  "data.num_prompts=$PIPELINE_PROMPTS" $PIPELINE_ARGS
step bench "${T_BENCH:-260}" "$PYTHON" -m sprinter_train stage=bench "${BASE[@]}" \
  "decoding.compile=$COMPILE" \
  experiment=gpu_bench "experiment_dir=$OUT/bench_run" "checkpoint_dir=$CHECKPOINT_DIR" \
  "bench.methods=[$METHODS]" \
  "bench.num_prompts=$PROMPTS" "bench.max_new_tokens=$MAX_NEW_TOKENS" \
  "bench.batch_sizes=[$BATCH_SIZES]" bench.min_timed_runs=1 "bench.gamma_max=$GAMMA_MAX" \
  "methods.sd.gamma=$SD_GAMMA" bench.law_distance_prompts=0 bench.judge.enabled=false \
  bench.latency.reuse=false $BENCH_ARGS
step gpu_tests "${T_TESTS:-70}" "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider $PYTEST_PATHS
step profile_sd "${T_PROFILE_SD:-120}" "$PYTHON" benchmarks/profile_step.py --models "$MODELS" \
  --method sd --gamma "${PROFILE_GAMMA:-3}" --steps "$PROFILE_STEPS" --out "$OUT/profile_sd.txt" \
  --trace "${BASE[@]}" "decoding.compile=$COMPILE"
step profile_eager "${T_PROFILE_EAGER:-70}" "$PYTHON" benchmarks/profile_step.py \
  --models "$MODELS" --steps "$PROFILE_STEPS" --out "$OUT/profile_eager.txt" "${BASE[@]}" \
  decoding.compile=false
step draft_eval "${T_DRAFT_EVAL:-50}" "$PYTHON" -m sprinter_train stage=draft_eval \
  "${BASE[@]}" experiment=gpu_bench "experiment_dir=$OUT/draft_eval" $DRAFT_EVAL_ARGS

# the figures at the folder's top level, of the steps run now only (their old files are gone)
BENCH_STATE=not_run
if selected bench; then
  if [ -f "$OUT/bench_run/bench/results.json" ]; then
    cp "$OUT/bench_run/bench/results.json" "$OUT/bench_run/bench/results.md" "$OUT/"
    BENCH_STATE=complete
  elif [ -f "$OUT/bench_run/bench/partial/results.json" ]; then
    cp "$OUT/bench_run/bench/partial/results."* "$OUT/"  # the batch sizes a cut-short bench finished
    BENCH_STATE=partial
  else
    BENCH_STATE=none
  fi
fi
if selected draft_eval && [ -f "$OUT/draft_eval/draft_eval.json" ]; then
  cp "$OUT/draft_eval/draft_eval.json" "$OUT/"
fi
"$PYTHON" - "$OUT" "$STEPS" "$BENCH_STATE" <<'PY' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out, steps, bench = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
results = out / "results.json"
if bench == "none":
    print("bench: no results (it stopped before finishing a batch size; logs/bench.log)")
elif bench in ("complete", "partial"):
    r = json.loads(results.read_text())
    cut = ", PARTIAL: only the batch sizes it finished before it stopped" if bench == "partial" else ""
    print(f"bench on {r['device']} ({r['dtype']}), {r['num_prompts']} prompts x {r['max_new_tokens']} tokens{cut}; tokens/s:")
    for size, batch in sorted(r["batches"].items(), key=lambda kv: int(kv[0])):
        row = ", ".join(f"{n} {m['tokens_per_s']:.1f}" for n, m in batch["methods"].items())
        print(f"  batch {size}: {row}")
    if r.get("skipped"):
        print("  skipped:", "; ".join(r["skipped"]))
log = out / "logs" / "pipeline.log"
if "pipeline" in steps and log.exists():  # stage=all prints its result as JSON last
    text = log.read_text(errors="replace")
    at = text.rfind("\n{\n")
    try:
        harvest = json.JSONDecoder().raw_decode(text[at + 1:])[0].get("harvest", {}) if at >= 0 else {}
    except ValueError:
        harvest = {}
    if harvest.get("records_per_s"):
        print(
            f"harvest: {harvest['records']} records in {harvest['seconds']:.1f} s;"
            f" {harvest['records_per_s']:.1f} records/s over all mixes,"
            f" {harvest['teacher_forced_records_per_s']:.1f} teacher-forced alone"
            f" (all-mix ratio {harvest['all_mix_ratio']:.3f}; generation {harvest['generation_seconds']:.1f} s)"
        )
report = out / "bench_run" / "eval" / "report.json"
if "pipeline" in steps and report.exists():
    auc = json.loads(report.read_text()).get("auc") or {}
    print("pipeline: test AUC", ", ".join(f"{k} {v:.3f}" for k, v in auc.items() if isinstance(v, (int, float))))
draft = out / "draft_eval.json"
if "draft_eval" in steps and draft.exists():
    d = json.loads(draft.read_text())
    keys = ("alpha", "c", "best_gamma", "implied_speedup", "target_step_ms", "draft_step_ms")
    print("draft_eval:", ", ".join(f"{k} {d[k]:.3g}" for k in keys if isinstance(d.get(k), (int, float))))
for name in ("profile", "profile_sd", "profile_eager"):
    profile = out / f"{name}.json"
    if name in steps and profile.exists():
        p = json.loads(profile.read_text())
        print(f"{name}:", ", ".join(f"{k} {v:.3g}" for k, v in p.items() if v is not None))
PY
echo "steps:"
cat "$OUT/steps.tsv"
echo "wall time: $(($(date +%s) - STARTED)) s; folder: $OUT"
if [ "${#FAILED[@]}" -gt 0 ]; then
  echo "failed: ${FAILED[*]}"
  exit 1
fi
