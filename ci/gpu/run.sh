#!/usr/bin/env bash
# The lent H200 (vLLM 0.26.0 from ../shared/tools/gpu-stack): one PART per device command.
#
#   bash ci/gpu/run.sh PART [PART...]      logs under $OUT/<part>/ (default ./reports)
#
# Needs the gpu-stack installed on the machine first (three commands, ci/gpu/README.md). Each PART stays
# under 9 minutes (its own `timeout`); several PARTs in one command share a 570 s budget (COMMAND_BUDGET):
# a part gets what is left, one that cannot start is listed in $OUT/not-run.txt for the next command.
#
# PARTs:
#   matrix          the GPU verification in one command, jobs at once (MATRIX_JOBS, default "core kit cublas"; also
#                   "equivalence", "compiles" (ci/gpu/equivalence.py --compiles: two compilations of one model
#                   compared) and "mainjobs" (the part below, beside the others)):
#                   pytest tests/core (every variant the driver offers: v1-eager, v1-graphs, v2-eager, v2-graphs;
#                   each variant's engines in their processes, the variants concurrently, tests/core/conftest.py;
#                   vLLM-Omni's Qwen3-TTS classes per variant, tests/core/test_qwen3_tts.py), the conformance kit
#                   (both tiers), the cublas-probe below; "equivalence" adds ci/gpu/equivalence.py (where omni and
#                   stock first differ); prints the wall time per job. The two-runs-one-seed CLI test is left to
#                   `mainjobs` (five runs)
#   qwen3           tests/core/test_qwen3_tts.py only: vLLM-Omni's Qwen3-TTS classes per variant (OMNI_TEST_VARIANTS
#                   narrows them, e.g. v1-eager,v2-eager); needs .whl/ with the vllm-omni wheel and the modules it
#                   imports that the stack lacks (2026-12-02: soundfile, then prettytable were missing)
#   qwen3-size      vLLM-Omni's Qwen3-TTS at the released 1.7B and 0.6B shapes (random bf16 weights written under /tmp
#                   on the GPU, core.models.qwen3_tts.checkpoint_writer) through the core, bench/bench_qwen3_tts.py on cuda
#                   bf16, V2 then V1, concurrency 1/8/64, unseeded then per-request seeds (QWEN3_REQUEST_SEEDS):
#                   RTF + time to first audio at 1, audio-s/s at 8 and 64, engine starts; 1.7B first; a run that
#                   cannot start in time is listed, not started. Needs .whl/ as `qwen3` does
#   cold-starts     `omni-backends serve --model` 1.7B started COLD_STARTS times (default 5), each on a fresh compile
#                   cache, one seeded request each: up / speech / exit / device-side asserts per start (issue 44 item 4)
#   serve-qwen3     `omni-backends serve --model DIR` on released-layout CustomVoice checkpoints (random bf16 weights at
#                   the 1.7B / 0.6B shapes, SERVE_SIZES, default "1.7b 0.6b"; written under /tmp once per machine),
#                   bench/bench_serve.py --model over HTTP at concurrency 1/8/64, SERVE_FRAMES frames (default 96):
#                   TTFA, RTF, audio-s/s, p50/p99, beside the same stage graph driven in-process (no HTTP), ratios
#   serving-qwen3   pytest --device cuda tests/serving/test_serve_qwen3_tts.py (tiny released-layout checkpoints served
#                   over HTTP: codes vs vLLM-Omni's classes, streaming, 16 concurrent, disconnect, 400s, run --model)
#   mainjobs        five `omni-backends run --device cuda` back to back (vLLM's defaults), one seed: every exit
#                   status, wall and engine-start times, and whether every out.wav is byte-identical
#   cublas-probe    the talker engine started cold then warm (ci/gpu/talker_start.py) under several settings
#                   (CUBLAS_PROBE_SPECS, list below) -- which reproduce the warm-start cublasCreate failure of
#                   issue 21 (round 1, 2026-12-02: after a thinker and alone with vLLM's defaults both fail warm)
#   core-v2-graphs  pytest --device cuda tests/core, variant v2-graphs (vLLM's defaults: V2, compile + CUDA graphs,
#                   async scheduling, multiprocess): thinker vs stock vLLM, hidden states vs PyTorch, talker+code2wav
#   core-v1-graphs  the same on V1 (VLLM_USE_V2_MODEL_RUNNER=0)
#   core-eager      the same, v1-eager and v2-eager
#   core-rest       the tests without a variant: payload lifecycle, `omni-backends run` twice (same seed ->
#                   identical out.wav), bad input; the repository's device-tier tests outside tests/core
#                   (copy ordering, probe without init, reference sampler, StaticGraph); then the conformance kit,
#                   both tiers
#   pipeline        `omni-backends run` V2/V1 x graphs/--enforce-eager (+ a repeat): codes graph == eager,
#                   out.wav bytes equal for the same seed, talker-MTP graph replays, start time + peak memory
#   bench-v2        decode tok/s omni vs stock vLLM (bf16, graphs, batch 1/8/64, V2) + talker MTP graph vs eager
#   bench-v1        the decode part on V1
#   bench-serve     bench/bench_serve.py --device cuda: `omni-backends serve` under load (streamed speech requests at
#                   concurrency 1/8/32: TTFA, RTF, underruns, audio-s/s) vs the same requests through one-shot `run`
#   bench-pipeline  bench/bench_pipeline.py --device cuda: the stage graph (engines started at once) vs the serial
#                   pipeline, per-stage start, generation and wall
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT="${OUT:-$ROOT/reports}"
mkdir -p "$OUT"
LIMIT="${PART_TIMEOUT:-530}"   # seconds per part at most
BUDGET="${COMMAND_BUDGET:-570}" # seconds for the whole command (the device allows 600): later parts get what is left
START=$SECONDS
left() {  # seconds a part may take now: min(LIMIT, what the command has left)
  local rest=$(( BUDGET - (SECONDS - START) ))
  (( rest < LIMIT )) && echo "$rest" || echo "$LIMIT"
}

