#!/usr/bin/env bash
# stallscope-gate.sh: run a reference training command under StallScope, then fail the build when
# the accelerator's idle fraction regressed against a committed baseline (`stallscope check`).
#
# The GitHub action (integrations/github/action.yml) and the GitLab template
# (integrations/gitlab/stallscope.gitlab-ci.yml) both call this script; it runs anywhere with bash
# and a Python that has stallscope installed, so `bash integrations/stallscope-gate.sh` reproduces
# a CI verdict on your machine.
#
# Two modes (STALLSCOPE_MODE):
#   baseline  (default) run the command once and compare its report with committed baseline
#             runs (a report, or a folder of several healthy runs' reports)
#   relative  run the command on the base commit and on the head commit, interleaved on this
#             machine (base head, head base, base head, ...), and compare them in pairs
#             (`stallscope check --paired`): what the machine was doing cancels out of each pair
#
# Settings, as environment variables:
#   STALLSCOPE_COMMAND       the reference training command, run with `bash -c`
#                            (or give the command as this script's arguments instead)
#   STALLSCOPE_REPORT        the report the command writes       (default: stallscope/report.json)
#   STALLSCOPE_BASELINE      baseline mode: the committed baseline report, or a folder of
#                            several healthy runs' reports       (needed unless STALLSCOPE_MAX_IDLE)
#   STALLSCOPE_MODE          baseline (default) or relative
#   STALLSCOPE_BASE_REF      relative mode: the base commit (e.g. origin/main, or the PR's base sha)
#   STALLSCOPE_PAIRS         relative mode: base/head pairs to run (default 5)
#   STALLSCOPE_RUNS_DIR      relative mode: where the runs' reports are kept (default stallscope-relative)
#   STALLSCOPE_MAX_INCREASE  largest allowed idle increase        (default: 0.02 = 2 points)
#   STALLSCOPE_MAX_IDLE      fail above this idle fraction        (default: no ceiling)
#   STALLSCOPE_PYTHON        the Python with stallscope installed (default: python3, then python)
#   STALLSCOPE_GITHUB        1: markdown step summary and ::error annotation (the action sets it)
#   STALLSCOPE_CHECK_ARGS    more arguments for `stallscope check`, e.g. "--false-alarm 0.005"
#
# In relative mode the command runs in a checkout of each commit (the base one is a temporary
# `git worktree`), in the same subfolder as the current directory, with STALLSCOPE_SIDE=base or
# head and STALLSCOPE_RUN=1.. in its environment. It must use the code of the checkout it runs
# in (a script beside it, or PYTHONPATH=.), not a copy installed from the head commit.
#
# Exit status: that of `stallscope check` (0 no regression, 1 regression, 2 error), or 2 when the
# reference command fails or does not write a new report.
set -u -o pipefail

# $* as data for a terminal or a CI log: a path or a setting may hold anything. Control
# characters (C0, DEL, C1, ESC sequences, newlines) become spaces, bidi controls and the Unicode
# line separators go, and "::" is broken up, so no part of it can start a line a GitHub runner
# takes for a workflow command. Byte patterns in the C locale; the same rules as
# stallscope/report/safe.py.
neutral() {
    local LC_ALL=C text="$*"
    text="${text//[$'\001'-$'\037'$'\177']/ }"
    text="${text//$'\xc2'[$'\x80'-$'\x9f']/ }"                     # C1 (U+0080-U+009F)
    text="${text//$'\xe2\x80'[$'\x8e\x8f\xa8\xa9\xaa\xab\xac\xad\xae']/}" # U+200E-F, U+2028-202E
    text="${text//$'\xe2\x81'[$'\xa6\xa7\xa8\xa9']/}"             # U+2066-2069
    text="${text//$'\xd8\x9c'/}"                                    # U+061C
    text="${text//::/: :}"
    printf '%s' "$text"
}

die() {
    local msg
    msg="$(neutral "$*")"
    echo "stallscope-gate: error: $msg" >&2
    if [ "${STALLSCOPE_GITHUB:-0}" = "1" ]; then
        echo "::error title=StallScope gate::${msg//%/%25}"
    fi
    exit 2
}

report="${STALLSCOPE_REPORT:-stallscope/report.json}"
baseline="${STALLSCOPE_BASELINE:-}"
mode="${STALLSCOPE_MODE:-baseline}"
max_increase="${STALLSCOPE_MAX_INCREASE:-0.02}"
max_idle="${STALLSCOPE_MAX_IDLE:-}"
github="${STALLSCOPE_GITHUB:-0}"

python="${STALLSCOPE_PYTHON:-}"
if [ -z "$python" ]; then
    python="$(command -v python3 || command -v python || true)"
    [ -n "$python" ] || die "no python3 or python on PATH; set STALLSCOPE_PYTHON"
fi
if ! problem="$("$python" -c "import stallscope.cli" 2>&1)"; then
    die "cannot import stallscope with $python (${problem##*$'\n'}); pip install stallscope, or set STALLSCOPE_PYTHON"
fi

# the report file itself, also when the setting names its folder
if [ -d "$report" ]; then
    report_file="$report/report.json"
elif [ -f "$report" ] || [[ "$report" == *.json ]]; then
    report_file="$report"
else
    report_file="$report/report.json"
fi

case "$mode" in
    baseline | relative) ;;
    *) die "STALLSCOPE_MODE must be baseline or relative, got '$mode'" ;;
esac
if [ "$mode" = "baseline" ]; then
    [ -n "$baseline" ] || [ -n "$max_idle" ] || die "set STALLSCOPE_BASELINE (a committed report.json, or a folder of several) or STALLSCOPE_MAX_IDLE"
    if [ -n "$baseline" ] && [ ! -e "$baseline" ]; then
        die "baseline $baseline does not exist; record one by running the reference command and committing its report: cp $report_file $baseline"
    fi
