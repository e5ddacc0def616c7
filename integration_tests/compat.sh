#!/usr/bin/env bash
# The compatibility suite (pytest marker `compat`, integration_tests/test_compat.py) under each
# PySpark version twophase supports, against the servers of .services.env (`make services`).
#
#   integration_tests/compat.sh [VERSION[:format] ...]   default: $COMPAT_PYSPARK (see the Makefile)
#
# VERSION:format runs only the writeStream.format() cases of that version (and the register
# check), leaving its foreachBatch cases out: `make test` runs foreachBatch on 3.5 and format()
# on 4.0, the oldest PySpark of each way of writing. COMPAT_SINKS=core (as `make test` sets it)
# leaves out the sinks beyond files, Kafka and PostgreSQL (pytest marker `allsinks`).
#
# Each version gets a venv of its own, cached in $TWOPHASE_CACHE/compat/pyspark-<version> (with
# the sinks' extras; pyspark-<version>-core without them, for COMPAT_SINKS=core) and rebuilt when
# pyproject.toml changes. It is built the way a user installs twophase next to a
# Spark they already have: PySpark first, then twophase with its dependencies, and the build
# fails if that changed the PySpark version. The suite then runs with this tree first on
# PYTHONPATH. `current` stands for the repository's own .venv (the newest PySpark). Prints one
# line per version with its outcome and time; exits non-zero if any version failed.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"
CACHE=${TWOPHASE_CACHE:-$HOME/.cache/twophase}/compat
PYTHON=${PYTHON:-python3}
# What the sinks beyond files, Kafka and PostgreSQL need beyond twophase's dependencies; a
# COMPAT_SINKS=core run installs none of them, in venvs of its own.
if [[ ${COMPAT_SINKS:-all} == core ]]; then
    EXTRAS="" KIND="-core" MARKS=(-m "not allsinks")
else
    EXTRAS="s3,delta,iceberg,mysql" KIND="" MARKS=()
fi
STAMP_OF=$( (cat pyproject.toml; echo "$EXTRAS") | sha256sum | cut -c1-16)
read -r -a VERSIONS <<<"${*:-${COMPAT_PYSPARK:-}}"
[[ ${#VERSIONS[@]} -gt 0 ]] || { echo "compat.sh: no PySpark version given" >&2; exit 2; }

# venv_for VERSION: the venv's directory, built (or reused) for that PySpark version.
venv_for() {
    local version=$1 venv=$CACHE/pyspark-$1$KIND
    if [[ $version == current ]]; then
        echo "$REPO_ROOT/.venv"
        return
    fi
    if [[ ! -f $venv/.installed-$STAMP_OF ]]; then
        rm -rf "$venv"
        "$PYTHON" -m venv "$venv"
        "$venv/bin/pip" install -q "pyspark==$version" >&2
        "$venv/bin/pip" install -q "$REPO_ROOT${EXTRAS:+[$EXTRAS]}" "pytest>=8" "pytest-timeout>=2.3" >&2
        local kept
        kept=$("$venv/bin/python" -c 'import pyspark; print(pyspark.__version__)')
        if [[ $kept != "$version" ]]; then
            echo "compat.sh: installing twophase replaced PySpark $version with $kept" >&2
            return 1
        fi
        touch "$venv/.installed-$STAMP_OF"
    fi
    echo "$venv"
}

if [[ -f .services.env ]]; then
    set -a
    # shellcheck source=/dev/null
    . ./.services.env
    set +a
fi
# run_version ITEM: ITEM's venv built and its suite run; the last line of the output is ITEM's
# summary line; exits non-zero when either failed.
run_version() {
    local item=$1 version=${1%%:*} venv started rc=0 spark
    local select=("${MARKS[@]}")
    [[ $item == *:format ]] && select+=(-k "not foreachBatch")
    venv=$(venv_for "$version") || { echo "$version: venv not built"; return 1; }
    started=$SECONDS
    PYSPARK_PYTHON=$venv/bin/python PYTHONPATH=$REPO_ROOT \
        "$venv/bin/pytest" -p no:cacheprovider "${select[@]}" integration_tests/test_compat.py \
        tests/test_spark_versions.py || rc=$?
    spark=$("$venv/bin/python" -c 'import pyspark; print(pyspark.__version__)')
    echo "PySpark $spark: $([[ $rc == 0 ]] && echo passed || echo "FAILED ($rc)") in $((SECONDS - started)) s"
    return "$rc"
}

failed=0
summary=()
if [[ ${COMPAT_PARALLEL:-0} == 1 ]]; then
    # Side by side (`make test`: a Spark start leaves a core idle much of the time), each
    # version's output shown whole once all are done.
    logs=() pids=()
    for item in "${VERSIONS[@]}"; do
        logs+=("$(mktemp)")
        run_version "$item" >"${logs[-1]}" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || failed=1
        cat "${logs[$i]}"
        summary+=("$(tail -n 1 "${logs[$i]}")")
        rm -f "${logs[$i]}"
    done
else
    for item in "${VERSIONS[@]}"; do
        out=$(mktemp)
        run_version "$item" | tee "$out" || failed=1
        summary+=("$(tail -n 1 "$out")")
        rm -f "$out"
    done
fi
printf '%s\n' "${summary[@]}"
exit $failed