if [ ! -f /tmp/gpu-site/env.sh ]; then
  echo "gpu-stack is not installed on this machine: carry .gpu-stack/p0, p1, p2 first (ci/gpu/README.md)" >&2
  exit 3
fi
. /tmp/gpu-site/env.sh
bash /tmp/gpu-site/install-project.sh || { echo "installing the project into /tmp/gpu-project failed" >&2; exit 3; }
# vLLM-Omni's own model classes (tests/core/test_qwen3_tts.py, the loader tests): the wheel carried as .whl/
# (and the pure-Python / self-contained wheels its modules import that the stack lacks: soundfile, einops, pillow;
# appended to PYTHONPATH, so the stack's own copies win where it has them)
if [ ! -d /tmp/omni-site/vllm_omni ] && ls "$ROOT"/.whl/vllm_omni-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/omni-site "$ROOT"/.whl/*.whl || echo "vllm-omni wheels did not install" >&2
fi
[ -d /tmp/omni-site/vllm_omni ] && export PYTHONPATH="$PYTHONPATH:/tmp/omni-site"
export OMNI_BACKENDS_DEVICE=cuda
export BENCH_RESULTS_DIR="${BENCH_RESULTS_DIR:-$OUT/bench-results}"  # each bench's JSON record (bench/record.py)
unset OMNI_BACKENDS_SELECTION

header() {  # machine, versions, date: the first lines of every log
  echo "# $1 -- $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  nvidia-smi -L 2>/dev/null | head -2
  python3 -c "import torch, vllm; print('torch', torch.__version__, '| vllm', vllm.__version__)" 2>&1 | tail -1
  python3 -m omni_backends.cli devices 2>&1 | grep -E "^  cuda|would select" | head -3
  echo "git: $(cat "$ROOT/.git-head" 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo
}

pytest_part() {  # name, then pytest arguments
  local name=$1; shift
  local d="$OUT/$name"; mkdir -p "$d"
  { header "$name"; echo "+ pytest $*"; } > "$d/log.txt"
  timeout "$(left)" python3 -m pytest -p no:cacheprovider --device cuda -rs -v --durations=15 \
      --junitxml="$d/junit.xml" "$@" >> "$d/log.txt" 2>&1
  local rc=$?
  echo "rc=$rc" >> "$d/log.txt"
  tail -25 "$d/log.txt"
  return $rc
}

part_core() {  # variant selector (CORE_K, when set, replaces it: a narrower re-run by hand)
  pytest_part "core-$1" tests/core -k "${CORE_K:-$2}"
}

part_core_rest() {
  pytest_part core-rest tests/core tests/test_copy_ordering.py tests/test_probe_no_init.py tests/test_reference_sampler.py \
      tests/test_static_graph.py -k "not v1- and not v2-"
  local rc=$?
  local d="$OUT/kit"; mkdir -p "$d"
  { header kit; } > "$d/log.txt"
  timeout "$(left)" python3 -m pytest -p no:cacheprovider --pyargs omni_backends.testing.suite --device cuda -rs -q \
      --omni-report "$d/kit-cuda-h200.json" >> "$d/log.txt" 2>&1
  local krc=$?
  echo "rc=$krc" >> "$d/log.txt"; tail -8 "$d/log.txt"
  [ $rc -eq 0 ] && [ $krc -eq 0 ]
}

part_cold_starts() {  # COLD_STARTS (default 5), COLD_SIZE (default 1.7b): `serve --model` started N times, each on a fresh
  # compile cache (vLLM's, Inductor's and Triton's under /tmp/cold-N), one seeded request, then SIGTERM (issue 44 item 4)
  local d="$OUT/cold-starts"; mkdir -p "$d"
  header cold-starts >> "$d/log.txt"
  local ckpt i t0 rc code port=8123; ckpt=$(qwen3_checkpoint "${COLD_SIZE:-1.7b}" "$d/log.txt") || return 1
  for i in $(seq 1 "${COLD_STARTS:-5}"); do
    if (( $(left) < 120 )); then echo "start $i: not started (time)" | tee -a "$d/log.txt" "$OUT/not-run.txt"; continue; fi
    t0=$SECONDS; rm -rf "/tmp/cold-$i"; mkdir -p "/tmp/cold-$i"
    VLLM_CACHE_ROOT="/tmp/cold-$i/vllm" TORCHINDUCTOR_CACHE_DIR="/tmp/cold-$i/inductor" TRITON_CACHE_DIR="/tmp/cold-$i/triton" \
      python3 -m omni_backends.cli serve --model "$ckpt" --port "$port" > "$d/start$i.txt" 2>&1 &
    local pid=$! up=0
    while kill -0 "$pid" 2>/dev/null && (( SECONDS - t0 < $(left) - 20 )); do
      curl -sf "localhost:$port/health" > /dev/null && { up=1; break; }; sleep 2
    done
    code=000
    [ $up -eq 1 ] && code=$(curl -s -o "$d/start$i.wav" -w '%{http_code}' "localhost:$port/v1/audio/speech" \
        -H 'Content-Type: application/json' -d '{"input": "Hello there.", "voice": "vivian", "seed": 1}')
    kill -TERM "$pid" 2>/dev/null; wait "$pid"; rc=$?
    echo "start $i: up=$up in $((SECONDS - t0)) s, speech=$code, exit=$rc, asserts=$(grep -c 'device-side assert\|index out of bounds' "$d/start$i.txt")" | tee -a "$d/log.txt"
  done
  ! grep -qE "up=0|speech=[^2]|asserts=[1-9]" "$d/log.txt"
}

part_matrix() {  # MATRIX_JOBS: which jobs run at once (default: core kit cublas; also: equivalence)
  local d="$OUT/matrix"; mkdir -p "$d/scenarios"
  header matrix > "$d/log.txt"
  local budget; budget=$(left)
  local t0=$SECONDS jobs="${MATRIX_JOBS:-core kit cublas}" pids=() j
  for j in $jobs; do
    case $j in
      core) ( OMNI_TEST_LOG_DIR="$d/scenarios" timeout "$budget" python3 -m pytest -p no:cacheprovider --device cuda -rs -v \
          --durations=25 --junitxml="$d/core-junit.xml" tests/core \
          --deselect tests/core/test_pipeline.py::test_same_seed_gives_identical_wav_bytes > "$d/core.txt" 2>&1; echo "rc=$? wall=$((SECONDS - t0)) s" >> "$d/core.txt" ) & ;;
      kit) ( timeout "$budget" python3 -m pytest -p no:cacheprovider --pyargs omni_backends.testing.suite --device cuda -rs -q \
          --omni-report "$d/kit-cuda-h200.json" > "$d/kit.txt" 2>&1; echo "rc=$? wall=$((SECONDS - t0)) s" >> "$d/kit.txt" ) & ;;
      equivalence) ( timeout "$budget" python3 ci/gpu/equivalence.py "$d/eqdemo" "$d/equivalence.json" --device cuda --multiprocess \
          > "$d/equivalence.txt" 2>&1; echo "rc=$? wall=$((SECONDS - t0)) s" >> "$d/equivalence.txt" ) & ;;
      cublas) ( part_cublas_probe > "$d/cublas.txt" 2>&1; echo "rc=$? wall=$((SECONDS - t0)) s" >> "$d/cublas.txt" ) & ;;
      mainjobs) ( part_mainjobs > "$d/mainjobs.txt" 2>&1; echo "rc=$? wall=$((SECONDS - t0)) s" >> "$d/mainjobs.txt" ) & ;;
      compiles) ( timeout "$budget" python3 ci/gpu/equivalence.py "$d/eqdemo" "$d/compiles.json" --device cuda \
          --compiles /tmp/compiles-cache > "$d/compiles.txt" 2>&1; echo "rc=$? wall=$((SECONDS - t0)) s" >> "$d/compiles.txt" ) & ;;
      *) echo "unknown matrix job $j" >&2; continue ;;
    esac
    pids+=($!)
  done
  wait "${pids[@]}"
  {
    echo "| job | result | wall |"; echo "|---|---|---|"
    for j in $jobs; do
      echo "| $j | $(grep -E '(passed|failed|error|rc=)' "$d/$j.txt" | grep -v '^rc=' | tail -1 | tr -d '=' | xargs) $(tail -1 "$d/$j.txt" | cut -d' ' -f1) | $(tail -1 "$d/$j.txt" | sed 's/.*wall=//') |"
    done
    echo; echo "scenario processes (tests/core):"; grep -h "^scenario " "$d"/scenarios/*.log 2>/dev/null
  } | tee -a "$d/log.txt"
  grep -E "^(FAILED|ERROR)|^SKIPPED" "$d/core.txt" 2>/dev/null | head -60 | tee -a "$d/log.txt"
  [ -f "$d/equivalence.json" ] && python3 - "$d/equivalence.json" <<'PY' 2>/dev/null | tee -a "$d/log.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print("equivalence:", json.dumps({k: r.get(k) for k in ("first_difference", "inproc_max_logprob_diff", "multiprocess", "env")}))
PY
  [ -f "$d/compiles.json" ] && python3 - "$d/compiles.json" <<'PY' 2>/dev/null | tee -a "$d/log.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print("compiles:", json.dumps({"max_logprob_diff": r.get("max_logprob_diff"),
                               "starts": {k: v.get("start_s", v.get("error")) for k, v in r["engines"].items()}}))
PY
  grep -q "^rc=0" "$d/core.txt" && grep -q "^rc=0" "$d/kit.txt"
}

part_qwen3() {  # vLLM-Omni's Qwen3-TTS classes only, the variants in OMNI_TEST_VARIANTS (default: all the driver offers)
  local d="$OUT/qwen3"; mkdir -p "$d/scenarios"
  header qwen3 > "$d/log.txt"
  OMNI_TEST_LOG_DIR="$d/scenarios" timeout "$(left)" python3 -m pytest -p no:cacheprovider --device cuda -rs -v \
      tests/core/test_qwen3_tts.py >> "$d/log.txt" 2>&1
  local rc=$?; echo "rc=$rc" >> "$d/log.txt"; tail -15 "$d/log.txt"; return $rc
}

qwen3_checkpoint() {  # SIZE LOG: echo the released-layout CustomVoice checkpoint of SIZE under /tmp, written once per
  # machine (random bf16 weights drawn on the device, core.models.qwen3_tts.checkpoint_writer); status 1 when it could
  # not be written (time or failure, said in LOG)
  local size=$1 log=$2 rc t0
  local ckpt; ckpt="/tmp/Qwen3-TTS-12Hz-$(echo "$size" | tr a-z A-Z)-CustomVoice"
  if [ ! -f "$ckpt/config.json" ]; then
    if (( $(left) < 150 )); then echo "$size: checkpoint not written (time)" | tee -a "$log" "$OUT/not-run.txt" >&2; return 1; fi
    t0=$SECONDS
    timeout 150 python3 -c "import sys; from core.models.qwen3_tts.checkpoint_writer import write_qwen3_tts as w; from omni_backends.registry import select; w(sys.argv[1], sys.argv[2], backend=select('cuda').backend, progress=print)" \
        "$ckpt" "$size" >> "$log" 2>&1
    rc=$?; echo "$size: checkpoint rc=$rc $((SECONDS - t0)) s ($(du -sh "$ckpt" 2>/dev/null | cut -f1))" | tee -a "$log" >&2
    [ $rc -ne 0 ] && return 1
  fi
  echo "$ckpt"
}

part_qwen3_size() {  # QWEN3_SIZES (default "1.7b 0.6b"), QWEN3_RUNNERS (default "v2 v1"), QWEN3_REQUEST_SEEDS
  # (default "none,per-request"), QWEN3_BENCH_ARGS (e.g. --model-inner-compile), QWEN3_TAG (the log folder becomes
  # qwen3-size-$QWEN3_TAG, so two settings can run in one command)
  local d="$OUT/qwen3-size${QWEN3_TAG:+-$QWEN3_TAG}"; mkdir -p "$d"
  header qwen3-size > "$d/log.txt"
  local size runner rc t0
  for size in ${QWEN3_SIZES:-1.7b 0.6b}; do
    local ckpt; ckpt=$(qwen3_checkpoint "$size" "$d/log.txt") || continue
    for runner in ${QWEN3_RUNNERS:-v2 v1}; do
      if (( $(left) < 150 )); then echo "$size $runner: not started (time)" | tee -a "$d/log.txt" "$OUT/not-run.txt"; continue; fi
      t0=$SECONDS
      # shellcheck disable=SC2086
      timeout "$(( $(left) < 300 ? $(left) : 300 ))" python3 bench/bench_qwen3_tts.py --device cuda --dtype bfloat16 \
          --size "$size" --model-dir "$ckpt" --runner "$runner" --concurrency 1,8,64 --reps 3 --frames 96 \
          --request-seeds "${QWEN3_REQUEST_SEEDS:-none,per-request}" \
          --chunk-frames 25 --first-chunk-frames 1 --left-context 25 ${QWEN3_BENCH_ARGS:-} --out "$d/$size-$runner" \
          > "$d/$size-$runner.txt" 2>&1
      rc=$?; echo "$size $runner: rc=$rc $((SECONDS - t0)) s" | tee -a "$d/log.txt"
      grep -E "^\||^engine start|^Qwen3-TTS" "$d/$size-$runner.txt" | tee -a "$d/log.txt"
      [ $rc -ne 0 ] && tail -15 "$d/$size-$runner.txt" | tee -a "$d/log.txt"
    done
  done
  ! grep -qE "rc=[1-9]" "$d/log.txt"
}

part_serve_qwen3() {  # SERVE_SIZES (default "1.7b 0.6b"), SERVE_FRAMES (default 96), SERVE_ARGS (more bench_serve.py args)
  local d="$OUT/serve-qwen3"; mkdir -p "$d"
  header serve-qwen3 >> "$d/log.txt"
  local size ckpt rc t0
  for size in ${SERVE_SIZES:-1.7b 0.6b}; do
    ckpt=$(qwen3_checkpoint "$size" "$d/log.txt") || continue
    if (( $(left) < 200 )); then echo "$size: serve not started (time)" | tee -a "$d/log.txt" "$OUT/not-run.txt"; continue; fi
    t0=$SECONDS
    # shellcheck disable=SC2086
    VLLM_OMNI_QWEN3_CODE2WAV_CUDAGRAPH_STATS=1 VLLM_OMNI_QWEN3_CODE2WAV_CUDAGRAPH_STATS_FILE="$d/$size-code2wav-graph-stats.txt" \
    timeout "$(( $(left) - 10 ))" python3 bench/bench_serve.py --model "$ckpt" --device cuda --concurrency 1 8 64 \
        --frames "${SERVE_FRAMES:-96}" ${SERVE_ARGS:-} --json "$d/$size.json" > "$d/$size.txt" 2>&1
    rc=$?; echo "$size serve: rc=$rc $((SECONDS - t0)) s" | tee -a "$d/log.txt"
    grep -E "^\|" "$d/$size.txt" | tee -a "$d/log.txt"
    [ $rc -ne 0 ] && tail -30 "$d/$size.txt" | tee -a "$d/log.txt"
  done
  ! grep -qE "rc=[1-9]" "$d/log.txt"
}

part_mainjobs() {
  local d="$OUT/mainjobs"; mkdir -p "$d"
  header mainjobs > "$d/log.txt"
  python3 -m omni_backends.cli demo-model create "$d/demo" >> "$d/log.txt" 2>&1
  local ok=0
  for i in 1 2 3 4 5; do
    if (( $(left) < 100 )); then echo "run $i: not started (time)" | tee -a "$d/log.txt"; continue; fi
    nvidia-smi --query-gpu=memory.used --format=csv,noheader > "$d/smi-$i.txt" 2>&1
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >> "$d/smi-$i.txt" 2>&1
    local t0=$SECONDS
    timeout "$(( $(left) < 300 ? $(left) : 300 ))" python3 -m omni_backends.cli run --device cuda --model-dir "$d/demo" \
        --out "$d/run$i" --seed 5 --max-tokens 8 --prompt "Hello omni" --voice 2 --json > "$d/run$i.json" 2> "$d/run$i.stderr"
    local rc=$?
    local starts; starts=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stages']; print(' / '.join(str(round(s[k]['engine_start_seconds'])) for k in ('thinker','talker','code2wav')))" "$d/run$i.json" 2>/dev/null)
    echo "run $i: rc=$rc wall=$((SECONDS - t0)) s engine starts ${starts:-?} s; device before: $(head -1 "$d/smi-$i.txt") ($(( $(wc -l < "$d/smi-$i.txt") - 1 )) compute processes)" | tee -a "$d/log.txt"
    [ $rc -eq 0 ] && ok=$((ok + 1))
    [ $rc -ne 0 ] && tail -5 "$d/run$i.stderr" | tee -a "$d/log.txt"
  done
  local sums; sums=$(sha256sum "$d"/run*/out.wav 2>/dev/null | awk '{print $1}' | sort | uniq -c)
  echo "exit 0: $ok of 5; out.wav sha256 (count digest): $sums" | tee -a "$d/log.txt"
  [ $ok -eq 5 ] && [ "$(echo "$sums" | wc -l)" -eq 1 ]
}

