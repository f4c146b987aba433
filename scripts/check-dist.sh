#!/usr/bin/env bash
# Builds the sdist and the wheel into dist/ and checks them as a user meets them: lightning_gaudi is not on PyPI yet,
# so a Gaudi owner installs this wheel (or `pip install .` from a clone).
#
#   1. `python -m build` (the sdist, then the wheel from the sdist, in an isolated build environment);
#   2. `twine check --strict` on both;
#   3. the wheel ships no `habana_frameworks` (the tests' bridge double) and no `tests/`;
#   4. a fresh virtual environment in a temporary folder with only torch 2.13.0 (constraints-ci.txt) and Lightning,
#      the wheel installed there, then, from outside the repository: `import lightning_gaudi` (the installed copy),
#      `python -m lightning_gaudi.doctor --help`, and the doctor on 2 emulated cards (LIGHTNING_GAUDI_EMULATE=eager):
#      every in-process check, the all-reduce and the one-card fit (the multi-card fits: docs/compat.md, measured),
#      whose report must come from the installed copy, have exactly those rows, each pass or skipped (HPU graphs
#      skipped: the emulator has none), the device row "2 x GAUDI2" and the lazy-mode throughput in samples/s.
#      (It was tests/test_doctor.py's test_the_installed_wheel_reports_without_the_repository.)
#
# Usage: scripts/check-dist.sh. PYTHON (default .venv/bin/python, from scripts/setup.sh) runs build and twine (the dev
# extra); the fresh venv is made by python3. Exits non-zero, naming the step, on any failure. Measured: 113 CPU-seconds,
# 9 min 2 s on 2 cores shared with a load average of 8 to 10 (the whole script with the device check alone: 1 min 34 s at
# load average 5), torch from this machine's disk; most of it is the fresh venv's installs and the doctor's processes
# (each check group's worker, the all-reduce's 2 ranks and the fit, each importing torch and Lightning).
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

step "the doctor from the installed wheel: --help, then its checks on 2 emulated cards"
(cd "$WORK" && "${WHEEL_ENV[@]}" "$VPY" -m lightning_gaudi.doctor --help >/dev/null) || fail "doctor --help"
# the in-process checks' names, from options.py alone (stdlib only; tests/test_doctor.py checks they are CHECKS' keys)
mapfile -t CHECK_NAMES < <("$PY" - lightning_gaudi/doctor/options.py <<'EOF'
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("options", sys.argv[1])
options = importlib.util.module_from_spec(spec)
spec.loader.exec_module(options)
print("\n".join(options.CHECK_NAMES))
EOF
)
[ ${#CHECK_NAMES[@]} -gt 0 ] || fail "reading the check names from lightning_gaudi/doctor/options.py"
ONLY=()
for name in "${CHECK_NAMES[@]}" "all-reduce" "fit, hpu_single"; do ONLY+=(--only "$name"); done
# no launch's variables either: a leftover MASTER_ADDR or RANK would make the all-reduce wait for a peer
(cd "$WORK" && "${WHEEL_ENV[@]}" -u MASTER_ADDR -u MASTER_PORT -u RANK -u LOCAL_RANK -u NODE_RANK -u WORLD_SIZE \
  -u GROUP_RANK LIGHTNING_GAUDI_EMULATE=eager LIGHTNING_GAUDI_DEVICES=2 LIGHTNING_GAUDI_COMPILE_BACKEND=aot_eager \
  "$VPY" -m lightning_gaudi.doctor --out "$WORK/doctor.md" --timeout 240 "${ONLY[@]}" >"$WORK/doctor.log" 2>&1) \
  || { tail -n 40 "$WORK/doctor.log" >&2; fail "python -m lightning_gaudi.doctor on 2 emulated cards"; }
grep -q "$WORK/venv/" "$WORK/doctor.md" || { cat "$WORK/doctor.md" >&2; fail "the doctor ran another copy"; }
"$PY" - "$WORK/doctor.md" "${CHECK_NAMES[@]}" "all-reduce" "fit, hpu_single" <<'EOF' \
  || { cat "$WORK/doctor.md" >&2; fail "the doctor's report (above)"; }
import sys

report, *expected = sys.argv[1:]
rows = {}
for line in open(report).read().split("## Checks", 1)[1].splitlines():
    cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
    if line.startswith("| ") and len(cells) == 4 and cells[0] != "check":
        rows[cells[0]] = cells[1:]
problems = []
if set(rows) != set(expected):
    problems.append(f"rows {sorted(rows)}, expected {sorted(expected)}")
problems += [f"{name}: {status}: {why}" for name, (status, _, why) in rows.items() if status not in ("pass", "skipped")]
if rows.get("HPU graphs", [""])[0] != "skipped":
    problems.append(f"HPU graphs: {rows.get('HPU graphs')}, expected skipped (the emulator has none)")
if "samples/s" not in rows.get("throughput, lazy mode", ["", ""])[1]:
    problems.append(f"throughput, lazy mode: {rows.get('throughput, lazy mode')}, expected a figure in samples/s")
if rows.get("device", ["", ""])[1] != "2 x GAUDI2":
    problems.append(f"device: {rows.get('device')}, expected 2 x GAUDI2")
for problem in problems:
    print(f"check-dist.sh: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

step "OK: $WHEEL and $SDIST"
