#!/usr/bin/env bash
# One entry point that sets everything up on a fresh machine, then runs a job.
#   ./run.sh experiment [ARGS]   reproduce a published experiment (figure + table in results/)
#   ./run.sh test [--slow]       run the test suite (--slow adds the long accuracy runs; 2 processes)
#   ./run.sh bench NAME          run benchmarks/NAME.py
#   ./run.sh pgpgm ARGS          any pgpgm CLI command
# Interpreter: $PGPGM_PYTHON, an active conda env with Python >= 3.12, a python3.1x on PATH,
# or a pyenv-installed CPython >= 3.12. The environment lives in .venv (or the conda env).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

ok_python() {  # prints the path of a working Python >= 3.12, or fails
  "$1" -c 'import sys; assert sys.version_info >= (3, 12); print(sys.executable)' 2>/dev/null
}

find_python() {
  local c
  if [ -n "${PGPGM_PYTHON:-}" ]; then
    ok_python "$PGPGM_PYTHON" && return 0
    echo "PGPGM_PYTHON=$PGPGM_PYTHON is not a working Python >= 3.12" >&2; return 1
  fi
  for c in python3.13 python3.12 python3 python; do
    command -v "$c" >/dev/null 2>&1 && ok_python "$c" && return 0
  done
  for c in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -rV); do
    ok_python "$c" && return 0
  done
  return 1
}

setup() {
  local py stamp
  if [ -n "${CONDA_PREFIX:-}" ] && ok_python "$CONDA_PREFIX/bin/python" >/dev/null; then
    PY="$CONDA_PREFIX/bin/python"      # use the active conda env (e.g. from environment.yml)
  else
    if ! py="$(find_python)"; then
      cat >&2 <<'MSG'
run.sh: no Python >= 3.12 found (tried $PGPGM_PYTHON, python3.13, python3.12, python3, python,
and ~/.pyenv/versions/3.12+). Install one (e.g. `pyenv install 3.12`, or
`conda env create -f environment.yml && conda activate pgpgm`) and run this again,
or point PGPGM_PYTHON at it.
MSG
      exit 1
    fi
    if [ ! -x .venv/bin/python ] || ! ok_python .venv/bin/python >/dev/null; then
      echo "run.sh: creating .venv with $py" >&2
      rm -rf .venv
      "$py" -m venv .venv
    fi
    PY="$here/.venv/bin/python"
  fi
  stamp="$(sha256sum pyproject.toml | cut -c1-16)"
  if [ "$(cat "$(dirname "$PY")/../.pgpgm-installed" 2>/dev/null)" != "$stamp" ]; then
    echo "run.sh: installing pgpgm and its dependencies into $(dirname "$(dirname "$PY")")" >&2
    "$PY" -m pip install -q --upgrade pip >&2
    "$PY" -m pip install -q -e ".[dev]" >&2
    echo "$stamp" > "$(dirname "$PY")/../.pgpgm-installed"
  fi
}

cmd="${1:-}"; shift || true
case "$cmd" in
  experiment)
    setup
    if [ $# -eq 0 ]; then set -- fitzhugh-nagumo --case R-observed --out results/fitzhugh-nagumo; fi
    exec "$PY" -m pgpgm.cli run "$@" ;;
  test)
    setup
    marker="not slow"
    if [ "${1:-}" = "--slow" ]; then marker=""; shift; fi
    # two worker processes, a test file each at a time (its module fixtures built once): most tests keep
    # one core busy, so two halve the suite's time on a 2-core machine; PGPGM_TEST_WORKERS=0 runs serially
    workers="${PGPGM_TEST_WORKERS:-2}"
    exec "$PY" -m pytest -m "$marker" -q --durations=20 -n "$workers" --dist loadfile "$@" ;;
  bench)
    setup
    name="${1:?usage: ./run.sh bench NAME}"; shift
    exec "$PY" "benchmarks/$name.py" "$@" ;;
  pgpgm)
    setup
    exec "$PY" -m pgpgm.cli "$@" ;;
  *)
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