# One probe per line: CACHE|LABEL|ENV SETTINGS|talker_start.py ARGS|STARTS ("cold warm", or "warm" reusing CACHE's
# compile cache from an earlier line). CUBLAS_PROBE_SPECS replaces the list (round 2 of issue 21: cuBLAS's own log,
# in-process, a cuBLAS handle made before the engine, no AOT compile).
CUBLAS_PROBE_SPECS_DEFAULT="defaults|defaults|||cold
defaults|cublas-log|CUBLAS_LOGINFO_DBG=1 CUBLAS_LOGDEST_DBG=stderr||warm
defaults|inproc-preinit|VLLM_ENABLE_V1_MULTIPROCESSING=0|--preinit-cublas|warm
defaults|inproc|VLLM_ENABLE_V1_MULTIPROCESSING=0||warm
no-aot|no-aot|VLLM_USE_AOT_COMPILE=0||cold warm"

part_cublas_probe() {
  local d="$OUT/cublas-probe"; mkdir -p "$d"
  header cublas-probe > "$d/log.txt"
  python3 -m omni_backends.cli demo-model create "$d/demo" >> "$d/log.txt" 2>&1
  local cache label setting args starts start
  while IFS='|' read -r cache label setting args starts; do
    [ -z "$cache" ] && continue
    for start in $starts; do
      if (( $(left) < 60 )); then echo "$label $start: not started (time)" | tee -a "$d/log.txt"; continue; fi
      local t0=$SECONDS
      # shellcheck disable=SC2086
      env VLLM_CACHE_ROOT="/tmp/cublas-probe-cache/$cache" $setting timeout 200 python3 ci/gpu/talker_start.py "$d/demo" $args \
          > "$d/$label-$start.txt" 2>&1
      local rc=$?
      echo "$label ($setting $args) $start: rc=$rc $((SECONDS - t0)) s $(grep -o 'CUBLAS_STATUS_[A-Z_]*' "$d/$label-$start.txt" | head -1)" | tee -a "$d/log.txt"
    done
  done <<< "${CUBLAS_PROBE_SPECS:-$CUBLAS_PROBE_SPECS_DEFAULT}"
}