fi

if [ "$#" -eq 0 ] && [ -z "${STALLSCOPE_COMMAND:-}" ]; then
    die "set STALLSCOPE_COMMAND to the reference training command (or give it as arguments)"
fi

marker="$(mktemp "${TMPDIR:-/tmp}/stallscope-gate.XXXXXX")" || die "cannot create a temporary file"
worktree=""
cleanup() {
    rm -f "$marker"
    if [ -n "$worktree" ]; then
        git worktree remove --force "$worktree" >/dev/null 2>&1 || rm -rf "$worktree"
        git worktree prune >/dev/null 2>&1 || true
        rmdir "$(dirname "$worktree")" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# run the reference command once in folder $1 (label $2); its report must be new afterwards
run_reference() {
    local dir="$1" label="$2" file before after status
    file="$dir/$report_file"
    [[ "$report_file" == /* ]] && file="$report_file"
    # to tell a fresh report from one left over by an earlier run: its content or its mtime changes
    before="$(cksum "$file" 2>/dev/null || true)"
    touch "$marker"
    [ "$github" = "1" ] && echo "::group::StallScope reference run${label:+ ($label)}"
    if [ "$#" -gt 2 ]; then
        (cd "$dir" && "${@:3}")
    else
        (cd "$dir" && bash -c "$STALLSCOPE_COMMAND")
    fi
    status=$?
    [ "$github" = "1" ] && echo "::endgroup::"
    [ "$status" -eq 0 ] || die "the reference command failed${label:+ ($label)} (exit $status); no verdict"
    [ -f "$file" ] || die "the reference command wrote no report at $report${label:+ ($label)} (check STALLSCOPE_REPORT and the command's report_dir)"
    after="$(cksum "$file")"
    [ "$before" != "$after" ] || [ "$file" -nt "$marker" ] || die "$file was not rewritten by the reference command${label:+ ($label)} (a stale report?)"
    last_report="$file"
}

extra=()
if [ -n "${STALLSCOPE_CHECK_ARGS:-}" ]; then
    read -r -a extra <<<"$STALLSCOPE_CHECK_ARGS"
fi
common=(--max-increase "$max_increase")
[ -n "$max_idle" ] && common+=(--max-idle "$max_idle")
[ "$github" = "1" ] && common+=(--github)

if [ "$mode" = "baseline" ]; then
    run_reference "$PWD" "" "$@"
    args=(check "$report" "${common[@]}")
    [ -n "$baseline" ] && args+=(--baseline "$baseline")
    rm -f "$marker"
    exec "$python" -m stallscope.cli "${args[@]}" "${extra[@]}"
fi

# -- relative mode: base and head, interleaved on this machine, compared in pairs -------------
base_ref="${STALLSCOPE_BASE_REF:-}"
pairs="${STALLSCOPE_PAIRS:-5}"
runs_dir="${STALLSCOPE_RUNS_DIR:-stallscope-relative}"
[ -n "$base_ref" ] || die "relative mode needs STALLSCOPE_BASE_REF, the base commit to compare with (e.g. origin/main)"
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || die "STALLSCOPE_PAIRS must be a whole number >= 1, got '$pairs'"
top="$(git rev-parse --show-toplevel 2>/dev/null)" || die "relative mode runs in a git checkout; $PWD is not one"
base_sha="$(git rev-parse --verify --quiet "$base_ref^{commit}")" ||
    die "base commit $base_ref not found; fetch it first (GitHub: actions/checkout with fetch-depth: 0)"
head_sha="$(git rev-parse HEAD)"
sub="$(git rev-parse --show-prefix)"
work="$(mktemp -d "${TMPDIR:-/tmp}/stallscope-base.XXXXXX")" || die "cannot create a temporary folder"
worktree="$work/base"
git worktree add --detach --quiet "$worktree" "$base_sha" >/dev/null 2>&1 || die "cannot check out $base_ref into a temporary git worktree"
base_dir="$worktree/${sub%/}"
[ -d "$base_dir" ] || die "the base commit $base_ref has no folder ${sub%/}"
mkdir -p "$runs_dir" || die "cannot create $runs_dir"
rm -rf "$runs_dir"/base-* "$runs_dir"/head-*  # an earlier gate's runs, never anything else
echo "stallscope-gate: $pairs pairs of runs, base ${base_sha:0:12} and head ${head_sha:0:12}, interleaved on this machine"

heads=()
bases=()
for ((i = 1; i <= pairs; i++)); do
    # alternate which side goes first, so that a machine getting busier (or a cold cache on the
    # first run) does not always favour the same side
    if ((i % 2 == 1)); then order=(base head); else order=(head base); fi
    for side in "${order[@]}"; do
        if [ "$side" = "base" ]; then dir="$base_dir"; else dir="$PWD"; fi
        STALLSCOPE_SIDE="$side" STALLSCOPE_RUN="$i" run_reference "$dir" "$side $i/$pairs" "$@"
        mkdir -p "$runs_dir/$side-$i" && cp "$last_report" "$runs_dir/$side-$i/report.json" ||
            die "cannot copy the report to $runs_dir/$side-$i"
        if [ "$side" = "base" ]; then bases+=(--baseline "$runs_dir/$side-$i"); else heads+=("$runs_dir/$side-$i"); fi
    done
done
rm -f "$marker"
"$python" -m stallscope.cli check --paired "${heads[@]}" "${bases[@]}" "${common[@]}" "${extra[@]}"
exit $?
