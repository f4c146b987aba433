#!/usr/bin/env bash
# Builds the sdist and the wheel into dist/ and checks them as a user meets them: lightning_gaudi is not on PyPI yet,
# so a Gaudi owner installs this wheel (or `pip install .` from a clone).
#
#   1. `python -m build` (the sdist, then the wheel from the sdist, in an isolated build environment);
#   2. `twine check --strict` on both;
#   3. the wheel ships no `habana_frameworks` (the tests' bridge double) and no `tests/`;
#   4. a fresh virtual environment in a temporary folder with only torch 2.13.0 (constraints-ci.txt) and Lightning,
#      the wheel installed there, then, from outside the repository: `import lightning_gaudi` (the installed copy),
#      `python -m lightning_gaudi.doctor --help`, and the doctor's `device` check on the emulator
#      (LIGHTNING_GAUDI_EMULATE=eager), whose report must say pass.
#
# Usage: scripts/check-dist.sh. PYTHON (default .venv/bin/python, from scripts/setup.sh) runs build and twine (the dev
# extra); the fresh venv is made by python3. Exits non-zero, naming the step, on any failure. Measured: 1 min 34 s on
# 2 shared cores (load average 5), torch from this machine's disk; most of it is the fresh venv's installs and the
# first `import lightning_gaudi` there (torch and Lightning).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
fail() { echo "check-dist.sh: FAILED: $*" >&2; exit 1; }
step() { echo "check-dist.sh: $*" >&2; }

"$PY" -c "import build, twine" 2>/dev/null \
  || fail "$PY has no build or twine: run scripts/setup.sh (the dev extra has both) or set PYTHON"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/check-dist.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

step "building the sdist and the wheel into dist/"
rm -f dist/lightning_gaudi-*
"$PY" -m build --outdir dist . >"$WORK/build.log" 2>&1 || { tail -n 30 "$WORK/build.log" >&2; fail "python -m build"; }
shopt -s nullglob
wheels=(dist/lightning_gaudi-*.whl)
sdists=(dist/lightning_gaudi-*.tar.gz)
shopt -u nullglob
[ ${#wheels[@]} = 1 ] && [ ${#sdists[@]} = 1 ] || fail "expected one wheel and one sdist in dist/, found: $(ls dist)"
WHEEL=${wheels[0]}
SDIST=${sdists[0]}

step "twine check $WHEEL $SDIST"
"$PY" -m twine check --strict "$WHEEL" "$SDIST" || fail "twine check"

step "the wheel's files: no habana_frameworks, no tests/"
"$PY" - "$WHEEL" <<'EOF' || fail "the wheel ships files it must not (above)"
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
bad = [
    name
    for name in names
    if any(part.split(".")[0] == "habana_frameworks" or part == "tests" for part in name.split("/"))
]
for name in bad:
    print(f"check-dist.sh: the wheel ships {name}", file=sys.stderr)
tops = sorted({name.split("/")[0] for name in names})
print(f"check-dist.sh: {len(names)} files, top level: {', '.join(tops)}", file=sys.stderr)
sys.exit(1 if bad or not any(name.startswith("lightning_gaudi/doctor/") for name in names) else 0)
EOF

step "a fresh venv with torch 2.13.0 and Lightning only"
python3 -m venv "$WORK/venv" || fail "python3 -m venv"
VPY=$WORK/venv/bin/python
"$VPY" -m pip install --quiet -c constraints-ci.txt torch==2.13.0 lightning || fail "installing torch and Lightning"
"$VPY" -m pip install --quiet -c constraints-ci.txt "$WHEEL" || fail "installing $WHEEL"

# from outside the repository and without PYTHONPATH, so only the installed copy can be imported
WHEEL_ENV=(env -u PYTHONPATH -u LIGHTNING_GAUDI_DEVICES -u LIGHTNING_GAUDI_DEVICE_NAME)
step "import lightning_gaudi from the installed wheel"
where=$(cd "$WORK" && "${WHEEL_ENV[@]}" "$VPY" -c "import lightning_gaudi; print(lightning_gaudi.__file__)") \
  || fail "python -c 'import lightning_gaudi' in the fresh venv"
case $where in
  "$WORK/venv/"*) ;;
  *) fail "import lightning_gaudi found $where, not the installed wheel" ;;
esac

step "the doctor from the installed wheel: --help, then the device check on the emulator"
(cd "$WORK" && "${WHEEL_ENV[@]}" "$VPY" -m lightning_gaudi.doctor --help >/dev/null) || fail "doctor --help"
(cd "$WORK" && "${WHEEL_ENV[@]}" LIGHTNING_GAUDI_EMULATE=eager "$VPY" -m lightning_gaudi.doctor \
  --out "$WORK/doctor.md" --only device --timeout 300) || fail "python -m lightning_gaudi.doctor --only device"
grep -q "^| device | pass |" "$WORK/doctor.md" || { cat "$WORK/doctor.md" >&2; fail "the doctor's device row"; }
grep -q "$WORK/venv/" "$WORK/doctor.md" || { cat "$WORK/doctor.md" >&2; fail "the doctor ran another copy"; }

step "OK: $WHEEL and $SDIST"