part_pipeline() {
  local d="$OUT/pipeline"; mkdir -p "$d"
  header pipeline > "$d/log.txt"
  python3 -m omni_backends.cli demo-model create "$d/demo" >> "$d/log.txt" 2>&1
  local t0=$SECONDS
  for spec in "v2-graphs:--runner v2" "v2-graphs-again:--runner v2" "v2-eager:--runner v2 --enforce-eager" \
              "v1-graphs:--runner v1" "v1-eager:--runner v1 --enforce-eager"; do
    local name=${spec%%:*} args=${spec#*:}
    if (( SECONDS - t0 > LIMIT - 90 || $(left) < 90 )); then echo "skipped $name: time limit" | tee -a "$d/log.txt"; continue; fi
    echo "+ omni-backends run --device cuda $args ($(date -u +%H:%M:%S))" >> "$d/log.txt"
    # shellcheck disable=SC2086
    timeout "$(( $(left) < 240 ? $(left) : 240 ))" python3 -m omni_backends.cli run --device cuda --model-dir "$d/demo" --out "$d/$name" --seed 5 \
        --max-tokens 8 --prompt "Hello omni" --voice 2 --json $args > "$d/$name.json" 2> "$d/$name.stderr"
    echo "rc=$? ($(( SECONDS - t0 )) s so far)" >> "$d/log.txt"
    tail -3 "$d/$name.stderr" >> "$d/log.txt"
  done
  python3 ci/gpu/compare_pipeline.py "$d" 2>&1 | tee -a "$d/log.txt"
}

part_bench() {  # v1 | v2
  local d="$OUT/bench-$1"; mkdir -p "$d"
  header "bench-$1" > "$d/log.txt"
  local v2=0; [ "$1" = v2 ] && v2=1
  VLLM_USE_V2_MODEL_RUNNER=$v2 timeout "$(( $(left) - 60 ))" python3 bench/bench_core_runner.py --device cuda \
      --dtype bfloat16 --batches 1,8,64 --rounds 5 --max-tokens 64 --reps 21 --iters 1000 --profile --sync-debug --out "$d" \
      >> "$d/log.txt" 2>&1
  echo "rc=$?" >> "$d/log.txt"
  if [ "$1" = v2 ]; then
    timeout 60 python3 bench/bench_talker_mtp.py --device cuda --batches 1,8,64 --out "$d" >> "$d/log.txt" 2>&1
    echo "mtp rc=$?" >> "$d/log.txt"
  fi
  grep -E "^\|" "$d/log.txt" | head -40
}

part_bench_serve() {
  local d="$OUT/bench-serve"; mkdir -p "$d"
  header bench-serve > "$d/log.txt"
  timeout "$(( $(left) - 30 ))" python3 bench/bench_serve.py --device cuda --concurrency 1 8 32 --run-baseline 1 \
      --json "$d/bench_serve.json" >> "$d/log.txt" 2>&1
  local rc=$?; echo "rc=$rc" >> "$d/log.txt"; grep -E "^\|" "$d/log.txt" | head -20; return $rc
}

part_bench_pipeline() {
  local d="$OUT/bench-pipeline"; mkdir -p "$d"
  header bench-pipeline > "$d/log.txt"
  timeout "$(( $(left) - 30 ))" python3 bench/bench_pipeline.py --device cuda --rounds 1 >> "$d/log.txt" 2>&1
  local rc=$?; echo "rc=$rc" >> "$d/log.txt"; grep -E "^\||^\{" "$d/log.txt" | head -20; return $rc
}

status=0
for part in "$@"; do
  if (( $(left) < 120 )); then
    echo "not started: $part (the command has $(left) s left; run it in the next command)" | tee -a "$OUT/not-run.txt"
    status=1; continue
  fi
  case "$part" in
    matrix) part_matrix ;;
    mainjobs) part_mainjobs ;;
    serve-qwen3) part_serve_qwen3 ;;
    cold-starts) part_cold_starts ;;
    serving-qwen3) OMNI_TEST_LOG_DIR="$OUT/serving-qwen3/scenarios" pytest_part serving-qwen3 tests/serving/test_serve_qwen3_tts.py ;;
    cublas-probe) part_cublas_probe ;;
    qwen3) part_qwen3 ;;
    qwen3-size) part_qwen3_size ;;
    core-v2-graphs) part_core v2-graphs "v2-graphs" ;;
    core-v1-graphs) part_core v1-graphs "v1-graphs" ;;
    core-eager) part_core eager "v1-eager or v2-eager" ;;
    core-rest) part_core_rest ;;
    pipeline) part_pipeline ;;
    bench-v2) part_bench v2 ;;
    bench-v1) part_bench v1 ;;
    bench-serve) part_bench_serve ;;
    bench-pipeline) part_bench_pipeline ;;
    *) echo "unknown part $part (see the header of ci/gpu/run.sh)" >&2; exit 2 ;;
  esac || status=1
done
exit $status
