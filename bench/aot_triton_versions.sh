#!/usr/bin/env bash
# The sm_70 ahead-of-time suite under each Triton that V100 users and CI run (issue 18): 3.5.1 and 3.6.0 (torch
# 2.9-2.11 pin them), and the CI's 3.9.0. One temporary venv per version, built one after the other (the CPU
# is shared), each on top of this interpreter's site-packages (--system-site-packages: torch, pytest and
# catengine's other dependencies as installed here; only Triton differs), removed afterwards.
#
#   bench/aot_triton_versions.sh                        # versions 3.5.1 3.6.0 3.9.0, wheels from PyPI / pip cache
#   WHEELS=/tmp/wheels VERSIONS="3.6.0" bench/aot_triton_versions.sh
#
# WHEELS: a folder of triton wheels (`pip download --no-deps triton==3.6.0 -d DIR`) used before the index.
# TESTS: the suite (default: every module's AOT build, the HMMA.884 block and the CPU tests of the sm_70 kernels,
# -m "not gpu"; test_softmax_sm70.py checks the shuffles each Triton emits for the attention's row statistics).
# A quicker run of the sm_70 builds only: TESTS="tests/kernels/test_aot.py -k sm70 ...".
# Triton 3.5/3.6 bundle a cuobjdump that reads sm_70 cubins, so there `sass_hmma884` is checked in the SASS too.
# Prints one line per version (pass/fail counts) and exits non-zero if any version failed.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSIONS=${VERSIONS:-"3.5.1 3.6.0 3.9.0"}
TESTS=${TESTS:-"tests/kernels/test_aot.py tests/kernels/common/test_mma884.py tests/kernels/w4a16/test_gemm_sm70.py
    tests/kernels/attention/test_softmax_sm70.py tests/kernels/attention/test_paged_sm70.py
    tests/kernels/gdn/test_chunk_sm70.py tests/kernels/moe/test_fused_moe_sm70.py"}
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/aot-triton-XXXXXX")
trap 'rm -rf "$ROOT"' EXIT
summary=()
status=0
for v in $VERSIONS; do
    env_dir="$ROOT/triton-$v"
    "$PY" -m venv --system-site-packages "$env_dir"
    have=$("$env_dir/bin/python" -c "import triton; print(triton.__version__)" 2>/dev/null || echo none)
    if [ "$have" != "$v" ]; then
        # --no-deps: Triton's wheel needs nothing else at run time here; torch stays this interpreter's
        "$env_dir/bin/pip" install -q --no-deps ${WHEELS:+--find-links "$WHEELS"} "triton==$v" || {
            summary+=("triton $v: install failed"); status=1; continue; }
    fi
    got=$("$env_dir/bin/python" -c "import triton; print(triton.__version__)")
    if [ "$got" != "$v" ]; then
        summary+=("triton $v: the venv imports triton $got"); status=1; continue
    fi
    log="$ROOT/pytest-$v.log"
    echo "== triton $v ($("$env_dir/bin/python" -c 'import triton, os; print(os.path.dirname(triton.__file__))'))"
    # no TRITON_INTERPRET: the AOT helpers compile in subprocesses without it anyway; the CPU tests of the
    # same files (contracts, table choice) run in the interpreter, which conftest.py turns on without a GPU
    PYTHONPATH=$PWD "$env_dir/bin/python" -m pytest -q -p no:cacheprovider -m "not gpu" $TESTS 2>&1 | tee "$log" | tail -25
    rc=${PIPESTATUS[0]}
    line=$(grep -E "[0-9]+ (passed|failed)" "$log" | tail -1)
    summary+=("triton $v: rc=$rc ${line:-no summary}")
    [ "$rc" = 0 ] || status=1
    rm -rf "$env_dir"
done
echo   # Triton's nanobind leak report may end without a newline
printf '%s\n' "${summary[@]}"
exit $status
