#!/usr/bin/env bash
# `make package-test`: run a built bundle the way a user would, far from the build.
#
# Copies dist/kvdesk to a fresh folder, then runs it with a bare environment (no venv on PATH,
# no PYTHONPATH, a new empty HOME): `--version`; `selfcheck --json` twice, cold (numba
# compiles the codec's kernels into HOME's cache) and warm (they load from that cache); a
# selfcheck that must fail (a missing model); and the window, offscreen, for 10 seconds. It
# fails if the model was not the bundled one or if anything was written inside the bundle.
# It never modifies dist/ and deletes its scratch folder on exit.
set -euo pipefail

BUNDLE=${1:-dist/kvdesk}
[ -x "$BUNDLE/kvdesk" ] || { echo "no bundle at $BUNDLE: run make package" >&2; exit 1; }
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/kvdesk-package-test.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
cp -a "$BUNDLE" "$SCRATCH/kvdesk"
mkdir "$SCRATCH/home"
APP="$SCRATCH/kvdesk/kvdesk"
before=$(cd "$SCRATCH/kvdesk" && find . | sort | md5sum)

bare() { env -i PATH=/usr/bin:/bin HOME="$SCRATCH/home" "$@"; }
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
            awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'; }

echo "bundle: $BUNDLE ($(du -sh "$BUNDLE" | cut -f1)), copied to $SCRATCH/kvdesk"
echo "version: $(bare "$APP" --version)  (start-up $(seconds bare "$APP" --version) s)"

for run in cold warm; do
    t0=$(date +%s.%N)
    if ! out=$(bare "$APP" selfcheck --json); then
        echo "selfcheck ($run) failed:"; echo "$out"; exit 1
    fi
    t1=$(date +%s.%N)
    echo "selfcheck ($run, $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s):"
    echo "$out"
    grep -q '"ok": true' <<<"$out" || { echo "selfcheck did not report ok" >&2; exit 1; }
    grep -q "\"model\": \"$SCRATCH/kvdesk/" <<<"$out" \
        || { echo "the model did not come from the bundle" >&2; exit 1; }
done

if out=$(bare "$APP" --model "$SCRATCH/missing.gguf" selfcheck --json); then
    echo "selfcheck passed without a model" >&2; exit 1
fi
grep -q '"ok": false' <<<"$out" || { echo "a failed selfcheck printed no report" >&2; exit 1; }
echo "selfcheck without a model: exit 1, $(grep '"error"' <<<"$out" | sed 's/^ *//')"

# The window must still be up after 10 s: a missing Qt plugin or library aborts at once.
set +e
bare QT_QPA_PLATFORM=offscreen timeout 10 "$APP" gui >"$SCRATCH/gui.log" 2>&1
status=$?
set -e
[ "$status" = 124 ] || { echo "the window did not stay up:"; cat "$SCRATCH/gui.log"; exit 1; } >&2
echo "gui: the window stayed up offscreen for 10 s"

ls "$SCRATCH/home/.cache/kvdesk/numba" >/dev/null 2>&1 \
    || { echo "numba cached nothing under HOME/.cache/kvdesk/numba" >&2; exit 1; }
after=$(cd "$SCRATCH/kvdesk" && find . | sort | md5sum)
[ "$before" = "$after" ] || { echo "the bundle wrote files inside itself" >&2; exit 1; }
echo "package-test: ok (numba cache: $(find "$SCRATCH/home/.cache/kvdesk/numba" -type f | wc -l) files in HOME, nothing written inside the bundle)"
