#!/usr/bin/env bash
# `make package-test`: run a built bundle the way a user would, far from the build.
#
# Copies dist/kvdesk to a fresh folder, makes it read-only (as an install by root would be),
# then runs it with a bare environment (no venv on PATH, no PYTHONPATH, a new empty HOME):
# `--version`; `selfcheck --json` twice, cold (the first start after installing) and warm,
# both of which must load the codec's kernels from the cache shipped inside the bundle:
# nothing compiled, no numba cache file written under HOME; the same with the shipped cache
# corrupted, then stale (a copy of it, named by KVDESK_CODEC_CACHE), which must fall back to
# compiling into HOME's cache, not fail; a selfcheck that must fail (a missing model); and the
# window, offscreen, for 10 seconds. It fails if the model was not the bundled one or if
# anything was written inside the bundle. It never modifies dist/ and deletes its scratch
# folder on exit.
set -euo pipefail

BUNDLE=${1:-dist/kvdesk}
[ -x "$BUNDLE/kvdesk" ] || { echo "no bundle at $BUNDLE: run make package" >&2; exit 1; }
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/kvdesk-package-test.XXXXXX")
trap 'chmod -R u+w "$SCRATCH"; rm -rf "$SCRATCH"' EXIT
cp -a "$BUNDLE" "$SCRATCH/kvdesk"
chmod -R a-w "$SCRATCH/kvdesk"
mkdir "$SCRATCH/home" "$SCRATCH/home2"
APP="$SCRATCH/kvdesk/kvdesk"
SHIPPED="$SCRATCH/kvdesk/_internal/codec_cache"
before=$(cd "$SCRATCH/kvdesk" && find . -printf '%p %s %T@\n' | sort | md5sum)

bare() { env -i PATH=/usr/bin:/bin HOME="$SCRATCH/home" "$@"; }
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
            awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'; }
field() { sed -n "s/^ *\"$1\": \(.*\),\?$/\1/p" <<<"$2" | sed 's/,$//'; }
# numba's own cache files (index and data), not kvdesk's kernels-cached stamp beside them
cache_files() { find "$1" -path '*numba*' -type f \( -name '*.nbi' -o -name '*.nbc' \) 2>/dev/null \
                | wc -l; }

echo "bundle: $BUNDLE ($(du -sh "$BUNDLE" | cut -f1)), copied read-only to $SCRATCH/kvdesk"
echo "version: $(bare "$APP" --version)  (start-up $(seconds bare "$APP" --version) s)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"

# selfcheck NAME [VAR=VALUE...]: a selfcheck that must pass, its wall seconds in WALL_<NAME>
selfcheck() {
    local name=$1 t0 t1 out; shift
    t0=$(date +%s.%N)
    if ! out=$(bare "$@" "$APP" selfcheck --json); then
        echo "selfcheck ($name) failed:"; echo "$out"; exit 1
    fi
    t1=$(date +%s.%N)
    printf -v "WALL_$name" '%s' "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
    local wall="WALL_$name"
    echo "selfcheck ($name, ${!wall} s):"; echo "$out"
    grep -q '"ok": true' <<<"$out" || { echo "selfcheck did not report ok" >&2; exit 1; }
    grep -q "\"model\": \"$SCRATCH/kvdesk/" <<<"$out" \
        || { echo "the model did not come from the bundle" >&2; exit 1; }
    printf -v "OUT_$name" '%s' "$out"
}

for run in cold warm; do
    selfcheck "$run"
    out="OUT_$run"
    grep -q '"compiled_at_start": false' <<<"${!out}" \
        || { echo "the $run selfcheck compiled codec kernels: the shipped cache was not used" >&2
             exit 1; }
done
[ "$(cache_files "$SCRATCH/home")" = 0 ] \
    || { echo "numba cache files were written under HOME:" >&2
         find "$SCRATCH/home" -path '*numba*' -type f >&2; exit 1; }
awk -v c="$WALL_cold" -v w="$WALL_warm" -v ct="$(field ttft_s "$OUT_cold")" \
    -v wt="$(field ttft_s "$OUT_warm")" 'BEGIN { printf "cold/warm: total %.2fx, " \
    "first token %.2fx (goal: at most 2x each)\n", c / w, ct / wt }'

# A damaged shipped cache (a copy, through KVDESK_CODEC_CACHE) must fall back to compiling
# into the user's cache, in another HOME: corrupt first (it compiles), then stale (it finds
# what the first compiled).
cp -a "$SHIPPED" "$SCRATCH/corrupt" && chmod -R u+w "$SCRATCH/corrupt"
nbc=$(find "$SCRATCH/corrupt" -name '*.nbc' | head -1)
printf 'garbage' | dd of="$nbc" bs=1 seek=100 conv=notrunc status=none
cp -a "$SCRATCH/corrupt" "$SCRATCH/stale" \
    && cp "$SHIPPED"/codec/kernels/*.nbc "$SCRATCH/stale/codec/kernels/"
sed -i 's/"codec\/kernels\/quant.py": "[0-9a-f]*"/"codec\/kernels\/quant.py": "0000"/' \
    "$SCRATCH/stale/manifest.json"
for damage in corrupt stale; do
    selfcheck "$damage" HOME="$SCRATCH/home2" KVDESK_CODEC_CACHE="$SCRATCH/$damage"
    out="OUT_$damage"
    grep -q "\"codec_cache\": \"shipped cache at .* not used: $damage" <<<"${!out}" \
        || { echo "the $damage shipped cache was not refused" >&2; exit 1; }
done
[ "$(cache_files "$SCRATCH/home2")" -gt 0 ] \
    || { echo "the fallback compiled nothing into HOME's numba cache" >&2; exit 1; }

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

after=$(cd "$SCRATCH/kvdesk" && find . -printf '%p %s %T@\n' | sort | md5sum)
[ "$before" = "$after" ] || { echo "the bundle wrote files inside itself" >&2; exit 1; }
[ "$(cache_files "$SCRATCH/home")" = 0 ] || { echo "the window compiled codec kernels" >&2; exit 1; }
echo "package-test: ok (codec kernels from the shipped cache: nothing compiled, no numba cache" \
     "file in HOME; a corrupt or stale one fell back to compiling ($(cache_files \
     "$SCRATCH/home2") files in another HOME); nothing written inside the bundle)"
