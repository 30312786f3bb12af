#!/usr/bin/env bash
# The README's two test commands as a new user runs them: a new copy of this
# checkout (tracked files and untracked ones git does not ignore: nothing built),
# an empty HOME and XDG_CACHE_HOME (no wheel, no llama.cpp tools, no pip cache),
# a clean environment. Prints the set-up and suite wall times. CI need not run it
# at every stop; run it before claiming a fresh machine is green.
#
#   scripts/fresh_check.sh            # the folder is removed at the end
#   scripts/fresh_check.sh --keep     # kept (its path is printed), to read the logs
#   scripts/fresh_check.sh -- ARGS    # ARGS go to pytest after the README's own
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
keep=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "fresh_check.sh: unknown option $1 (use --keep, or -- then pytest's arguments)" >&2; exit 2 ;;
  esac
  shift
done

work="$(mktemp -d "${TMPDIR:-/tmp}/localllm-fresh.XXXXXX")"
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work/home" "$work/repo"
(cd "$here" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} sh -c 'test -e "$1" && printf "%s\0" "$1"' _ {} \
  | tar --null -T - -cf -) | tar -C "$work/repo" -xf -
(cd "$work/repo" && git init -q && git add -A && git -c user.name=fresh -c user.email=fresh@localhost commit -qm fresh)

run() {  # a clean environment: PATH (where python3 and the compilers are) and the terminal's type
  env -i PATH="$PATH" HOME="$work/home" XDG_CACHE_HOME="$work/home/.cache" LANG=C.UTF-8 TERM=xterm-256color \
    bash -c "cd '$work/repo' && $1"
}
echo "fresh_check: in $work (HOME and XDG_CACHE_HOME empty)" >&2
t0=$(date +%s)
if ! run "scripts/install.sh --test" >"$work/install.log" 2>&1; then
  tail -30 "$work/install.log" >&2
  echo "fresh_check: FAIL scripts/install.sh --test (log: $work/install.log)" >&2
  keep=1; trap - EXIT; exit 1
fi
t1=$(date +%s)
rc=0
run ".venv/bin/python -m pytest ${extra[*]:-}" >"$work/pytest.log" 2>&1 || rc=$?
t2=$(date +%s)
tail -15 "$work/pytest.log"
printf 'fresh_check: set-up %dm%02ds (scripts/install.sh --test), suite %dm%02ds (.venv/bin/python -m pytest), pytest exit %d, %s cores\n' \
  $(((t1 - t0) / 60)) $(((t1 - t0) % 60)) $(((t2 - t1) / 60)) $(((t2 - t1) % 60)) "$rc" "$(nproc 2>/dev/null || echo '?')"
[ "$keep" = 1 ] && echo "fresh_check: kept $work" >&2
exit "$rc"
